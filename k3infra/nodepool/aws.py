"""AWS adapter: B300 nodes on an existing EKS cluster.

Default: an EKS managed node group of p6-b300.48xlarge with AMI type
AL2023_x86_64_NVIDIA (NVIDIA driver and container toolkit preinstalled), through a launch
template that carries EFA interfaces, the nodeadm instance-store RAID0 config (local
NVMe, mounted at k3:weights.nodeLocalRoot in node-local mode) and, optionally, a
Capacity Block reservation (`capacity_type = CAPACITY_BLOCK`; EKS accepts capacity
blocks only through a launch template).

`mode: karpenter` registers a Karpenter NodePool + EC2NodeClass instead; Karpenter (v1
API) must already run in the cluster.
"""
from __future__ import annotations

import base64
from typing import Any

import pulumi
import pulumi_aws as aws
import yaml

from k3infra.config import AwsPoolConfig
from k3infra.inputs import StackInputs, wired_build
from k3infra.kube import apply_built
from k3infra.nodepool.localdisk import own_root_script
from k3infra.nodepool.base import (AWS_AMI_TYPE, AWS_INSTANCE_TYPE, PoolSpec,
                                   cloud_taint_effect)

NODECONFIG_API = "node.eks.aws/v1alpha1"
KARPENTER_API = "karpenter.sh/v1"
EC2NODECLASS_API = "karpenter.k8s.aws/v1"
ROOT_DEVICE = "/dev/xvda"            # AL2023 root volume
_BOUNDARY = "//k3infra//"


# --- pure builders ---------------------------------------------------------------------


# IMDSv2 answers only one network hop away: processes on the node itself (kubelet, the
# hostNetwork VPC CNI and device plugins), never a pod behind the pod network, so no
# workload can take the node role's credentials (issue 21).
IMDS_HOP_LIMIT = 1

def node_config(spec: PoolSpec) -> dict[str, Any]:
    """nodeadm NodeConfig: RAID0 over the instance-store NVMe. nodeadm also moves
    containerd and kubelet state onto the array (the engine image is large)."""
    local: dict[str, Any] = {"strategy": "RAID0"}
    if spec.node_local_root is not None:
        local["mountPath"] = spec.node_local_root
    return {"apiVersion": NODECONFIG_API, "kind": "NodeConfig",
            "spec": {"instance": {"localStorage": local}}}


def user_data(spec: PoolSpec) -> str:
    """MIME multi-part user data; EKS merges its own NodeConfig (cluster details) in."""
    body = yaml.safe_dump(node_config(spec), sort_keys=False)
    parts = (f"MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"{_BOUNDARY}\"\n\n"
             f"--{_BOUNDARY}\nContent-Type: application/node.eks.aws\n\n---\n{body}")
    if spec.node_local_root is not None:
        # Runs after nodeadm mounted the instance store (its config phase comes first).
        parts += (f"\n--{_BOUNDARY}\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\n\n"
                  f"#!/bin/bash\nset -euo pipefail\n{own_root_script(spec.node_local_root)}")
    return parts + f"\n--{_BOUNDARY}--\n"


def user_data_base64(spec: PoolSpec) -> str:
    return base64.b64encode(user_data(spec).encode()).decode()


def network_interfaces(settings: AwsPoolConfig) -> list[dict[str, Any]]:
    """Card 0 keeps the ENA primary interface; cards 1..N get one EFA-only interface
    each (device index 1, as EC2 asks for additional cards)."""
    if settings.efa_interfaces == 0:
        return []
    groups = list(settings.security_group_ids)
    interfaces = [{"network_card_index": 0, "device_index": 0, "interface_type": "interface",
                   "security_groups": groups, "delete_on_termination": "true"}]
    for card in range(1, settings.efa_interfaces + 1):
        interfaces.append({"network_card_index": card, "device_index": 1,
                           "interface_type": "efa-only", "security_groups": groups,
                           "delete_on_termination": "true"})
    return interfaces


def eks_taints(spec: PoolSpec) -> list[dict[str, str]]:
    return [{"key": t["key"], "value": t["value"], "effect": cloud_taint_effect(t["effect"])}
            for t in spec.taints]


def karpenter_manifests(name: str, spec: PoolSpec,
                        settings: AwsPoolConfig) -> list[dict[str, Any]]:
    """EC2NodeClass + NodePool (Karpenter v1) for the same nodes."""
    block = settings.capacity_block
    zones = sorted({s.availability_zone for s in settings.subnets})
    node_class: dict[str, Any] = {
        "role": settings.node_role_name,
        # The al2023 alias resolves to the NVIDIA variant for GPU instance types.
        "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "subnetSelectorTerms": [{"id": s.id} for s in settings.subnets],
        "securityGroupSelectorTerms": [{"id": g} for g in settings.security_group_ids],
        "blockDeviceMappings": [{"deviceName": ROOT_DEVICE, "ebs": {
            "volumeSize": f"{settings.root_volume_gib}Gi", "volumeType": "gp3",
            "encrypted": True, "deleteOnTermination": True}}],
        "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required",
                            "httpPutResponseHopLimit": IMDS_HOP_LIMIT},
        "userData": user_data(spec),
        "tags": {"k3infra.dev/pool": spec.name},
    }
    if block is not None:
        node_class["capacityReservationSelectorTerms"] = [{"id": block.reservation_id}]
    requirements = [
        {"key": "node.kubernetes.io/instance-type", "operator": "In",
         "values": [AWS_INSTANCE_TYPE]},
        {"key": "karpenter.sh/capacity-type", "operator": "In",
         "values": ["reserved" if block is not None else "on-demand"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": zones},
    ]
    node_pool = {
        "template": {
            "metadata": {"labels": dict(spec.labels)},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                 "name": name},
                "requirements": requirements,
                "taints": [dict(t) for t in spec.taints],
                # A node holding 1.5 TB of loaded weights is never recycled on a timer.
                "expireAfter": "Never",
            }},
        "limits": {"nvidia.com/gpu": spec.gpus},
        "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "30m"},
    }
    meta = {"name": name, "labels": {"app.kubernetes.io/managed-by": "k3infra"}}
    return [{"apiVersion": EC2NODECLASS_API, "kind": "EC2NodeClass", "metadata": dict(meta),
             "spec": node_class},
            {"apiVersion": KARPENTER_API, "kind": "NodePool", "metadata": dict(meta),
             "spec": node_pool}]


# --- registration ----------------------------------------------------------------------

def register(name: str, spec: PoolSpec, inputs: StackInputs,
             opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    # Structure from the plain settings; ids (cluster, role, subnets, security groups,
    # reservation) from `wired(...)`: wired Outputs at the leaves they reach (k3infra.inputs).
    settings: AwsPoolConfig = inputs.plain.node_pool.aws

    def wired(fn):
        return wired_build(inputs, lambda c: fn(c.node_pool.aws))

    if settings.mode == "karpenter":
        nc = apply_built(f"{name}-ec2nodeclass", inputs,
                         lambda c: karpenter_manifests(name, spec, c.node_pool.aws)[0], opts)
        np = apply_built(f"{name}-karpenter-nodepool", inputs,
                         lambda c: karpenter_manifests(name, spec, c.node_pool.aws)[1],
                         pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                             depends_on=[*(opts.depends_on or []), nc])))
        return [nc, np]

    block = settings.capacity_block
    tags = {"k3infra.dev/pool": spec.name, "Name": name}
    template = aws.ec2.LaunchTemplate(
        f"{name}-lt",
        name_prefix=f"{name}-",
        description=f"k3infra {spec.name}: {AWS_INSTANCE_TYPE} for Kimi K3",
        user_data=user_data_base64(spec),
        block_device_mappings=[{"device_name": ROOT_DEVICE, "ebs": {
            "volume_size": settings.root_volume_gib, "volume_type": "gp3",
            "encrypted": "true", "delete_on_termination": "true"}}],
        metadata_options={"http_endpoint": "enabled", "http_tokens": "required",
                          "http_put_response_hop_limit": IMDS_HOP_LIMIT},
        network_interfaces=wired(lambda s: network_interfaces(s) or None),
        # Without explicit interfaces the node group's own security group handling applies.
        vpc_security_group_ids=(None if settings.efa_interfaces
                                else wired(lambda s: list(s.security_group_ids))),
        instance_market_options=({"market_type": "capacity-block"} if block else None),
        capacity_reservation_specification=(
            {"capacity_reservation_target": {"capacity_reservation_id": wired(
                lambda s: s.capacity_block.reservation_id)}}
            if block else None),
        tag_specifications=[{"resource_type": "instance", "tags": tags}],
        tags=tags,
        opts=opts)
    group = aws.eks.NodeGroup(
        f"{name}-nodegroup",
        cluster_name=wired(lambda s: s.cluster_name),
        node_group_name_prefix=f"{name}-",
        node_role_arn=wired(lambda s: s.node_role_arn),
        subnet_ids=wired(lambda s: [n.id for n in s.subnets]),
        ami_type=AWS_AMI_TYPE,
        instance_types=[AWS_INSTANCE_TYPE],
        capacity_type="CAPACITY_BLOCK" if block else "ON_DEMAND",
        scaling_config={"desired_size": spec.node_count, "min_size": spec.node_count,
                        "max_size": spec.node_count},
        update_config={"max_unavailable": 1},
        labels=dict(spec.labels),
        taints=eks_taints(spec),
        launch_template={"id": template.id,
                         "version": template.latest_version.apply(
                             lambda v: None if v is None else str(int(v)))},
        tags=tags,
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            custom_timeouts=pulumi.CustomTimeouts(create="90m", update="90m"))))
    return [template, group]
