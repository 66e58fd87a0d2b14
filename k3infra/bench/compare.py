"""Comparing `vllm bench serve` results with the receipt. Pure: no I/O, no printing.

Two questions, in this order:
1. Is it the receipt's workload? Per file: a measured (not warm-up) run, no failed
   request, the receipt's request count, a concurrency of the receipt's grid, every
   prompt inside the receipt's token range as the server counted it (`input_lens`), no
   output above the cap (exactly the cap when the Job ignored EOS), and p50/p99 e2el
   that agree with the file's own per-request `latencies`. A file that fails any of
   these is not comparable: its latencies are shown but never judged.
   A file at a concurrency the receipt did not measure (the wider sweep, concurrency 1)
   is new evidence: the grid checks (concurrency, request count) do not apply; the
   output cap is the receipt's, or at the wide sweep's concurrencies the sweep's when
   outputs pass the receipt's; the integrity checks apply; its latencies are shown,
   never judged.
2. Are p50 and p99 end-to-end latency within tolerance of the receipt at the same
   concurrency? Two-sided: a run far *faster* than the receipt is as suspect as a slow
   one (prefix-cache hits, short outputs) and fails the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from k3infra.bench import verdict
from k3infra.bench.results import BenchResult, percentile
from k3infra.bench.workload import WORKLOAD_ID
from k3infra.receipt import NOTHING_MEASURED, Receipt

# +-10 %: node-to-node spread of identical B300 nodes and a 3-request p99 need room; a
# 20 % regression must still fail. Configurable (`--tolerance-pct`, k3:benchmark).
DEFAULT_TOLERANCE_PCT = 10.0
# p50/p99 recomputed from `latencies` must match the file's figures this closely (ms).
PERCENTILE_AGREEMENT_MS = 0.05

EXIT_PASS, EXIT_OUTSIDE_TOLERANCE, EXIT_MISMATCH = 0, 1, 3


@dataclass(frozen=True)
class Check:
    source: str
    what: str
    expected: str
    actual: str
    ok: bool


@dataclass(frozen=True)
class LatencyRow:
    source: str
    concurrency: Optional[int]
    stat: str                   # "p50" / "p99"
    receipt_ms: Optional[float]
    measured_ms: float
    comparable: bool            # the file passed every workload check

    def delta_pct(self) -> Optional[float]:
        if self.receipt_ms is None:
            return None
        return verdict.delta_pct(self.measured_ms, self.receipt_ms)

    def verdict(self, tolerance_pct: float) -> str:
        if not self.comparable:
            return "not comparable"
        if self.receipt_ms is None:
            return "new evidence"
        return (verdict.PASS if verdict.within(self.measured_ms, self.receipt_ms, tolerance_pct)
                else verdict.FAIL)


@dataclass
class Comparison:
    tolerance_pct: float
    checks: list[Check] = field(default_factory=list)
    rows: list[LatencyRow] = field(default_factory=list)
    # The results' topology when it is not the receipt's (one 8-GPU node): the figures are
    # still set against the receipt's, marked as a cross-topology comparison.
    cross_topology: Optional[str] = None
    # The receipt is a candidate: nothing to judge against, never a pass.
    candidate: Optional[str] = None

    @property
    def mismatches(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def judged(self) -> list[LatencyRow]:
        return [r for r in self.rows if r.verdict(self.tolerance_pct) in ("pass", "FAIL")]

    @property
    def failures(self) -> list[LatencyRow]:
        return [r for r in self.rows if r.verdict(self.tolerance_pct) == "FAIL"]

    def exit_status(self) -> int:
        if self.mismatches:
            return EXIT_MISMATCH
        if self.failures or not self.judged:
            return EXIT_OUTSIDE_TOLERANCE
        return EXIT_PASS

    def reasons(self) -> list[str]:
        """One sentence per problem, for the summary under the table."""
        out = [f"{c.source}: {c.what}: expected {c.expected}, got {c.actual}"
               for c in self.mismatches]
        if self.cross_topology:
            out.append(f"cross-topology: results of a {self.cross_topology} replica against "
                       "a receipt measured on one 8-GPU node; not the measured configuration")
        for r in self.failures:
            d = r.delta_pct()
            side = "above" if d > 0 else "below"
            out.append(f"{r.source}: c={r.concurrency} {r.stat} e2el {r.measured_ms:.0f} ms "
                       f"is {abs(d):.1f} % {side} the receipt's {r.receipt_ms:.0f} ms "
                       f"(tolerance +-{self.tolerance_pct:g} %)")
        new = sorted({r.concurrency for r in self.rows
                      if r.verdict(self.tolerance_pct) == "new evidence"})
        if new:
            out.append("new evidence (no receipt figure, shown, not judged): concurrency "
                       + ", ".join(str(c) for c in new))
        if self.candidate:
            out.append(f"receipt {self.candidate} is a candidate: {NOTHING_MEASURED}, so nothing "
                       "was judged; `k3infra bench receipt` turns these results into a "
                       "measured receipt the stack can then name")
        elif not self.mismatches and not self.judged:
            out.append("no result at a concurrency the receipt measured ("
                       + ", ".join(str(c) for c in sorted(
                           {r.concurrency for r in self.rows if r.concurrency})) +
                       " given); nothing was compared")
        return out


def _check(out: list[Check], r: BenchResult, what: str, expected: str, actual: str,
           ok: bool) -> None:
    out.append(Check(r.source, what, expected, actual, ok))


def _is_new_evidence(r: BenchResult, receipt: Receipt) -> bool:
    return r.max_concurrency is not None and receipt.measurement(r.max_concurrency) is None


def workload_checks(r: BenchResult, receipt: Receipt) -> list[Check]:
    w = receipt.workload_a
    out: list[Check] = []
    new = _is_new_evidence(r, receipt)
    wide = w.wide_sweep
    if r.metadata.get("k3_workload") is not None:
        _check(out, r, "workload", WORKLOAD_ID, r.metadata["k3_workload"],
               r.metadata["k3_workload"] == WORKLOAD_ID)
    if r.role is not None:
        _check(out, r, "role", "measured", r.role, r.role == "measured")
    _check(out, r, "failed requests", "0", str(r.failed), r.failed == 0)
    if not new:
        _check(out, r, "measured requests", str(w.measured_requests),
               f"{r.completed} completed of {r.num_prompts}",
               r.completed == r.num_prompts == w.measured_requests)
        _check(out, r, "concurrency", f"one of {w.concurrencies}", str(r.max_concurrency),
               r.max_concurrency in w.concurrencies)

    lo, hi = w.prompt_tokens_min, w.prompt_tokens_max
    if r.input_lens is not None and r.input_lens:
        _check(out, r, "prompt tokens (each request, server count)", f"{lo}..{hi}",
               f"{min(r.input_lens)}..{max(r.input_lens)}",
               all(lo <= n <= hi for n in r.input_lens))
    else:
        mean = r.total_input_tokens / r.completed if r.completed else 0
        _check(out, r, "prompt tokens (mean; no input_lens: use --save-detailed)",
               f"{lo}..{hi}", f"{mean:.0f}", lo <= mean <= hi)

    cap = w.output_tokens_max
    if (new and wide is not None and r.max_concurrency in wide.concurrencies
            and r.output_lens and max(r.output_lens) > cap):
        cap = wide.output_tokens_max     # the wide sweep's outputs; the grid's cap otherwise
    ignore_eos = r.metadata.get("k3_ignore_eos", "").lower() == "true"
    if r.output_lens is not None and r.output_lens:
        if ignore_eos:
            _check(out, r, "output tokens (EOS ignored)", f"exactly {cap}",
                   f"{min(r.output_lens)}..{max(r.output_lens)}",
                   all(n == cap for n in r.output_lens))
        else:
            _check(out, r, "output tokens", f"<= {cap}", f"max {max(r.output_lens)}",
                   max(r.output_lens) <= cap)
    else:
        mean = r.total_output_tokens / r.completed if r.completed else 0
        _check(out, r, "output tokens (mean; no output_lens: use --save-detailed)",
               f"<= {cap}", f"{mean:.0f}", mean <= cap)

    lat = r.successful_latencies_ms
    if lat is None:
        _check(out, r, "per-request latencies", "a 'latencies' array (or ttfts and itls)",
               "absent", False)
    elif lat:
        for stat, reported in (("p50", r.p50_e2el_ms), ("p99", r.p99_e2el_ms)):
            recomputed = percentile(lat, float(stat[1:]))
            _check(out, r, f"{stat}_e2el_ms vs {r.latencies_from}", f"{recomputed:.2f}",
                   f"{reported:.2f}", abs(recomputed - reported) <= PERCENTILE_AGREEMENT_MS)
    return out


SINGLE_NODE = "single-node"


def compare_results(results: Sequence[BenchResult], receipt: Receipt,
                    tolerance_pct: float = DEFAULT_TOLERANCE_PCT,
                    topology: Optional[str] = None) -> Comparison:
    """`topology`: the serving topology the results came from, when the files do not
    record it (`k3_topology`, written by the benchmark Job)."""
    if tolerance_pct < 0:
        raise ValueError(f"tolerance {tolerance_pct} % must not be negative")
    seen = {r.metadata.get("k3_topology") or topology or SINGLE_NODE for r in results}
    other = sorted(t for t in seen if t != SINGLE_NODE)
    cmp = Comparison(tolerance_pct=tolerance_pct,
                     cross_topology=", ".join(other) if other else None,
                     candidate=receipt.id if receipt.is_candidate else None)
    for r in results:
        checks = workload_checks(r, receipt)
        cmp.checks.extend(checks)
        comparable = all(c.ok for c in checks)
        m = receipt.measurement(r.max_concurrency, "e2el") if r.max_concurrency else None
        for stat, measured in (("p50", r.p50_e2el_ms), ("p99", r.p99_e2el_ms)):
            ref = None if m is None else (m.p50_ms if stat == "p50" else m.p99_ms)
            cmp.rows.append(LatencyRow(r.source, r.max_concurrency, stat, ref, measured,
                                       comparable))
    return cmp
