"""Where serving pods land: the one place node labels, taints, tolerations and affinity
come from, so a node pool and the StatefulSet scheduled onto it can never disagree.
"""
from __future__ import annotations

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"     # set by GPU feature discovery
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT_KEY = "nvidia.com/gpu"                 # the usual taint on GPU nodes
POOL_LABEL = "k3infra.dev/pool"                  # set by k3infra's node pools; value:
                                                 # the instance (k3infra.naming)
HOSTNAME_LABEL = "kubernetes.io/hostname"
# Nodes for in-cluster engine builds alone: labelled and tainted with this key = "true".
BUILD_NODE_KEY = "k3infra.dev/engine-build"


def node_labels(pool: str, gpu_product: str | None = None) -> dict[str, str]:
    """Labels a k3infra node pool puts on its nodes (`pool`: the instance's pool label
    value). The GPU product label normally comes from GPU feature discovery; a pool whose
    platform runs no GFD we control (CoreWeave) passes `gpu_product` so the same affinity
    still matches its nodes."""
    labels = {POOL_LABEL: pool}
    if gpu_product is not None:
        labels[GPU_PRODUCT_LABEL] = gpu_product
    return labels


def node_taints() -> list[dict[str, str]]:
    """Taints a k3infra node pool puts on its nodes (Kubernetes form)."""
    return [{"key": GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}]


def kubelet_taints() -> str:
    """node_taints() as kubelet's --register-with-taints value (key=value:Effect,...)."""
    return ",".join(f"{t['key']}={t['value']}:{t['effect']}" for t in node_taints())


def tolerations() -> list[dict[str, str]]:
    """Tolerations matching node_taints(), plus the bare form other pools use."""
    return [{"key": t["key"], "operator": "Exists", "effect": t["effect"]} for t in node_taints()]


def node_affinity(gpu_products: list[str], pool: str | None) -> dict:
    """Required affinity: a GPU product from the accepted set (and the instance's pool
    label `pool` when k3infra created the pool; bring-your-own nodes, pool None, only
    carry GFD labels)."""
    expressions = [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": list(gpu_products)}]
    if pool is not None:
        expressions.append({"key": POOL_LABEL, "operator": "In", "values": [pool]})
    return {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions}]}}


def pool_of(provider: str, instance: str) -> str | None:
    """The pool label value pods of `instance` require: its own pool's, unless the nodes
    are bring-your-own (`existing`), which carry no k3infra pool label."""
    return None if provider == "existing" else instance


def one_replica_per_node(selector_labels: dict[str, str]) -> dict:
    """One serving pod = one 8-GPU node: never two replicas on one node."""
    return {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": dict(selector_labels)},
        "topologyKey": HOSTNAME_LABEL}]}


def beside(selector_labels: dict[str, str]) -> dict:
    """Pod affinity: on a node where a pod with these labels runs (the benchmark beside a
    serving pod, whose node's weights its gate verified)."""
    return {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": dict(selector_labels)},
        "topologyKey": HOSTNAME_LABEL}]}


def beside_serving(gpu_product: str, pool: str | None, serving_selector: dict) -> dict:
    """Affinity and tolerations of a helper pod (benchmark, accuracy smoke test) that runs
    on a serving node, beside a serving pod: the node's image and weights passed that
    pod's gate, and no GPU is requested."""
    return {"affinity": {"nodeAffinity": node_affinity([gpu_product], pool),
                         "podAffinity": beside(serving_selector)},
            "tolerations": tolerations()}


def build_node_placement() -> dict:
    """nodeSelector + toleration that put a pod on the engine-build pool and only there
    (the taint keeps every other pod off it)."""
    return {"nodeSelector": {BUILD_NODE_KEY: "true"},
            "tolerations": [{"key": BUILD_NODE_KEY, "operator": "Equal", "value": "true",
                             "effect": "NoSchedule"}]}


def node_affinity_in_domain(gpu_products: list[str], pool: str | None, domain_label: str) -> dict:
    """node_affinity() on nodes that carry the NVLink domain label `domain_label` (a
    multi-node replica; the label's value names the domain, nvidia.com/gpu.clique)."""
    affinity = node_affinity(gpu_products, pool)
    for term in affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]:
        term["matchExpressions"].append({"key": domain_label, "operator": "Exists"})
    return affinity


def same_domain_as(pod_labels: dict[str, str], domain_label: str) -> dict:
    """Pod affinity: in the NVLink domain (same `domain_label` value) of the pod with
    these labels: the worker of a multi-node replica beside its leader."""
    return {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": dict(pod_labels)},
        "topologyKey": domain_label}]}
