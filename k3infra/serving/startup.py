"""How long a serving pod may take to start before its startupProbe gives up.

A probe that kills a pod still loading restarts a 1.5 TB load, so the budget errs on the
generous side: the weights gate's full read (weight bytes / storage read throughput; it
runs inside the serving container, before vLLM, on every start) + the load (the same
read) x safety factor + an allowance for torch.compile and CUDA graph capture. The load
term is not reduced for the page cache the gate warms: a node short of memory reads
twice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from k3infra.config import ServingConfig
from k3infra.receipt import Receipt

PROBE_PERIOD_SECONDS = 10


@dataclass(frozen=True)
class StartupBudget:
    weight_bytes: int
    read_gbps: float
    load_seconds: int
    gate_seconds: int
    compile_seconds: int
    safety_factor: float
    total_seconds: int

    @property
    def failure_threshold(self) -> int:
        return math.ceil(self.total_seconds / PROBE_PERIOD_SECONDS)

    def summary(self) -> str:
        return (f"{self.total_seconds} s = {self.gate_seconds} s weights gate + "
                f"{self.weight_bytes / 1e9:.1f} GB / {self.read_gbps:g} GB/s "
                f"({self.load_seconds} s) x {self.safety_factor:g} + {self.compile_seconds} s "
                f"compile/graph capture; probe every {PROBE_PERIOD_SECONDS} s x "
                f"{self.failure_threshold}")


def startup_budget_seconds(receipt: Receipt, serving: ServingConfig) -> StartupBudget:
    weight_bytes = receipt.model.size_bytes
    load = math.ceil(weight_bytes / (serving.storage_read_gbps * 1e9))
    gate = load           # the gate reads every byte once, at the same storage speed
    total = gate + math.ceil(load * serving.startup_safety_factor) + serving.compile_allowance_seconds
    return StartupBudget(weight_bytes, serving.storage_read_gbps, load, gate,
                         serving.compile_allowance_seconds, serving.startup_safety_factor, total)
