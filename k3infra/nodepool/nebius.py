"""Nebius adapter: an MK8s node group on platform gpu-b300-sxm with the 8-GPU preset,
on an existing cluster (pulumi-nebius, generated from Nebius' Terraform provider).

With `driversPreset` the node image carries the NVIDIA driver; without it the GPU
Operator installs one. Node-local weights request the host's passthrough NVMe disks
(`local_disks`, left unformatted by MK8s) and stripe them at k3:weights.nodeLocalRoot
from cloud-init.
"""
from __future__ import annotations

from typing import Any, Optional

import pulumi
import pulumi_nebius as nebius
import yaml

from k3infra.config import NebiusPoolConfig
from k3infra.inputs import StackInputs, built_kwargs
from k3infra.nodepool.base import (NEBIUS_PLATFORM, NEBIUS_PRESET, PoolSpec,
                                   cloud_taint_effect)
from k3infra.nodepool.localdisk import raid0_mount_script


def cloud_init(spec: PoolSpec) -> Optional[str]:
    if spec.node_local_root is None:
        return None
    doc = {"runcmd": [["bash", "-c", "set -euo pipefail\n" +
                       raid0_mount_script(spec.node_local_root)]]}
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False)


def node_group_args(name: str, spec: PoolSpec, settings: NebiusPoolConfig) -> dict[str, Any]:
    """Keyword arguments of nebius.Mk8sV1NodeGroup (pure)."""
    template: dict[str, Any] = {
        "resources": {"platform": NEBIUS_PLATFORM, "preset": NEBIUS_PRESET},
        "metadata": {"labels": dict(spec.labels)},
        "taints": [{"key": t["key"], "value": t["value"],
                    "effect": cloud_taint_effect(t["effect"])} for t in spec.taints],
        "boot_disk": {"size_gibibytes": settings.boot_disk_gib, "type": "NETWORK_SSD"},
    }
    if settings.subnet_id:
        template["network_interfaces"] = [{"subnet_id": settings.subnet_id}]
    if settings.drivers_preset:
        template["gpu_settings"] = {"drivers_preset": settings.drivers_preset}
    if settings.gpu_cluster_id:
        template["gpu_cluster"] = {"id": settings.gpu_cluster_id}
    if settings.reservation_ids:
        # STRICT: launch only inside the capacity blocks, never silently on demand.
        template["reservation_policy"] = {"policy": "STRICT",
                                          "reservation_ids": list(settings.reservation_ids)}
    if settings.service_account_id:
        template["service_account_id"] = settings.service_account_id
    init = cloud_init(spec)
    if init is not None:
        template["local_disks"] = {"passthrough_group": {"requested": True},
                                   "config": {"none": True}}
        template["cloud_init_user_data"] = init
    return {"parent_id": settings.cluster_id, "name": name,
            "fixed_node_count": spec.node_count, "template": template,
            "labels": {"k3infra-pool": spec.name}}


def register(name: str, spec: PoolSpec, inputs: StackInputs,
             opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    group = nebius.Mk8sV1NodeGroup(
        f"{name}-nodegroup",
        **built_kwargs(inputs, lambda c: node_group_args(name, spec, c.node_pool.nebius)),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            custom_timeouts=pulumi.CustomTimeouts(create="90m", update="90m"))))
    return [group]
