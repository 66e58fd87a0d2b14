"""Cold start budgets, one per phase, and the deadlines derived from them (docs/coldstart.md).

A probe that kills a pod still loading restarts a 1.5 TB read that may never finish, so
every deadline is derived from the phases it has to cover, each phase's estimate
(bytes / a stated rate, or a stated allowance, all `k3:coldStart.*` / `k3:serving.*`
keys with sourced defaults) times the tail factor:

    pull      engine image GB / imagePullGBps          (before the container starts)
    gate      weight bytes / storageReadGBps            (every byte read and hashed once)
    startup   engineStartSeconds                        (vLLM's imports and processes)
    load      weight bytes / warmLoadGBps               (page cache warmed by the gate)
           or weight bytes / min(coldLoadGBps, storage) (stamps mode, or a memory limit
                                                         that cannot hold the tree)
    compile   compileColdSeconds, or compileWarmSeconds once the cache is seeded
    profiling profilingSeconds

The deadlines nest so that none fires before the one it contains:
    engine deadline (VLLM_ENGINE_READY_TIMEOUT_S) = startup + load + compile + profiling
    startupProbe   > gate + engine deadline (+ the API server's own start, rounded up
                     to whole probe periods)
    `pulumi up`    > pull + startupProbe (+ scheduling), per replica on an update
Liveness and readiness start only after the startupProbe passed (Kubernetes), and the
proxy's liveness is nginx alone (k3infra/serving/proxy.py).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from k3infra.config import ColdStartConfig, ServingConfig, StackConfig
from k3infra.receipt import Receipt

PROBE_PERIOD_SECONDS = 10
# The API server binds and answers /health a few seconds after the engine is ready;
# a minute leaves the startupProbe strictly beyond the engine's own deadline.
API_SERVER_SECONDS = 60
# `pulumi up` waits beyond the pods' own deadlines for scheduling, volume binding and
# attach (a node pool scaling up is not in it: the node pool has its own await).
ROLLOUT_MARGIN_SECONDS = 1800
# The pod template annotation that carries the phase budgets (read by `k3infra startup`
# and by the tests that check the rendered deadlines).
BUDGET_ANNOTATION = "k3infra.dev/startup-budget"


def _ceil(x: float) -> int:
    # 1561e9 / 1.5e9 * 1.5 is 1561.0000000000002 in floating point: not a second more.
    return math.ceil(round(x, 6))


def _short(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class PhaseBudget:
    name: str
    estimate_seconds: float
    seconds: int               # estimate x tail factor, rounded up
    formula: str


@dataclass(frozen=True)
class StartupBudget:
    phases: tuple[PhaseBudget, ...]
    tail_factor: float
    warm_load: bool            # the load reads a page cache the gate warmed
    compile_cache: str

    def phase(self, name: str) -> PhaseBudget:
        return next(p for p in self.phases if p.name == name)

    def seconds(self, name: str) -> int:
        return self.phase(name).seconds

    @property
    def engine_seconds(self) -> int:
        """VLLM_ENGINE_READY_TIMEOUT_S: the engine's own deadline."""
        return sum(self.seconds(p) for p in ("startup", "load", "compile", "profiling"))

    @property
    def failure_threshold(self) -> int:
        return math.ceil((self.seconds("gate") + self.engine_seconds + API_SERVER_SECONDS)
                         / PROBE_PERIOD_SECONDS)

    @property
    def probe_seconds(self) -> int:
        """What the startupProbe allows (initialDelaySeconds 0)."""
        return self.failure_threshold * PROBE_PERIOD_SECONDS

    @property
    def total_seconds(self) -> int:
        """From container start to ready at the latest: the startupProbe's allowance."""
        return self.probe_seconds

    @property
    def pod_seconds(self) -> int:
        """From scheduling to ready at the latest: the image pull, then the container."""
        return self.seconds("pull") + self.probe_seconds

    def await_seconds(self, replicas: int) -> tuple[int, int]:
        """`pulumi up`'s (create, update) wait for the StatefulSet: the pods start together
        on create (Parallel) and one node at a time on update."""
        return (self.pod_seconds + ROLLOUT_MARGIN_SECONDS,
                replicas * self.pod_seconds + ROLLOUT_MARGIN_SECONDS)

    def annotation(self) -> str:
        """The phase budgets as the pod template carries them (JSON, seconds)."""
        data = {p.name: p.seconds for p in self.phases}
        data.update(engine=self.engine_seconds, probe=self.probe_seconds)
        return json.dumps(data, separators=(",", ":"))

    def rows(self) -> list[tuple[str, str]]:
        """Render's rows: each phase's budget and formula, then the deadlines."""
        out = [(f"cold start: {p.name}", f"{p.seconds} s = {p.formula} x {self.tail_factor:g} tail")
               for p in self.phases]
        out.append(("cold start: engine deadline",
                    f"{self.engine_seconds} s = startup + load + compile + profiling "
                    "(VLLM_ENGINE_READY_TIMEOUT_S)"))
        out.append(("startup budget", self.summary()))
        return out

    def summary(self) -> str:
        return (f"{self.total_seconds} s startupProbe (every {PROBE_PERIOD_SECONDS} s x "
                f"{self.failure_threshold}) > {self.seconds('gate')} s gate + "
                f"{self.engine_seconds} s engine deadline + {API_SERVER_SECONDS} s API server; "
                f"with the {self.seconds('pull')} s image pull: {self.pod_seconds} s per pod")


def startup_budget(receipt: Receipt, serving: ServingConfig, cold: ColdStartConfig,
                   gate_mode: str, pods: int = 1) -> StartupBudget:
    """The budgets from the sections a policy can read on its own (no StackConfig).
    `pods`: the pods of one replica (a multi-node group, k3:topology). Each pod's gate
    reads the whole tree, all at once from the shared volume, so the gate phase takes
    `pods` times as long at storageReadGBps; each pod loads its ranks' share."""
    weight_bytes = receipt.model.size_bytes
    gb = weight_bytes / 1e9
    tail = cold.tail_factor
    # The gate's reads stay in the page cache for the load only in warm mode and only
    # if the container's memory limit (which the page cache is charged to) holds them.
    memory_gi = serving.resources.memory_max_gi
    warm = gate_mode == "warm" and memory_gi * 2**30 >= weight_bytes
    if warm:
        load_rate, load_how = cold.warm_load_gbps, f"warmLoadGBps {cold.warm_load_gbps:g}"
    else:
        load_rate = min(cold.cold_load_gbps, serving.storage_read_gbps)
        load_how = (f"min(coldLoadGBps {cold.cold_load_gbps:g}, storageReadGBps "
                    f"{serving.storage_read_gbps:g}) (no warm page cache: gate mode {gate_mode}, "
                    f"memory limit {memory_gi:g} Gi)")
    seeded = cold.compile_cache == "seeded"
    compile_s = cold.compile_warm_seconds if seeded else cold.compile_cold_seconds
    estimates = (
        ("pull", cold.image_gb / cold.image_pull_gbps,
         f"{cold.image_gb:g} GB image / imagePullGBps {cold.image_pull_gbps:g}"),
        ("gate", pods * gb / serving.storage_read_gbps,
         (f"{pods} pods x " if pods > 1 else "")
         + f"{gb:.1f} GB / storageReadGBps {serving.storage_read_gbps:g}"),
        ("startup", float(cold.engine_start_seconds),
         f"engineStartSeconds {cold.engine_start_seconds}"),
        ("load", gb / load_rate, f"{gb:.1f} GB / {load_how}"),
        ("compile", float(compile_s),
         f"compile{'Warm' if seeded else 'Cold'}Seconds {compile_s} (compileCache "
         f"{cold.compile_cache})"),
        ("profiling", float(cold.profiling_seconds), f"profilingSeconds {cold.profiling_seconds}"),
    )
    phases = tuple(PhaseBudget(name, est, _ceil(est * tail), f"{formula} = {_short(est)} s")
                   for name, est, formula in estimates)
    return StartupBudget(phases, tail, warm, cold.compile_cache)


def replica_pods(cfg: StackConfig) -> int:
    """The pods of one replica under the stack's topology (k3:topology)."""
    return cfg.multi_node.nodes_per_replica if cfg.topology == "multi-node" else 1


def startup_budget_seconds(receipt: Receipt, cfg: StackConfig) -> StartupBudget:
    """The stack's budgets (every builder, the summary and the alerts use this)."""
    return startup_budget(receipt, cfg.serving, cfg.cold_start, cfg.weights.gate_mode,
                          replica_pods(cfg))
