"""The Hub once per cluster: which copy fills from where, in what order, how long it may
take (pure: config and receipt -> plan; not shipped to pods).

Node-local mode keeps one copy of the tree per serving node (copy `i` on replica `i`'s
local volume). With `k3:weights.source` `cluster` or `cluster-then-hub`:

- copy 0 fills from the Hub (the only Hub pull of the cluster);
- once a copy is verified its node serves it read-only (an in-cluster source: nginx in
  the Hub's URL layout, after a full re-verify; k3infra/weights/source_server.py);
- copy i > 0 fills from its parent in a binary tree, `(i - 1) // 2`, falling back to
  copy 0, then (cluster-then-hub only) to the Hub. A source serves at most two children,
  so fill time grows with the tree's depth, log2(N), not with N.

Every filling node hashes every file against the lock as it lands, exactly as from the
Hub: a source is a cache, never trusted. Shared mode has one copy and one prefetch Job,
so the Hub is pulled once already and no source is created (no copy would read it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

from k3infra.config import StackConfig
from k3infra.receipt import Receipt

HUB = "hub"                 # the origin: the runtime's `hub`, or k3:weights.store's URL
SOURCE_PORT = 8080          # the in-cluster sources' HTTP port (nginx, unprivileged)
# Slack on top of the transfer estimates: pod scheduling, image pulls, the lock.
TIMEOUT_SLACK_SECONDS = 1800
SOURCE_SLACK_SECONDS = 600

Origin = Union[int, str]    # a copy index, or HUB


def fans_out(cfg: StackConfig) -> bool:
    """More than one copy and in-cluster sources allowed: copies after the first fill
    from other copies."""
    return (cfg.weights.mode == "node-local" and cfg.weights.source != "hub"
            and cfg.replicas > 1)


def parent(i: int) -> int:
    return (i - 1) // 2


def origins(cfg: StackConfig, i: int) -> list[Origin]:
    """Where copy i takes its bytes, in order."""
    if not fans_out(cfg) or i == 0:
        return [HUB]
    out: list[Origin] = [parent(i)]
    if parent(i) != 0:
        out.append(0)
    if cfg.weights.source == "cluster-then-hub":
        out.append(HUB)
    return out


def serving_copies(cfg: StackConfig) -> list[int]:
    """Copies some other copy fills from: each gets an in-cluster source."""
    if not fans_out(cfg):
        return []
    return sorted({o for i in range(cfg.replicas) for o in origins(cfg, i) if o != HUB})


def hub_copies(cfg: StackConfig) -> list[int]:
    """Copies filled from the Hub first (in shared mode: the one shared copy)."""
    count = cfg.replicas if cfg.weights.mode == "node-local" else 1
    return [i for i in range(count) if origins(cfg, i)[0] == HUB]


# ---- timeouts (Pulumi customTimeouts) -------------------------------------------------

def hub_fill_seconds(receipt: Receipt, cfg: StackConfig) -> int:
    """A prefetch Job filling from the origin: the download at k3:weights.downloadGBps (the
    Hub) or k3:weights.store.nodeGBps (your store), twice over for retries and hashing,
    plus slack."""
    return math.ceil(2 * receipt.model.size_bytes / (origin_gbps(cfg) * 1e9)) \
        + TIMEOUT_SLACK_SECONDS


def cluster_fill_seconds(receipt: Receipt, cfg: StackConfig) -> int:
    """A prefetch Job filling from an in-cluster source: its parent serves two children
    at once (2 x size at k3:weights.clusterGBps), twice over, plus slack; with the Hub as
    fallback the Hub's own timeout when larger (a source that dies hands the rest over)."""
    own = math.ceil(2 * 2 * receipt.model.size_bytes / (cfg.weights.cluster_gbps * 1e9)) \
        + TIMEOUT_SLACK_SECONDS
    if cfg.weights.source == "cluster-then-hub":
        return max(own, hub_fill_seconds(receipt, cfg))
    return own


def job_timeout_seconds(receipt: Receipt, cfg: StackConfig, i: int) -> int:
    return hub_fill_seconds(receipt, cfg) if origins(cfg, i)[0] == HUB \
        else cluster_fill_seconds(receipt, cfg)


def source_start_seconds(receipt: Receipt, cfg: StackConfig) -> int:
    """A source's start: a full re-verify of its copy (read at k3:serving.storageReadGBps)
    before nginx serves, twice over, plus slack."""
    return math.ceil(2 * receipt.model.size_bytes / (cfg.serving.storage_read_gbps * 1e9)) \
        + SOURCE_SLACK_SECONDS


# ---- the plan render prints ------------------------------------------------------------

@dataclass
class FillPlan:
    copies: int
    hub_pulls: list[int]
    cluster_fills: list[tuple[int, list[Origin]]]
    tree_bytes: int
    hub_bytes: int
    seconds: float                  # last copy verified, at the stated rates
    baseline_seconds: float         # every copy from the Hub at once, at the same Hub rate
    rates: dict = field(default_factory=dict)
    origin: str = "the Hub"         # or "the store" (k3:weights.store)

    def summary(self) -> str:
        gb = self.tree_bytes / 1e9
        word = "Hub" if self.origin == "the Hub" else "store"    # the origin, as rendered
        fills = ", ".join(f"copy {i} from " + " then ".join(
            self.origin if o == HUB else f"copy {o}" for o in order)
            for i, order in self.cluster_fills)
        baseline = (f"; every copy from {self.origin} would be {self.copies}x = "
                    f"{self.copies * gb:.1f} GB" if self.copies > 1 and self.cluster_fills else "")
        return (f"{len(self.hub_pulls)} {word} pull(s) (copy "
                f"{', '.join(str(i) for i in self.hub_pulls)}), {len(self.cluster_fills)} "
                f"in-cluster fill(s){': ' + fills if fills else ''}; expected {word} bytes "
                f"{self.hub_bytes / 1e9:.1f} GB = {self.hub_bytes / self.tree_bytes:g}x the tree"
                f"{baseline}; fill time for {self.copies} cop{'y' if self.copies == 1 else 'ies'} "
                f"~{self.seconds:.0f} s at {word} "
                f"{self.rates['hub']:g} GB/s, in-cluster {self.rates['cluster']:g} GB/s, source "
                f"start check {self.rates['read']:g} GB/s"
                + (f" (every copy from {self.origin}: ~{self.baseline_seconds:.0f} s, if "
                   f"{self.origin} gives each node {self.rates['hub']:g} GB/s)"
                   if self.cluster_fills else ""))


def fill_plan(receipt: Receipt, cfg: StackConfig) -> FillPlan:
    """Hub bytes and fill time for this stack's copies. Model: a Hub pull takes size /
    downloadGBps; a source starts serving size / storageReadGBps after its copy is verified
    (its re-verify); a source with c children in flight gives each clusterGBps / c."""
    size = receipt.model.size_bytes
    hub, cluster, read = (origin_gbps(cfg) * 1e9, cfg.weights.cluster_gbps * 1e9,
                          cfg.serving.storage_read_gbps * 1e9)
    copies = cfg.replicas if cfg.weights.mode == "node-local" else 1
    done: dict[int, float] = {}
    fills: list[tuple[int, list[Origin]]] = []
    for i in range(copies):
        order = origins(cfg, i)
        if order[0] == HUB:
            done[i] = size / hub
            continue
        fills.append((i, order))
        p = order[0]
        children = sum(1 for j in range(1, copies) if origins(cfg, j)[0] == p)
        done[i] = done[p] + size / read + size / (cluster / children)
    hub_pulls = hub_copies(cfg)
    return FillPlan(copies=copies, hub_pulls=hub_pulls, cluster_fills=fills, tree_bytes=size,
                    hub_bytes=size * len(hub_pulls), seconds=max(done.values()),
                    baseline_seconds=size / hub,
                    rates={"hub": origin_gbps(cfg), "cluster": cfg.weights.cluster_gbps,
                           "read": cfg.serving.storage_read_gbps},
                    origin="the Hub" if cfg.weights.store is None else "the store")


# --- the names the prefetch reads its sources by ---------------------------------------

def source_name(base: str, i: int) -> str:
    """The Service (and StatefulSet) of copy i's in-cluster source (source_server.py)."""
    return f"{base}-weights-source-{i}"


def source_url(base: str, namespace: str, i: int) -> str:
    return f"http://{source_name(base, i)}.{namespace}.svc:{SOURCE_PORT}"


def origin_source(cfg: StackConfig) -> str:
    """The origin as the runtime names it: `hub`, or the store's URL (k3weights.store)."""
    return cfg.weights.store.url if cfg.weights.store is not None else HUB


def origin_label(cfg: StackConfig) -> str:
    return f"the store {cfg.weights.store.url}" if cfg.weights.store is not None else "the Hub"


def origin_gbps(cfg: StackConfig) -> float:
    """One node's expected download rate from the origin: the download phase's rate."""
    return cfg.weights.store.node_gbps if cfg.weights.store is not None else cfg.weights.download_gbps


def sources_env(cfg: StackConfig, base: str, namespace: str, i: int) -> str:
    """K3_WEIGHTS_SOURCES of copy i's prefetch Job (k3weights.sources)."""
    return ",".join(origin_source(cfg) if o == HUB else source_url(base, namespace, o)
                    for o in origins(cfg, i))
