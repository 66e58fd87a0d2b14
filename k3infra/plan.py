"""`ServingPlan`: the receipt and the stack config resolved once into the figures the
builders read (HBM fit, engine plan, startup budget, shutdown drain, reference latency,
p99 threshold, object names). Pure; imports no builder, so every builder may import it.

K3ServingStack and K3HostStack resolve it once and hand it to their children (args key
`plan`); a component constructed without one resolves its own from receipt + config.

Builders are also called with stand-in configs that differ only in the WIREABLE keys
(k3infra/inputs.py); none of the figures here reads one, so the plan resolved from the
plain config holds for every build. The one exception is the engine image
(`engine.image`, from k3:engineImage): EngineBuild resolves it per config itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

from k3infra import naming, topology
from k3infra.config import StackConfig
from k3infra.engine.plan import EnginePlan, resolve_engine
from k3infra.hbm import HbmFit, hbm_fit
from k3infra.receipt import Measurement, Receipt
from k3infra.serving.startup import StartupBudget, startup_budget_seconds
from k3infra.topology import DomainFit

Fit = Union[HbmFit, DomainFit]

# Endpoints and kube-proxy / load balancers need a few seconds to stop sending new
# requests to a terminating pod.
ENDPOINT_PROPAGATION_SECONDS = 10
# Left between the end of the drain and the grace period's SIGKILL, for vLLM's own
# shutdown (workers, NCCL teardown).
SHUTDOWN_SECONDS = 30


def reference_latency(receipt: Receipt) -> Optional[Measurement]:
    """The receipt's end-to-end latency at its highest measured concurrency: the
    figure the p99 alert and the dashboard's reference lines use. None for a candidate
    (nothing measured yet: no alert against a figure nobody measured)."""
    if receipt.is_candidate:
        return None
    e2el = [x for x in receipt.measured if x.metric == "e2el"]
    if not e2el:
        raise ValueError(f"receipt {receipt.id} has no e2el measurement to alert against")
    return max(e2el, key=lambda x: x.concurrency)


def p99_threshold_seconds(ref: Optional[Measurement], cfg: StackConfig) -> Optional[float]:
    """The p99 alert's threshold: the reference's p99 plus k3:monitoring.p99MarginPct."""
    return None if ref is None else ref.p99_ms / 1000 * (1 + cfg.monitoring.p99_margin_pct / 100)


def drain_seconds(receipt: Receipt, cfg: StackConfig) -> int:
    """preStop sleep before SIGTERM. vLLM aborts requests still running when it gets
    SIGTERM, so the drain outlasts the slowest request the receipt measured (p99 at its
    highest concurrency) after endpoints stopped sending new ones."""
    if cfg.serving.drain_seconds is not None:
        return cfg.serving.drain_seconds
    if receipt.is_candidate:
        # Nothing measured the slowest request yet: the longest drain the grace allows.
        return cfg.serving.termination_grace_seconds - SHUTDOWN_SECONDS
    slowest_ms = max(mm.p99_ms for mm in receipt.measured if mm.metric == "e2el")
    return ENDPOINT_PROPAGATION_SECONDS + math.ceil(slowest_ms / 1000)


def replica_fit(receipt: Receipt, cfg: StackConfig) -> Fit:
    """One replica's HBM fit under the stack's topology: per node, or per NVLink domain.
    Raises HbmError (single-node) or ConfigError (multi-node) naming the key."""
    if topology.is_multi_node(cfg):
        return topology.domain_fit(receipt, cfg.gpu_product, cfg.gpu_memory_gib)
    return hbm_fit(receipt, cfg.gpu_product, cfg.gpu_memory_gib)


@dataclass(frozen=True)
class ServingPlan:
    receipt: Receipt
    multi_node: bool                       # k3:topology = multi-node
    fit: Fit
    engine: EnginePlan                     # from the plain config (engine.image: see above)
    budget: StartupBudget                  # the replica's (both pods' gates when multi-node)
    drain_seconds: int                     # the serving pods' preStop drain
    reference: Optional[Measurement]       # None for a candidate receipt
    p99_threshold_seconds: Optional[float]
    names: Optional[naming.ServingNames] = None   # when the instance is known


def resolve_plan(receipt: Receipt, cfg: StackConfig,
                 instance: Optional[str] = None) -> ServingPlan:
    """Each figure once, in the order the stack refused before: the fit, then the engine
    (k3:engine / k3:profile refusals)."""
    multi_node = topology.is_multi_node(cfg)
    fit = replica_fit(receipt, cfg)
    engine = resolve_engine(receipt, cfg)
    ref = reference_latency(receipt)
    names = (naming.ServingNames(instance, cfg.namespace, groups=multi_node)
             if instance is not None else None)
    return ServingPlan(receipt=receipt, multi_node=multi_node, fit=fit, engine=engine,
                       budget=startup_budget_seconds(receipt, cfg),
                       drain_seconds=drain_seconds(receipt, cfg), reference=ref,
                       p99_threshold_seconds=p99_threshold_seconds(ref, cfg), names=names)


def given_or_resolved(args, receipt: Receipt, cfg: StackConfig, component: str) -> ServingPlan:
    """A child component's plan: the parent's (`args["plan"]`), which must be of the
    receipt the args name, or resolved here when the component is used alone."""
    given = args.get("plan")
    if given is None:
        return resolve_plan(receipt, cfg)
    if not isinstance(given, ServingPlan) or given.receipt.sha256() != receipt.sha256():
        raise TypeError(f"{component}: args['plan'] must be the ServingPlan of args['receipt'] "
                        f"({receipt.id}), from k3infra.plan.resolve_plan")
    return given
