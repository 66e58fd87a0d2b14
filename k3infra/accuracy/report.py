"""Showing an accuracy comparison: the `rich` table and the `--plot` figure. Presentation
only; the verdicts come from k3infra.accuracy.compare."""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from k3infra.accuracy.compare import CONFIDENCE, AccuracyComparison
from k3infra.display import pyplot, styled, write_figure
from k3infra.receipt import Receipt


def accuracy_table(cmp: AccuracyComparison, receipt: Receipt):
    table = Table(title=f"accuracy smoke test vs receipt {receipt.id}'s baseline "
                        f"(Wilson {CONFIDENCE:.0%} band at the baseline's sample count)")
    for col, justify in (("task", "left"), ("baseline", "right"), ("n", "right"),
                         ("band", "right"), ("measured", "right"), ("n", "right"),
                         ("verdict", "left")):
        table.add_column(col, justify=justify)
    for r in cmp.rows:
        table.add_row(r.task, f"{r.baseline:.4f}", str(r.baseline_samples),
                      f"{r.band[0]:.4f}..{r.band[1]:.4f}",
                      "-" if r.measured is None else f"{r.measured:.4f}",
                      "-" if r.samples is None else str(r.samples),
                      styled(("pass", "green")) if r.ok else styled(("FAIL", "bold red")))
    return table


def plot_accuracy(cmp: AccuracyComparison, receipt: Receipt, out: Path) -> Path:
    """Per task: the baseline score, its tolerance band, and this run's score."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(cmp.rows) + 3), 4.5))
    for x, r in enumerate(cmp.rows):
        first = x == 0
        ax.fill_between([x - 0.3, x + 0.3], r.band[0], r.band[1], color="tab:green",
                        alpha=0.18, label=f"tolerance (Wilson {CONFIDENCE:.0%})" if first else None)
        ax.hlines(r.baseline, x - 0.3, x + 0.3, colors="tab:green", linewidth=2,
                  label="baseline" if first else None)
        if r.measured is not None:
            ax.scatter([x], [r.measured], s=80, zorder=3,
                       color="tab:blue" if r.ok else "tab:red", marker="o" if r.ok else "X",
                       label=None)
            ax.annotate(f"{r.measured:.2f}", (x, r.measured), textcoords="offset points",
                        xytext=(10, -4), fontsize=9)
    ax.scatter([], [], color="tab:blue", marker="o", label="this run (inside)")
    ax.scatter([], [], color="tab:red", marker="X", label="this run (outside)")
    ax.set_xticks(range(len(cmp.rows)))
    ax.set_xticklabels([f"{r.task}\nn={r.samples or '-'} (baseline n={r.baseline_samples})"
                        for r in cmp.rows], fontsize=8)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("exact match (fraction of items)")
    ax.set_title(f"accuracy SMOKE TEST vs receipt {receipt.id} baseline")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    try:
        return write_figure(fig, out)
    finally:
        plt.close(fig)
