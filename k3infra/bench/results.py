"""Reading `vllm bench serve` result files (`--save-result --save-detailed`).

The key layout is vLLM's (vllm/benchmarks/serve.py): top-level `date`, `backend`,
`model_id`, `tokenizer_id`, `num_prompts`, `request_rate`, `burstiness`,
`max_concurrency`, then the benchmark's `duration`, `completed`, `failed`,
`total_input_tokens`, `total_output_tokens`, `*_throughput`, the per-request arrays
`input_lens`, `output_lens`, `ttfts`, `itls`, `latencies` (seconds; `latencies` is the
per-request end-to-end latency and is kept even without `--save-detailed`; vLLM 0.25
writes none: there it is derived as `ttft + sum(itls)`, which is how vLLM measures it,
the last chunk's time minus the request's start),
`generated_texts`, `errors`, and per metric `mean_/median_/std_<m>_ms` plus
`p<P>_<m>_ms` for every `--metric-percentiles` value. `--metadata KEY=VALUE` pairs are
merged into the top level as strings (the benchmark Job records its workload there).

Read by the one bounded reader and typed by ResultFile (k3infra.fileformats); a bad file
raises ResultError naming the file and the key, in one line.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from pydantic import model_validator

from k3infra.fileformats import (Count, FileFormatError, FileModel, Real, Text, json_value,
                                 read_bytes, validate)

E2EL_KEYS = ("p50_e2el_ms", "p99_e2el_ms")
E2EL_HINT = ("run vllm bench serve with --percentile-metrics ttft,tpot,itl,e2el "
             "--metric-percentiles 50,99")
_PERCENTILE_KEY = re.compile(r"^p\d+(\.\d+)?_[a-z0-9_]+_ms$")
# Keys the benchmark Job writes with --metadata (strings in the file).
META_KEYS = ("k3_workload", "k3_role", "k3_run", "k3_run_id", "k3_seed", "k3_ignore_eos",
             "k3_dataset_sha256", "k3_receipt", "k3_topology")


class ResultError(ValueError):
    """A result file that cannot be compared: unreadable, malformed, or missing keys."""

    def __init__(self, source: str, message: str):
        self.source = source
        super().__init__(f"{source}: {message}")


def percentile(values: Sequence[float], p: float) -> float:
    """numpy.percentile's default (linear) method, which vllm bench serve uses."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


@dataclass(frozen=True)
class BenchResult:
    source: str
    sha256: str
    date: Optional[str]
    model_id: Optional[str]
    num_prompts: int
    completed: int
    failed: int
    max_concurrency: Optional[int]
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    output_throughput: Optional[float]
    p50_e2el_ms: float
    p99_e2el_ms: float
    latencies_s: Optional[tuple[float, ...]]
    input_lens: Optional[tuple[int, ...]]
    output_lens: Optional[tuple[int, ...]]
    ttfts_s: Optional[tuple[float, ...]]
    itls_s: Optional[tuple[tuple[float, ...], ...]]
    errors: Optional[tuple[str, ...]]
    metadata: dict[str, str] = field(default_factory=dict)
    latencies_from: str = "latencies"   # or "ttfts + itls" (vLLM 0.25 writes no latencies)
    percentiles_ms: dict[str, float] = field(default_factory=dict)  # e.g. "p99_ttft_ms"

    @property
    def role(self) -> Optional[str]:
        return self.metadata.get("k3_role")

    @property
    def successful_latencies_ms(self) -> Optional[list[float]]:
        """Per-request e2e latency of successful requests, ms (what vLLM's percentiles
        are computed over: failed requests carry latency 0 and are left out)."""
        if self.latencies_s is None:
            return None
        ok = (lambda i: not self.errors[i]) if self.errors is not None else (lambda i: True)
        if self.errors is None and self.failed:
            return None  # cannot tell which requests failed
        return [v * 1000.0 for i, v in enumerate(self.latencies_s) if ok(i)]


# Ceilings of a result file's figures: past every benchmark a node runs.
MAX_PROMPTS = 10_000_000
MAX_TOKENS = 10 ** 13
MAX_SECONDS = 10 ** 7


class ResultFile(FileModel):
    """A `vllm bench serve` result file, the keys read here (typed: a count is a JSON
    integer, a figure a finite number, never a string; per-request arrays as long as
    num_prompts). Other keys are left alone."""

    date: Optional[Text(256)] = None
    model_id: Optional[Text(1024)] = None
    num_prompts: Count(MAX_PROMPTS)
    completed: Count(MAX_PROMPTS)
    failed: Count(MAX_PROMPTS)
    max_concurrency: Optional[Count(MAX_PROMPTS, ge=1)]       # the key is required, null allowed
    duration: Real(0, MAX_SECONDS)
    total_input_tokens: Count(MAX_TOKENS)
    total_output_tokens: Count(MAX_TOKENS)
    output_throughput: Optional[Real(0, MAX_TOKENS)] = None
    p50_e2el_ms: Real(0, MAX_SECONDS * 1000)
    p99_e2el_ms: Real(0, MAX_SECONDS * 1000)
    ttfts: Optional[list[Real(0, MAX_SECONDS)]] = None
    itls: Optional[list[list[Real(0, MAX_SECONDS)]]] = None
    latencies: Optional[list[Real(0, MAX_SECONDS)]] = None
    input_lens: Optional[list[Count(MAX_TOKENS)]] = None
    output_lens: Optional[list[Count(MAX_TOKENS)]] = None
    errors: Optional[list[Optional[Text(1 << 16)]]] = None
    metadata: dict[str, Text(1024)] = {}     # the k3_* keys (--metadata), gathered below

    @model_validator(mode="after")
    def _arrays_per_prompt(self) -> "ResultFile":
        for key in ("ttfts", "itls", "latencies", "input_lens", "output_lens", "errors"):
            value = getattr(self, key)
            if value is not None and len(value) != self.num_prompts:
                raise ValueError(f"{key} has {len(value)} entries, num_prompts is {self.num_prompts}")
        return self


def parse_result(data: Any, source: str, sha256: str = "") -> BenchResult:
    if not isinstance(data, dict):
        raise ResultError(source, "is not a JSON object (a vllm bench serve result file)")
    for key in E2EL_KEYS:
        if data.get(key) is None:
            raise ResultError(source, f"missing key {key!r}; {E2EL_HINT}")
    if "max_concurrency" not in data:
        raise ResultError(source, "missing key 'max_concurrency'")
    typed = {**data, "metadata": {k: data[k] for k in META_KEYS if k in data}}
    try:
        f = validate(typed, ResultFile, source)
    except FileFormatError as exc:
        raise ResultError(source, exc.problem) from None
    percentiles = {}
    for key, value in data.items():
        if isinstance(key, str) and _PERCENTILE_KEY.match(key) and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ResultError(source, f"{key}: not finite (got {value!r})")
            percentiles[key] = float(value)
    tup = (lambda v: tuple(v) if v is not None else None)
    latencies, latencies_from = tup(f.latencies), "latencies"
    if latencies is None and f.ttfts is not None and f.itls is not None:
        # compare still checks them against the file's own p50/p99 (0.05 ms).
        latencies = tuple(t + sum(i) for t, i in zip(f.ttfts, f.itls))
        latencies_from = "ttfts + itls"
    return BenchResult(
        source=source, sha256=sha256, date=f.date, model_id=f.model_id,
        num_prompts=f.num_prompts, completed=f.completed, failed=f.failed,
        max_concurrency=f.max_concurrency, duration_s=f.duration,
        total_input_tokens=f.total_input_tokens, total_output_tokens=f.total_output_tokens,
        output_throughput=f.output_throughput, p50_e2el_ms=f.p50_e2el_ms,
        p99_e2el_ms=f.p99_e2el_ms, latencies_s=latencies, latencies_from=latencies_from,
        input_lens=tup(f.input_lens), output_lens=tup(f.output_lens), ttfts_s=tup(f.ttfts),
        itls_s=tuple(tuple(i) for i in f.itls) if f.itls is not None else None,
        errors=tuple(e or "" for e in f.errors) if f.errors is not None else None,
        metadata=dict(f.metadata), percentiles_ms=percentiles,
    )


def load_result(path: Path) -> BenchResult:
    """A result file through the one bounded reader and parser (k3infra.fileformats)."""
    source = str(path)
    try:
        raw = read_bytes(path, "benchmark result")
        data = json_value(raw, source, "benchmark result")
    except FileFormatError as exc:
        problem = exc.problem
        if "more than one JSON document" in problem:
            problem += " (written with --append-result?); pass one result per file"
        raise ResultError(source, problem) from None
    return parse_result(data, source, hashlib.sha256(raw).hexdigest())
