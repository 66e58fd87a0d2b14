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

Pure: parse and validate; a bad file raises ResultError naming the file and the key.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

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


def _number(data: dict, key: str, source: str, *, integer: bool = False,
            required: bool = True, hint: str = "") -> Any:
    if key not in data or data[key] is None:
        if required:
            raise ResultError(source, f"missing key {key!r}" + (f"; {hint}" if hint else ""))
        return None
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResultError(source, f"{key} = {value!r} is not a number")
    if not math.isfinite(value):
        raise ResultError(source, f"{key} = {value!r} is not finite")
    if integer:
        if value != int(value):
            raise ResultError(source, f"{key} = {value!r} is not an integer")
        return int(value)
    return float(value)


def _array(data: dict, key: str, source: str, length: int, kind: type) -> Optional[tuple]:
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, list):
        raise ResultError(source, f"{key} is not a list")
    if len(value) != length:
        raise ResultError(source, f"{key} has {len(value)} entries, num_prompts is {length}")
    out = []
    for i, v in enumerate(value):
        if kind is str:
            if v is not None and not isinstance(v, str):
                raise ResultError(source, f"{key}[{i}] = {v!r} is not a string")
            out.append(v or "")
        elif kind is list:
            if not isinstance(v, list) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                raise ResultError(source, f"{key}[{i}] is not a list of numbers")
            out.append(tuple(float(x) for x in v))
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ResultError(source, f"{key}[{i}] = {v!r} is not a number")
            out.append(kind(v))
    return tuple(out)


def parse_result(data: Any, source: str, sha256: str = "") -> BenchResult:
    if not isinstance(data, dict):
        raise ResultError(source, "is not a JSON object (a vllm bench serve result file)")
    num_prompts = _number(data, "num_prompts", source, integer=True)
    completed = _number(data, "completed", source, integer=True)
    failed = _number(data, "failed", source, integer=True)
    if num_prompts < 0 or completed < 0 or failed < 0:
        raise ResultError(source, "num_prompts, completed and failed must not be negative")
    if "max_concurrency" not in data:
        raise ResultError(source, "missing key 'max_concurrency'")
    max_c = data["max_concurrency"]
    if max_c is not None:
        max_c = _number(data, "max_concurrency", source, integer=True)
    p50 = _number(data, "p50_e2el_ms", source, hint=E2EL_HINT)
    p99 = _number(data, "p99_e2el_ms", source, hint=E2EL_HINT)
    percentiles = {k: float(v) for k, v in data.items()
                   if _PERCENTILE_KEY.match(k) and isinstance(v, (int, float))
                   and not isinstance(v, bool)}
    metadata = {k: str(data[k]) for k in META_KEYS if k in data}
    ttfts = _array(data, "ttfts", source, num_prompts, float)
    itls = _array(data, "itls", source, num_prompts, list)
    latencies = _array(data, "latencies", source, num_prompts, float)
    latencies_from = "latencies"
    if latencies is None and ttfts is not None and itls is not None:
        # compare still checks them against the file's own p50/p99 (0.05 ms).
        latencies = tuple(t + sum(i) for t, i in zip(ttfts, itls))
        latencies_from = "ttfts + itls"
    return BenchResult(
        source=source, sha256=sha256,
        date=str(data["date"]) if data.get("date") is not None else None,
        model_id=str(data["model_id"]) if data.get("model_id") is not None else None,
        num_prompts=num_prompts, completed=completed, failed=failed, max_concurrency=max_c,
        duration_s=_number(data, "duration", source),
        total_input_tokens=_number(data, "total_input_tokens", source, integer=True),
        total_output_tokens=_number(data, "total_output_tokens", source, integer=True),
        output_throughput=_number(data, "output_throughput", source, required=False),
        p50_e2el_ms=p50, p99_e2el_ms=p99,
        latencies_s=latencies, latencies_from=latencies_from,
        input_lens=_array(data, "input_lens", source, num_prompts, int),
        output_lens=_array(data, "output_lens", source, num_prompts, int),
        ttfts_s=ttfts, itls_s=itls,
        errors=_array(data, "errors", source, num_prompts, str),
        metadata=metadata, percentiles_ms=percentiles,
    )


def load_result(path: Path) -> BenchResult:
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ResultError(source, f"cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise ResultError(source, "is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            raise ResultError(source, "holds more than one JSON document (written with "
                              "--append-result?); pass one result per file") from None
        raise ResultError(source, f"is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    return parse_result(data, source, hashlib.sha256(raw).hexdigest())
