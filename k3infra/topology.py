"""Topology: one replica on one 8-GPU node (`single-node`, the receipt's), or one replica
across the 4-GPU trays of one NVLink domain (`multi-node`: GB300 / GB200 NVL72 racks;
NOT the measured configuration, docs/multinode.md). Pure.

A multi-node replica keeps the receipt's serve flags flag for flag, TP8+EP included: the
8-rank world is split over two trays of 4 GPUs and vLLM's multiprocessing backend joins
them (`--nnodes 2 --node-rank N --master-addr <leader> --master-port 29501`, the worker
`--headless`). Each GPU then holds what it held on the measured node, so the HBM check
is the same per-GPU arithmetic, summed over the domain for the message.

The versions named here are what the multi-node objects are written and tested against
(the LeaderWorkerSet CRD is pinned in tools/testbed/workload-crds/; the ComputeDomain
schema the tests use is k3infra's statement of the DRA driver's API, tests/workload_crds.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from k3infra.config.base import ConfigError
from k3infra.hbm import MIN_HEADROOM_GIB

if TYPE_CHECKING:
    from k3infra.config.models import StackConfig
    from k3infra.receipt import Receipt

SINGLE_NODE = "single-node"
MULTI_NODE = "multi-node"
# Only these shapes: the receipt's engine flags fix one TP8+EP world of 8 GPUs, and a
# multi-node replica keeps them; 2 trays x 4 GPUs is the one split of 8 over 4-GPU trays.
NODES_PER_REPLICA = 2
GPUS_PER_NODE = 4

# --- pins: what the multi-node render needs in the cluster --------------------------------
# LeaderWorkerSet (kubernetes-sigs/lws): v0.8.0 is the first release whose template has
# volumeClaimTemplates (the compile cache keeps its per-pod volume, as in the StatefulSet).
LWS_VERSION = "v0.8.0"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
# NVIDIA DRA driver for GPUs (k8s-dra-driver-gpu): its ComputeDomain gives the trays of one
# replica shared IMEX channels (multi-node NVLink memory). v25.8.1 serves
# resource.nvidia.com/v1beta1 and needs resource.k8s.io v1beta1, v1beta2 or v1 (its chart:
# kubeVersion >= 1.32; DRA is beta and off by default on 1.32/1.33, on by default from 1.34).
DRA_DRIVER_VERSION = "v25.8.1"
COMPUTE_DOMAIN_API_VERSION = "resource.nvidia.com/v1beta1"
DRA_KUBERNETES = ("Kubernetes >= 1.32 with Dynamic Resource Allocation on "
                  "(resource.k8s.io v1beta1/v1beta2/v1; default from 1.34)")
# K3_FACTS: the GPU Operator release that knows Blackwell Ultra (B300/GB300).
GPU_OPERATOR_MIN = "25.10.0"
# Labels and env the LeaderWorkerSet controller puts on every pod of a group.
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"   # "0" = the leader
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"    # the leader's DNS name, in every container
# vLLM's own default torch.distributed master port (ParallelConfig.master_port), named
# explicitly so the NetworkPolicy and the args agree.
MASTER_PORT = 29501
# NCCL's bootstrap and ring sockets, gloo's groups and vLLM's cross-node message queue
# take ports the kernel picks at run time: between the pods of one group every
# unprivileged TCP port is open (k3infra/operations/network.py).
GROUP_PORT_RANGE = (1024, 65535)

# A node label key: [prefix/]name (Kubernetes qualified name).
_LABEL_KEY = re.compile(r"\A([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")


def is_multi_node(cfg: "StackConfig") -> bool:
    return cfg.topology == MULTI_NODE


def not_measured_text(receipt: "Receipt") -> str:
    """The label every multi-node object, the render and the outputs carry."""
    return (f"multi-node: NOT the measured configuration of receipt {receipt.id} "
            f"({receipt.hardware.node}); one replica across {NODES_PER_REPLICA} nodes of "
            f"{GPUS_PER_NODE} GPUs in one NVLink domain")


def requirements(receipt: "Receipt") -> str:
    """What the cluster needs for a multi-node replica (the preflight prints it)."""
    return (f"NVIDIA driver R{receipt.hardware.driver_branch_min}+ (GB300), GPU Operator "
            f"{GPU_OPERATOR_MIN}+, NVIDIA DRA driver for GPUs {DRA_DRIVER_VERSION} "
            f"(ComputeDomain {COMPUTE_DOMAIN_API_VERSION}; {DRA_KUBERNETES}), "
            f"LeaderWorkerSet {LWS_VERSION} ({LWS_API_VERSION})")


def check_config(cfg: "StackConfig", receipt: "Receipt") -> None:
    """Cross-field refusals of k3:topology / k3:multiNode (config parsing calls this)."""
    mn = cfg.multi_node
    tp = receipt.measured_gpu.gpus_per_node
    if not is_multi_node(cfg):
        if mn.model_fields_set:
            raise ConfigError("k3:multiNode", mn.model_dump(by_alias=True),
                              "applies to k3:topology = multi-node only; with single-node one "
                              f"replica is one {tp}-GPU node (the receipt's)")
        return
    if mn.nodes_per_replica != NODES_PER_REPLICA:
        raise ConfigError(
            "k3:multiNode.nodesPerReplica", mn.nodes_per_replica,
            f"accepted: {NODES_PER_REPLICA}. The receipt's flags fix one TP{tp}+EP world of "
            f"{tp} GPUs (--tensor-parallel-size {tp}) and a multi-node replica keeps them flag "
            f"for flag: {NODES_PER_REPLICA} nodes x {GPUS_PER_NODE} GPUs. "
            f"{mn.nodes_per_replica} nodes would need other parallel sizes (TP16, pipeline "
            "parallelism), an engine-path change nothing here renders or has measured")
    if mn.gpus_per_node != GPUS_PER_NODE:
        raise ConfigError(
            "k3:multiNode.gpusPerNode", mn.gpus_per_node,
            f"accepted: {GPUS_PER_NODE} (GB300 / GB200 NVL72 trays); {NODES_PER_REPLICA} x "
            f"{GPUS_PER_NODE} = the receipt's TP{tp}. Nodes with {tp} GPUs hold a whole "
            "replica: k3:topology = single-node")
    if not mn.domain_label or not _LABEL_KEY.match(mn.domain_label) or len(mn.domain_label) > 253:
        raise ConfigError(
            "k3:multiNode.domainLabel", mn.domain_label,
            "a node label key naming the node's NVLink domain, such as nvidia.com/gpu.clique "
            "(set by GPU feature discovery on multi-node NVLink trays); without it the two "
            "nodes of a replica could land in different NVLink domains")
    if cfg.profile == "custom":
        raise ConfigError(
            "k3:profile", cfg.profile,
            "accepted with k3:topology = multi-node: measured or upstream. A multi-node "
            "replica keeps the engine path exactly (the policy k3-serve-flags-multi-node "
            "holds it); engine-path changes on top of an unmeasured topology are not built")
    for key, section, why in (
            ("k3:gateway.enabled", cfg.gateway,
             "its InferencePool selects every serving pod, and a group's headless worker "
             "serves no API"),
            ("k3:autoscaling.enabled", cfg.autoscaling,
             "its ScaledObject scales the serving StatefulSet, and a multi-node stack has "
             "LeaderWorkerSets (one per replica)")):
        if section.enabled:
            raise ConfigError(key, True, f"accepted with k3:topology = multi-node: false; {why}")
    if cfg.host is not None:
        raise ConfigError("k3:host", "set", "one Docker host cannot span two nodes: "
                          "k3:topology = multi-node needs a Kubernetes cluster")
    if cfg.node_pool.provider != "existing":
        raise ConfigError(
            "k3:nodePool.provider", cfg.node_pool.provider,
            "accepted with k3:topology = multi-node: existing (bring the NVL72 trays as "
            "labelled nodes); k3infra's cloud pools create 8-GPU B300 nodes only")
    if cfg.weights.mode != "shared":
        raise ConfigError(
            "k3:weights.mode", cfg.weights.mode,
            "accepted with k3:topology = multi-node: shared. node-local weights need one "
            "prefetch Job per pod of the group on that pod's node, which is not built")
    if cfg.serving.update_strategy != "RollingUpdate" or cfg.serving.update_partition:
        raise ConfigError(
            "k3:serving.updateStrategy", cfg.serving.update_strategy,
            "accepted with k3:topology = multi-node: RollingUpdate with updatePartition 0 "
            "(a LeaderWorkerSet replaces a whole group; it has no OnDelete, and each "
            "replica is its own LeaderWorkerSet)")


@dataclass(frozen=True)
class DomainFit:
    gpu_product: str
    gpu_memory_gib: float
    nodes: int
    gpus_per_node: int
    weights_gib_per_gpu: float
    headroom_gib: float          # per GPU, left for KV cache, activations, graphs

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def summary(self) -> str:
        return (f"{self.gpu_product}: {self.nodes} nodes x {self.gpus_per_node} GPUs in one "
                f"NVLink domain, {self.gpus} x {self.gpu_memory_gib:.2f} GiB = "
                f"{self.gpus * self.gpu_memory_gib:.2f} GiB; weights {self.weights_gib_per_gpu:.2f} "
                f"GiB per GPU at TP{self.gpus}+EP ({self.gpus * self.weights_gib_per_gpu:.2f} GiB) "
                f"-> {self.headroom_gib:.2f} GiB headroom per GPU")


def domain_fit(receipt: "Receipt", gpu_product: str,
               gpu_memory_gib: Optional[float] = None) -> DomainFit:
    """The multi-node HBM check: the receipt's per-GPU residency at TP8+EP against the
    product's per-GPU memory, summed over the 8 GPUs of the domain in the message.
    Raises ConfigError naming the key that decides."""
    weights = receipt.residency.weights_gib_per_gpu
    gpus = NODES_PER_REPLICA * GPUS_PER_NODE
    spec = receipt.gpus.get(gpu_product)
    memory = gpu_memory_gib if gpu_memory_gib is not None else (spec.memory_gib if spec else None)
    if memory is None:
        raise ConfigError(
            "k3:gpuMemoryGib", None,
            f"k3:gpuProduct = {gpu_product!r}: the receipt does not know its per-GPU memory; "
            "set k3:gpuMemoryGib to it as CUDA reports it (GB300: 288 GB HBM3e per GPU; the "
            f"measured {receipt.hardware.gpu_product_label}'s report "
            f"{receipt.hardware.gpu_memory_bytes / 2**30:.2f} GiB)")
    # A measured free figure (B200) binds unless the stack states its own memory.
    free = spec.free_gib if (spec is not None and gpu_memory_gib is None) else None
    usable = free if free is not None else memory
    headroom = usable - weights
    need = weights + MIN_HEADROOM_GIB
    if headroom < MIN_HEADROOM_GIB:
        key, value = (("k3:gpuMemoryGib", gpu_memory_gib) if gpu_memory_gib is not None
                      else ("k3:gpuProduct", gpu_product))
        shown = f"{usable:.2f} GiB free of {memory:.2f} GiB" if free is not None else f"{memory:.2f} GiB"
        raise ConfigError(
            key, value,
            f"{gpu_product} does not fit one replica over {NODES_PER_REPLICA} x "
            f"{GPUS_PER_NODE} GPUs: {gpus} x {shown} per GPU ({gpus * usable:.2f} GiB in the "
            f"domain) vs {gpus} x ({weights:.2f} GiB of weights per GPU at TP{gpus}+EP + "
            f"{MIN_HEADROOM_GIB:g} GiB headroom) = {gpus * need:.2f} GiB. Accepted: GPUs with "
            f"at least {need:.2f} GiB each, such as NVIDIA-GB300 (288 GB HBM3e)")
    if spec is not None and spec.gpus_per_node != GPUS_PER_NODE:
        raise ConfigError(
            "k3:topology", MULTI_NODE,
            f"{gpu_product} nodes hold {spec.gpus_per_node} GPUs: one replica fits one node; "
            f"accepted: single-node for them, multi-node for {GPUS_PER_NODE}-GPU trays "
            "(NVIDIA-GB300)")
    return DomainFit(gpu_product, memory, NODES_PER_REPLICA, GPUS_PER_NODE, weights,
                     round(headroom, 2))

