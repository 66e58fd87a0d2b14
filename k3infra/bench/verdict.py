"""The one verdict of a measured latency against a receipt's figure, and the gate's table.

Standard library only: `k3infra bench compare` (k3infra/bench/compare.py) and the rollout
gate's benchmark Job (k3infra/bench/pod_runner.py --gate, in the engine image) both judge
with it, so a canary and your laptop can never disagree on what passes.
"""
from __future__ import annotations

from typing import Optional, Sequence

PASS, FAIL = "pass", "FAIL"


def delta_pct(measured_ms: float, receipt_ms: float) -> float:
    """How far a measured figure is from the receipt's, in % of the receipt's."""
    return (measured_ms - receipt_ms) / receipt_ms * 100.0


def within(measured_ms: float, receipt_ms: float, tolerance_pct: float) -> bool:
    """Both directions: faster than measured by more than the tolerance is drift too."""
    return abs(delta_pct(measured_ms, receipt_ms)) <= tolerance_pct


def gate_rows(figures: Sequence[dict], measured: Sequence[tuple[int, str, float]],
              tolerance_pct: float) -> list[tuple[int, str, Optional[float], float, str]]:
    """(concurrency, stat, receipt ms, measured ms, verdict) for every measured point;
    `figures`: the receipt's e2el figures ({concurrency, p50_ms, p99_ms}); `measured`:
    (concurrency, "p50"|"p99", ms) of the run. A point the receipt has no figure for is
    shown, not judged ("new evidence", as `bench compare` says)."""
    ref = {(int(f["concurrency"]), s): float(f[f"{s}_ms"]) for f in figures for s in ("p50", "p99")}
    rows = []
    for concurrency, stat, ms in measured:
        want = ref.get((concurrency, stat))
        verdict = ("new evidence" if want is None else
                   PASS if within(ms, want, tolerance_pct) else FAIL)
        rows.append((concurrency, stat, want, ms, verdict))
    return rows


def gate_table(receipt_id: str, tolerance_pct: float,
               rows: Sequence[tuple[int, str, Optional[float], float, str]]) -> str:
    """The comparison as plain text: what `pulumi up` shows when the gate refuses."""
    lines = [f"gate: canary against receipt {receipt_id} (e2el, +-{tolerance_pct:g} %)",
             f"{'c':>4} {'stat':<4} {'receipt ms':>11} {'measured ms':>12} {'delta':>9}  verdict"]
    for concurrency, stat, want, ms, verdict in rows:
        delta = "-" if want is None else f"{delta_pct(ms, want):+.1f} %"
        shown = "-" if want is None else f"{want:.0f}"
        lines.append(f"{concurrency:>4} {stat:<4} {shown:>11} {ms:>12.0f} {delta:>9}  {verdict}")
    judged = [r for r in rows if r[4] in (PASS, FAIL)]
    failed = [r for r in judged if r[4] == FAIL]
    if not judged:
        lines.append("REFUSED: no measured point at a concurrency the receipt measured")
    elif failed:
        lines.append(f"REFUSED: {len(failed)} of {len(judged)} point(s) outside the tolerance; "
                     "the other replicas keep the previous template")
    else:
        lines.append(f"PASSED: {len(judged)} point(s) within the tolerance; promoting")
    return "\n".join(lines)


def gate_passes(rows: Sequence[tuple[int, str, Optional[float], float, str]]) -> bool:
    judged = [r for r in rows if r[4] in (PASS, FAIL)]
    return bool(judged) and all(r[4] == PASS for r in judged)
