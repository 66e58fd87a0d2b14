"""OCI adapter: an OKE node pool of BM.GPU.B300.8 on an existing cluster, optionally
inside a compute cluster (RDMA between nodes).

OKE has no taint field on node pools: the taint goes to kubelet through OKE's own init
script (`oke_init_script` from instance metadata, the documented custom cloud-init path).
The same cloud-init stripes the bare-metal NVMe into RAID0 at k3:weights.nodeLocalRoot in
node-local mode.
"""
from __future__ import annotations

import base64
from typing import Any

import pulumi
import pulumi_oci as oci

from k3infra import placement
from k3infra.config import OciPoolConfig
from k3infra.inputs import StackInputs, built_kwargs
from k3infra.nodepool.base import OCI_SHAPE, PoolSpec
from k3infra.nodepool.localdisk import raid0_mount_script

_OKE_INIT = ("curl --fail -H 'Authorization: Bearer Oracle' -L0 "
             "http://169.254.169.254/opc/v2/instance/metadata/oke_init_script "
             "| base64 --decode > /var/run/oke-init.sh")


def cloud_init(spec: PoolSpec) -> str:
    """Bash user data: optional NVMe RAID0, then OKE's init with our taints."""
    parts = ["#!/bin/bash", "set -euo pipefail"]
    if spec.node_local_root is not None:
        parts.append(raid0_mount_script(spec.node_local_root))
    parts += [_OKE_INIT,
              f"bash /var/run/oke-init.sh --kubelet-extra-args "
              f"'--register-with-taints={placement.kubelet_taints()}'"]
    return "\n".join(parts) + "\n"


def node_pool_args(name: str, spec: PoolSpec, settings: OciPoolConfig) -> dict[str, Any]:
    """Keyword arguments of oci.containerengine.NodePool (pure, for tests and docs)."""
    details: dict[str, Any] = {
        "size": spec.node_count,
        "placement_configs": [{
            "availability_domain": p.availability_domain, "subnet_id": p.subnet_id,
            **({"capacity_reservation_id": p.capacity_reservation_id}
               if p.capacity_reservation_id else {})} for p in settings.placements],
    }
    if settings.compute_cluster_id:
        details["compute_cluster_id"] = settings.compute_cluster_id
    if settings.nsg_ids:
        details["nsg_ids"] = list(settings.nsg_ids)
    args: dict[str, Any] = {
        "cluster_id": settings.cluster_id,
        "compartment_id": settings.compartment_id,
        "kubernetes_version": settings.kubernetes_version,
        "name": name,
        "node_shape": OCI_SHAPE,
        "node_config_details": details,
        "node_source_details": {"source_type": "IMAGE", "image_id": settings.image_id,
                                "boot_volume_size_in_gbs": str(settings.boot_volume_gb)},
        "initial_node_labels": [{"key": k, "value": v} for k, v in spec.labels.items()],
        "node_metadata": {"user_data": base64.b64encode(cloud_init(spec).encode()).decode()},
        "freeform_tags": {"k3infra-pool": spec.name},
    }
    if settings.ssh_public_key:
        args["ssh_public_key"] = settings.ssh_public_key
    return args


def register(name: str, spec: PoolSpec, inputs: StackInputs,
             opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    pool = oci.containerengine.NodePool(
        f"{name}-nodepool",
        **built_kwargs(inputs, lambda c: node_pool_args(name, spec, c.node_pool.oci)),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            custom_timeouts=pulumi.CustomTimeouts(create="90m", update="90m"))))
    return [pool]
