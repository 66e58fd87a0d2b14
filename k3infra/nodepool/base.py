"""The node pool interface, pure: which SKU each target provides and what every pool
must carry (node count, labels, taints, local NVMe use), derived from the stack config.

No Pulumi and no cloud SDK here: preflight and tests read the same `PoolSpec` the
adapters register. Each adapter module (`aws`, `oci`, `nebius`, `coreweave`, `existing`)
exposes `register(name, spec, inputs, opts) -> list[pulumi.Resource]` (inputs: a
k3infra.inputs.StackInputs, so cloud ids may be wired Outputs) and imports its cloud SDK
itself, so a stack only needs the SDK of the cloud it targets.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

from k3infra import naming, placement
from k3infra.config import StackConfig
from k3infra.receipt import Receipt

PROVIDERS = ("existing", "aws", "oci", "nebius", "coreweave")

# SKU names of the 8x B300 node on each cloud (shared/K3_FACTS.md, "Hardware and clouds").
AWS_INSTANCE_TYPE = "p6-b300.48xlarge"
AWS_AMI_TYPE = "AL2023_x86_64_NVIDIA"          # EKS AMI with the NVIDIA driver + toolkit
AWS_LOCAL_NVME_DRIVES = 8                      # p6-b300.48xlarge: 8x 3.8 TB local NVMe
AWS_LOCAL_NVME_DRIVE_GB = 3800.0
OCI_SHAPE = "BM.GPU.B300.8"
NEBIUS_PLATFORM = "gpu-b300-sxm"
NEBIUS_PRESET = "8gpu-192vcpu-2768gb"          # the platform's 8-GPU preset

# pyproject optional-dependencies: the cloud SDK each adapter imports.
EXTRAS = {"aws": "aws", "oci": "oci", "nebius": "nebius"}


@dataclass(frozen=True)
class NodeSku:
    """One 8-GPU node type as a target sells it."""

    provider: str
    name: str                       # instance type / shape / platform+preset / instance id
    gpu_product: str                # GPU feature discovery product label of its GPUs
    local_nvme_gb: Optional[float]  # decimal GB of local NVMe per node; None = not known here
    driver_in_image: bool           # the node image ships the NVIDIA driver and toolkit
    gpu_operator_default: bool      # `k3:nodePool.gpuOperator: auto` installs the operator
    creates_nodes: bool             # False: bring-your-own nodes


def node_sku(cfg: StackConfig, receipt: Receipt) -> NodeSku:
    """The SKU the configured pool provides. Every target k3infra creates is the
    measured B300 node; `existing` nodes are whatever k3:gpuProduct says they are."""
    pool = cfg.node_pool
    b300 = receipt.hardware.gpu_product_label
    if pool.provider == "aws":
        return NodeSku("aws", AWS_INSTANCE_TYPE, b300,
                       AWS_LOCAL_NVME_DRIVES * AWS_LOCAL_NVME_DRIVE_GB, True, True, True)
    if pool.provider == "oci":
        return NodeSku("oci", OCI_SHAPE, b300, None, True, True, True)
    if pool.provider == "nebius":
        preset = pool.nebius.drivers_preset if pool.nebius else None
        return NodeSku("nebius", f"{NEBIUS_PLATFORM}/{NEBIUS_PRESET}", b300, None,
                       preset is not None, True, True)
    if pool.provider == "coreweave":
        return NodeSku("coreweave", pool.coreweave.instance_type, b300, None, True, False, True)
    return NodeSku("existing", "bring-your-own", cfg.gpu_product, None, True, False, False)


@dataclass(frozen=True)
class PoolSpec:
    """Everything an adapter needs that is not cloud-specific."""

    name: str                       # Kubernetes/cloud-safe base name of the pool
    provider: str
    sku: NodeSku
    node_count: int
    labels: dict[str, str]          # Kubernetes node labels
    taints: list[dict[str, str]]    # Kubernetes form: key, value, effect
    node_local_root: Optional[str]  # where local NVMe is mounted for node-local weights
    gpu_operator: bool              # the cluster needs the NVIDIA GPU Operator add-on
                                    # (ClusterAddons, once per cluster)
    gpus_per_node: int              # the receipt's node: one replica = one whole node

    @property
    def gpus(self) -> int:
        return self.node_count * self.gpus_per_node


def pool_spec(cfg: StackConfig, receipt: Receipt, name: str = naming.APP,
              instance: Optional[str] = None) -> PoolSpec:
    """`name`: the pool's cloud/Kubernetes base name; `instance`: whose pool it is (its
    nodes carry `k3infra.dev/pool: <instance>`, default `name`)."""
    pool = cfg.node_pool
    sku = node_sku(cfg, receipt)
    # CKS runs no GPU feature discovery we install: label the product ourselves (the
    # instance type fixes it), so the serving affinity matches exactly as elsewhere.
    product_label = sku.gpu_product if pool.provider == "coreweave" else None
    if pool.gpu_operator == "auto":
        operator = sku.gpu_operator_default
    else:
        operator = pool.gpu_operator == "install"
    return PoolSpec(
        name=name, provider=pool.provider, sku=sku,
        node_count=pool.node_count if pool.node_count is not None else cfg.replicas,
        labels=placement.node_labels(instance or name, product_label),
        taints=placement.node_taints(),
        node_local_root=cfg.weights.node_local_root if cfg.weights.mode == "node-local" else None,
        gpu_operator=operator,
        gpus_per_node=receipt.measured_gpu.gpus_per_node)


def cloud_taint_effect(effect: str) -> str:
    """Kubernetes taint effect -> the upper-snake enum EKS and Nebius use."""
    return {"NoSchedule": "NO_SCHEDULE", "PreferNoSchedule": "PREFER_NO_SCHEDULE",
            "NoExecute": "NO_EXECUTE"}[effect]


def load_adapter(provider: str):
    """The adapter module; importing it imports that cloud's SDK (and only that one)."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown node pool provider {provider!r}; known: {', '.join(PROVIDERS)}")
    try:
        return importlib.import_module(f"k3infra.nodepool.{provider}")
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get(provider)
        if extra is None or not (exc.name or "").startswith("pulumi_"):
            raise
        raise ModuleNotFoundError(
            f"k3:nodePool.provider = {provider!r} needs the {exc.name} package: "
            f".venv/bin/pip install -e '.[{extra}]' (see docs/clouds.md)",
            name=exc.name) from exc
