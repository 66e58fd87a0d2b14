"""Showing a comparison: the `rich` table (receipt vs measured vs delta, pass/fail) and
the `--plot` figure. Presentation only; the verdicts come from k3infra.bench.compare."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from rich.table import Table

from k3infra.bench.compare import Comparison
from k3infra.bench.results import BenchResult
from k3infra.display import console as literal_console, pyplot, styled, write_figure
from k3infra.receipt import Receipt
from k3infra.bench.cost import FORMULA

_STYLE = {"pass": "green", "FAIL": "bold red", "not comparable": "yellow",
          "new evidence": "cyan"}


def _short(source: str) -> str:
    return Path(source).name


def comparison_table(cmp: Comparison, receipt: Receipt):
    table = Table(title=f"e2e latency vs receipt {receipt.id} "
                        f"(tolerance +-{cmp.tolerance_pct:g} %)")
    for col, justify in (("file", "left"), ("c", "right"), ("stat", "left"),
                         ("receipt ms", "right"), ("measured ms", "right"),
                         ("delta", "right"), ("verdict", "left")):
        table.add_column(col, justify=justify)
    for r in cmp.rows:
        verdict = r.verdict(cmp.tolerance_pct)
        delta = r.delta_pct()
        table.add_row(_short(r.source), str(r.concurrency), r.stat,
                      "-" if r.receipt_ms is None else f"{r.receipt_ms:.0f}",
                      f"{r.measured_ms:.0f}", "-" if delta is None else f"{delta:+.1f} %",
                      styled((verdict, _STYLE[verdict])))
    return table


def workload_table(cmp: Comparison, only_mismatches: bool = True):
    table = Table(title="workload vs receipt: mismatches" if only_mismatches
                  else "workload vs receipt")
    for col in ("file", "check", "expected", "actual", ""):
        table.add_column(col)
    for c in cmp.checks:
        if only_mismatches and c.ok:
            continue
        table.add_row(_short(c.source), c.what, c.expected, c.actual,
                      styled(("ok", "green")) if c.ok else styled(("MISMATCH", "bold red")))
    return table


def print_comparison(cmp: Comparison, receipt: Receipt, console=None) -> None:
    console = console or literal_console()
    if cmp.cross_topology:
        console.print(styled(("cross-topology comparison", "bold red"),
                             f": {cmp.cross_topology} results against receipt {receipt.id} "
                             f"({receipt.hardware.node}); NOT the measured configuration"))
    files = len({c.source for c in cmp.checks})
    if cmp.mismatches:
        console.print(workload_table(cmp))
    else:
        console.print(f"workload: {files} file(s) match receipt {receipt.id}'s Workload A "
                      "(grid, prompt tokens, output cap, no failed request)")
    console.print(comparison_table(cmp, receipt))
    status = cmp.exit_status()
    verdict = {0: styled(("PASS", "green"), ": within tolerance of the receipt"),
               1: styled(("FAIL", "bold red"), ": outside tolerance of the receipt"),
               3: styled(("NOT COMPARABLE", "bold red"), ": not the receipt's workload")}[status]
    if status == 1 and not cmp.failures:
        # Exit 1 all the same (never a pass), but nothing was outside any tolerance.
        verdict = styled(("NOT JUDGED", "bold yellow"), ": nothing to judge against (below)")
    console.print(verdict)
    for reason in cmp.reasons():
        console.print(f"  - {reason}")


def plot_latencies(results: Sequence[BenchResult], receipt: Receipt, tolerance_pct: float,
                   out: Path) -> Path:
    """Per-request e2e latencies of every file (one column per file) against the
    receipt's p50/p99 at that file's concurrency, with the tolerance band."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(results) + 3), 4.5))
    labelled: set[str] = set()
    for x, r in enumerate(results):
        lat = r.successful_latencies_ms or []
        ax.scatter([x] * len(lat), lat, s=28, color="tab:blue", zorder=3,
                   label=None if "req" in labelled else "measured requests")
        labelled.add("req")
        m: Optional[object] = receipt.measurement(r.max_concurrency, "e2el") \
            if r.max_concurrency else None
        if m is None:
            continue
        for value, color, name in ((m.p50_ms, "tab:green", "receipt p50"),
                                   (m.p99_ms, "tab:red", "receipt p99")):
            band = value * tolerance_pct / 100.0
            ax.hlines(value, x - 0.35, x + 0.35, colors=color, zorder=2,
                      label=None if name in labelled else name)
            ax.fill_between([x - 0.35, x + 0.35], value - band, value + band, color=color,
                            alpha=0.12, zorder=1,
                            label=None if f"{name} band" in labelled
                            else f"{name} +-{tolerance_pct:g} %")
            labelled.update({name, f"{name} band"})
    ax.set_xticks(range(len(results)))
    ax.set_xticklabels([f"{_short(r.source)}\nc={r.max_concurrency}" for r in results],
                       fontsize=7)
    ax.set_ylabel("end-to-end latency (ms)")
    ax.set_title(f"per-request e2e latency vs receipt {receipt.id}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    try:
        return write_figure(fig, out)
    finally:
        plt.close(fig)


def print_cost(rows, node_rate: float, nodes: int, console=None) -> None:
    """The cost table and the formula it used (k3infra.bench.cost)."""
    console = console or literal_console()
    table = Table(title=f"cost at {node_rate:g} USD per node-hour x {nodes} node(s)")
    for col in ("c", "files", "duration s", "output tok/s", "total tok/s",
                "USD / 1M output", "USD / 1M total"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r.concurrency), str(r.files), f"{r.duration_s:.2f}",
                      f"{r.output_tokens_per_s:.2f}", f"{r.total_tokens_per_s:.2f}",
                      f"{r.usd_per_m_output:.4f}", f"{r.usd_per_m_total:.4f}")
    console.print(table)
    console.print(f"formula: {FORMULA}", highlight=False, soft_wrap=True)


def plot_cost(rows, node_rate: float, nodes: int, out: Path) -> Path:
    """USD per million output and total tokens against concurrency (log-log)."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7.0, 4.5))
    cs = [r.concurrency for r in rows]
    for values, name, color in (([r.usd_per_m_output for r in rows], "per 1M output tokens",
                                 "tab:red"),
                                ([r.usd_per_m_total for r in rows], "per 1M tokens (input + output)",
                                 "tab:blue")):
        ax.plot(cs, values, marker="o", color=color, label=name)
        for c, v in zip(cs, values):
            ax.annotate(f"${v:,.2f}", (c, v), textcoords="offset points", xytext=(4, 6),
                        fontsize=8, color=color)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(cs)
    ax.set_xticklabels([str(c) for c in cs])
    ax.margins(x=0.12)
    ax.set_xlabel("concurrency (max in-flight requests)")
    ax.set_ylabel("USD per million tokens")
    ax.set_title(f"cost at {node_rate:g} USD/node-hour x {nodes} node(s), measured throughput")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        return write_figure(fig, out)
    finally:
        plt.close(fig)
