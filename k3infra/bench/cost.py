"""Dollars per million tokens from raw `vllm bench serve` results and a node rate. Pure.

The node is the unit of cost: one serving replica is one 8-GPU node, and a result file
measures the endpoint's aggregate throughput (the receipt's per-GPU figures are this
divided by 8). Per concurrency, the measured (not warm-up) files are pooled:

    tokens per second  = sum(tokens) / sum(duration_s)
    USD per 1M tokens  = node_rate_usd_per_hour * nodes / 3600 / tokens_per_second * 1e6

once with output tokens only, once with input + output tokens. Nothing is invented: no
file, no figure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from k3infra.bench.results import BenchResult

FORMULA = ("USD per 1M tokens = node rate (USD/h) x nodes / 3600 / (tokens / duration s) x 1e6; "
           "tokens and durations summed over the measured files at one concurrency")


@dataclass(frozen=True)
class CostRow:
    concurrency: int
    files: int
    duration_s: float
    output_tokens: int
    total_tokens: int
    usd_per_m_output: float
    usd_per_m_total: float

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s

    @property
    def total_tokens_per_s(self) -> float:
        return self.total_tokens / self.duration_s


def usd_per_million(node_rate_usd_per_hour: float, nodes: int, tokens: int,
                    duration_s: float) -> float:
    if tokens <= 0 or duration_s <= 0:
        raise ValueError(f"{tokens} tokens in {duration_s} s: no throughput to price")
    return node_rate_usd_per_hour * nodes / 3600.0 / (tokens / duration_s) * 1e6


def cost_rows(results: Sequence[BenchResult], node_rate_usd_per_hour: float,
              nodes: int = 1) -> list[CostRow]:
    if node_rate_usd_per_hour <= 0:
        raise ValueError(f"node rate {node_rate_usd_per_hour} USD/h must be > 0")
    if nodes < 1:
        raise ValueError(f"nodes {nodes} must be >= 1")
    pooled: dict[int, list[BenchResult]] = {}
    for r in results:
        if r.role == "warmup" or r.max_concurrency is None:
            continue
        pooled.setdefault(r.max_concurrency, []).append(r)
    rows = []
    for c in sorted(pooled):
        rs = pooled[c]
        duration = sum(r.duration_s for r in rs)
        out = sum(r.total_output_tokens for r in rs)
        total = out + sum(r.total_input_tokens for r in rs)
        rows.append(CostRow(c, len(rs), duration, out, total,
                            usd_per_million(node_rate_usd_per_hour, nodes, out, duration),
                            usd_per_million(node_rate_usd_per_hour, nodes, total, duration)))
    return rows
