"""Preflight: the checks that must pass before any resource is created, pure.

- HBM fit per node (k3infra.hbm) and that the pool's GPUs are the configured ones;
- node count vs replicas (one replica is one whole 8-GPU node);
- each weights volume (k3:weights.sizeGi) vs two trees, the update path's need;
- local NVMe per node vs the weights (lock total, or the receipt's size) plus a margin,
  in node-local mode; the shared weights volume vs the tree;
- Capacity Block AZ vs the node group's subnets (AWS).

Each check returns a `Check` (one line for the render) or raises `PreflightError`, a
`ConfigError` naming the key, the value and what is accepted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from k3infra import topology
from k3infra.config import ConfigError, StackConfig
from k3infra.hbm import HbmError, context_fit
from k3infra.nodepool.base import node_sku, pool_spec
from k3infra.plan import Fit, replica_fit
from k3infra.receipt import Receipt


class PreflightError(ConfigError):
    """A preflight check failed; nothing has been created."""


@dataclass(frozen=True)
class Check:
    name: str
    detail: str

    def line(self) -> str:
        return f"ok  {self.name}: {self.detail}"


def resolve_fit(cfg: StackConfig, receipt: Receipt) -> Fit:
    """The replica's HBM fit (k3infra.plan.replica_fit), its refusal a PreflightError."""
    try:
        return replica_fit(receipt, cfg)
    except HbmError as exc:
        prefix = f"{exc.key} = {cfg.gpu_product!r}: "
        text = str(exc)
        raise PreflightError(exc.key, cfg.gpu_product,
                             text[len(prefix):] if text.startswith(prefix) else text) from None
    except ConfigError as exc:
        raise PreflightError(exc.key, exc.value, exc.accepted) from None


def check_hbm(cfg: StackConfig, receipt: Receipt, fit: Optional[Fit] = None) -> Check:
    """`fit`: the plan's (k3infra.plan), else resolved here."""
    fit = fit or resolve_fit(cfg, receipt)
    return Check("HBM fit per NVLink domain" if topology.is_multi_node(cfg)
                 else "HBM fit per node", fit.summary())


def check_context(cfg: StackConfig, receipt: Receipt, fit: Optional[Fit] = None) -> Check:
    """The receipt's context window against the KV room its GPUs leave (k3infra.hbm).
    `fit`: the plan's (k3infra.plan), else resolved here."""
    if topology.is_multi_node(cfg) or receipt.kv_cache is None:
        return Check("KV cache fit", f"receipt {receipt.id} states no KV bound per token: not "
                     "checked" if receipt.kv_cache is None else "one NVLink domain: not checked")
    fit = fit or resolve_fit(cfg, receipt)
    try:
        kv_fit = context_fit(receipt, fit, cfg.custom.args if cfg.profile == "custom" else ())
    except HbmError as exc:
        custom = cfg.profile == "custom" and "--max-model-len" in " ".join(cfg.custom.args)
        raise PreflightError("k3:custom.args" if custom else "k3:receipt",
                             cfg.custom.args if custom else cfg.receipt or receipt.id,
                             str(exc)) from None
    return Check("KV cache fit", kv_fit.summary() if kv_fit else "no --max-model-len: not checked")


def check_pool_gpu(cfg: StackConfig, receipt: Receipt) -> Check:
    sku = node_sku(cfg, receipt)
    if sku.gpu_product != cfg.gpu_product:
        raise PreflightError(
            "k3:gpuProduct", cfg.gpu_product,
            f"the {sku.provider} pool creates {sku.name} nodes whose GPUs are "
            f"{sku.gpu_product}; accepted: {sku.gpu_product}, or k3:nodePool.provider = "
            "existing for other hardware")
    return Check("pool GPUs", f"{sku.provider}: {sku.name} ({sku.gpu_product})")


def check_node_count(cfg: StackConfig, receipt: Receipt) -> Check:
    pool = cfg.node_pool
    gpus = receipt.measured_gpu.gpus_per_node
    if topology.is_multi_node(cfg):
        per = cfg.multi_node.nodes_per_replica
        need = per * cfg.replicas
        shape = (f"{cfg.replicas} replica(s) x {per} nodes of {cfg.multi_node.gpus_per_node} "
                 f"GPUs in one NVLink domain (same {cfg.multi_node.domain_label})")
        if pool.node_count is None:
            return Check("nodes vs replicas", f"{shape} = {need} node(s); bring-your-own node "
                         "count not stated (k3:nodePool.nodeCount), not checked")
        if pool.node_count < need:
            raise PreflightError(
                "k3:nodePool.nodeCount", pool.node_count,
                f"k3:replicas = {cfg.replicas} with k3:topology = multi-node needs at least "
                f"{need} nodes: each replica spans {per} nodes")
        return Check("nodes vs replicas", f"{pool.node_count} node(s) for {shape}")
    if pool.node_count is None:
        if pool.provider == "existing":
            return Check("nodes vs replicas",
                         f"{cfg.replicas} replica(s) need {cfg.replicas} node(s) of {gpus} GPUs; "
                         "bring-your-own node count not stated (k3:nodePool.nodeCount), "
                         "not checked")
        return Check("nodes vs replicas",
                     f"{cfg.replicas} node(s) of {gpus} GPUs for {cfg.replicas} replica(s)")
    if pool.node_count < cfg.replicas:
        raise PreflightError(
            "k3:nodePool.nodeCount", pool.node_count,
            f"k3:replicas = {cfg.replicas} needs at least {cfg.replicas} nodes: one replica "
            f"is one whole {gpus}-GPU node (TP{gpus}), never two on one node")
    spare = pool.node_count - cfg.replicas
    return Check("nodes vs replicas",
                 f"{pool.node_count} node(s) for {cfg.replicas} replica(s)"
                 + (f", {spare} spare" if spare else ""))

def check_engine_cpu(cfg: StackConfig, receipt: Receipt) -> Check:
    """vLLM runs one worker process per GPU of the pod beside its API server; a CPU
    limit below the worker count throttles every step. The bound follows the receipt
    (k3:serving.resources.cpu itself accepts 1, for a one-worker CPU node)."""
    workers = (cfg.multi_node.gpus_per_node if topology.is_multi_node(cfg)
               else receipt.measured_gpu.gpus_per_node)
    cpu = cfg.serving.resources.cpu
    if cpu < workers:
        raise PreflightError(
            "k3:serving.resources.cpu", cpu,
            f"the engine runs {workers} worker process(es), one per GPU of the pod, beside "
            f"its API server; accepted: at least {workers}")
    return Check("engine CPU", f"{cpu:g} CPU for {workers} engine worker(s)")


TREES_PER_VOLUME = 2


def check_local_nvme(cfg: StackConfig, receipt: Receipt,
                     lock_total_bytes: Optional[int] = None) -> Check:
    if cfg.weights.mode != "node-local":
        return Check("local NVMe", f"not used for weights (k3:weights.mode = {cfg.weights.mode})")
    pool = cfg.node_pool
    sku = node_sku(cfg, receipt)
    capacity_gb = pool.local_nvme_gb if pool.local_nvme_gb is not None else sku.local_nvme_gb
    if capacity_gb is None and not sku.creates_nodes:
        return Check("local NVMe", "bring-your-own nodes: capacity not stated "
                                   "(k3:nodePool.localNvmeGB), not checked")
    if capacity_gb is None:
        raise PreflightError(
            "k3:nodePool.localNvmeGB", None,
            f"k3:weights.mode = node-local needs the local NVMe per node in decimal GB; "
            f"k3infra does not know it for {sku.name} (provider {pool.provider}); "
            "accepted: a number > 0, or k3:weights.mode = shared")
    if lock_total_bytes is not None:
        weights_gb, source = lock_total_bytes / 1e9, "lock total"
    else:
        weights_gb, source = receipt.model.size_gb, "receipt size (no lock file)"
    # Two trees: a revision change fetches the new tree beside the old one (staging
    # directory, renamed into place), so both must fit until the old one is removed.
    need_gb = TREES_PER_VOLUME * weights_gb * (1 + pool.local_nvme_margin_pct / 100)
    if capacity_gb < need_gb:
        key = "k3:nodePool.localNvmeGB" if pool.local_nvme_gb is not None else "k3:weights.mode"
        value = pool.local_nvme_gb if pool.local_nvme_gb is not None else cfg.weights.mode
        raise PreflightError(
            key, value,
            f"{capacity_gb:.1f} GB of local NVMe per node cannot hold {TREES_PER_VOLUME} x "
            f"{weights_gb:.1f} GB of weights ({source}; the old and the new tree during a "
            f"revision change) + {pool.local_nvme_margin_pct:g} % margin = {need_gb:.1f} GB; "
            "accepted: nodes with more local NVMe, or k3:weights.mode = shared")
    return Check("local NVMe",
                 f"{capacity_gb:.1f} GB per node >= {TREES_PER_VOLUME} x {weights_gb:.1f} GB "
                 f"({source}) + "
                 f"{pool.local_nvme_margin_pct:g} % = {need_gb:.1f} GB")


def _weights_bytes(receipt: Receipt, lock_total_bytes: Optional[int]) -> tuple[int, str]:
    if lock_total_bytes is not None:
        return lock_total_bytes, "lock total"
    return int(receipt.model.size_gb * 1e9), "receipt size (no lock file)"


def check_weights_volume(cfg: StackConfig, receipt: Receipt,
                         lock_total_bytes: Optional[int] = None) -> Check:
    """Each weights volume (the shared PVC, or each node-local claim) holds the tree
    being served and the new revision staged beside it: the update path
    (docs/weights.md, "Revision changes") needs room for both."""
    tree, source = _weights_bytes(receipt, lock_total_bytes)
    need = TREES_PER_VOLUME * tree
    size_gi = cfg.weights.size_gi
    have = size_gi * 2**30
    if have < need:
        raise PreflightError(
            "k3:weights.sizeGi", size_gi,
            f"a weights volume of {size_gi} Gi ({have / 1e9:.1f} GB) cannot hold "
            f"{TREES_PER_VOLUME} x {tree / 1e9:.1f} GB of weights ({source}; a revision change "
            f"stages the new tree beside the old one) = {need / 1e9:.1f} GB; accepted: at least "
            f"{-(-need // 2**30)} (Gi)")
    return Check("weights volume",
                 f"{size_gi} Gi ({have / 1e9:.1f} GB) per volume >= {TREES_PER_VOLUME} x "
                 f"{tree / 1e9:.1f} GB ({source}): room to stage a new revision")


def check_capacity_zone(cfg: StackConfig, receipt: Receipt) -> Check:
    pool = cfg.node_pool
    if pool.provider != "aws" or pool.aws.capacity_block is None:
        return Check("capacity reservation zone", "no capacity block")
    block = pool.aws.capacity_block
    wrong = [s for s in pool.aws.subnets if s.availability_zone != block.availability_zone]
    if wrong:
        raise PreflightError(
            "k3:nodePool.aws.subnets", [f"{s.id} ({s.availability_zone})" for s in wrong],
            f"capacity block {block.reservation_id} is in {block.availability_zone}: "
            "instances cannot launch into it from another AZ; accepted: only subnets in "
            f"{block.availability_zone}")
    return Check("capacity reservation zone",
                 f"{block.reservation_id} in {block.availability_zone}, "
                 f"{len(pool.aws.subnets)} subnet(s) there")


def pool_summary(cfg: StackConfig, receipt: Receipt) -> Check:
    spec = pool_spec(cfg, receipt)
    operator = "GPU Operator " + ("installed" if spec.gpu_operator else "not installed")
    if not spec.sku.creates_nodes:
        return Check("pool", f"existing: nothing created; nodes selected by "
                             f"nvidia.com/gpu.product={cfg.gpu_product}; {operator}")
    return Check("pool", f"{spec.provider}: {spec.node_count} x {spec.sku.name}, labels "
                         f"{spec.labels}, {operator}")


def multi_node_requirements(cfg: StackConfig, receipt: Receipt) -> Check:
    if not topology.is_multi_node(cfg):
        return Check("topology", f"single-node: one replica = one "
                     f"{receipt.measured_gpu.gpus_per_node}-GPU node (the receipt's)")
    return Check("topology", f"{topology.not_measured_text(receipt)}; needs "
                 f"{topology.requirements(receipt)}")


def run_preflight(cfg: StackConfig, receipt: Receipt, lock_total_bytes: Optional[int] = None,
                  fit: Optional[Fit] = None) -> list[Check]:
    """All checks in order; the first failure raises PreflightError. `fit`: the plan's
    (k3infra.plan), else resolved here."""
    fit = fit or resolve_fit(cfg, receipt)
    return [check_hbm(cfg, receipt, fit), check_context(cfg, receipt, fit),
            check_pool_gpu(cfg, receipt),
            check_node_count(cfg, receipt), check_weights_volume(cfg, receipt, lock_total_bytes),
            check_engine_cpu(cfg, receipt),
            check_local_nvme(cfg, receipt, lock_total_bytes),
            check_capacity_zone(cfg, receipt), pool_summary(cfg, receipt),
            multi_node_requirements(cfg, receipt)]


def preflight_report(cfg: StackConfig, receipt: Receipt, lock_total_bytes: Optional[int] = None,
                     fit: Optional[Fit] = None) -> list[str]:
    """One line per passed check (what render prints); raises on the first failure."""
    return [c.line() for c in run_preflight(cfg, receipt, lock_total_bytes, fit)]
