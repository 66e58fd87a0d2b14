"""Judging an accuracy smoke test against the receipt's baseline. Pure apart from reading
the run directory (`load_run`).

The tolerance comes from the sample count. A task's score is a proportion of n graded
items, so the baseline's score p0 over n0 items has a binomial uncertainty. The band is
the Wilson score interval of p0 at n0 with a two-sided 99 % confidence (z = 2.5758): a
later run passes when its score lies inside it. Wilson rather than p +- z*sqrt(p(1-p)/n)
because the smoke test's scores sit near 0 or 1, where the normal interval collapses to
zero width (a perfect baseline would then fail on one wrong answer). At n0 = 100 and
p0 = 0.90 the band is [0.796, 0.954]; at n0 = 20 and p0 = 1.0 it is [0.751, 1.000]. A
wider band with fewer items is the point: 20 items cannot tell 0.95 from 1.0.

Exit statuses of `k3infra accuracy compare`: 0 every task inside its band; 1 a task
outside it (or no baseline to compare with); 2 unreadable run; 3 a run whose task
configuration is not the baseline's (a different test, not a worse one).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from pydantic import Field, StrictBool, StrictFloat, StrictInt

from k3infra.fileformats import (Count, FileFormatError, FileModel, Real, Text, load_json,
                                 load_sha256sums)
from k3infra.podcommon import sha256_file
from k3infra.receipt import AccuracyBaseline, Receipt

CONFIDENCE = 0.99
Z = 2.5758293035489004        # two-sided 99 % normal quantile
LABEL = "smoke test"
EXIT_PASS, EXIT_OUTSIDE, EXIT_UNREADABLE, EXIT_MISMATCH = 0, 1, 2, 3


class RunError(ValueError):
    """A run directory that cannot be judged: unreadable, incomplete or tampered with."""


def wilson_interval(p: float, n: int, z: float = Z) -> tuple[float, float]:
    if n <= 0 or not 0.0 <= p <= 1.0:
        raise ValueError(f"score {p} over {n} samples: need 0 <= score <= 1 and n >= 1")
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # The interval always holds p (exactly 0 below p = 0, 1 above p = 1); in floating
    # point centre - half at p = 0 is +5.6e-17 for n = 4, and a run that scored 0 failed
    # against its own just-accepted baseline (on the node, issue 27).
    return min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))


@dataclass(frozen=True)
class AccuracyRun:
    path: Path
    run_id: str
    harness: str
    task_config: dict
    scores: dict[str, dict]          # task -> {metric, score, samples}
    files: dict[str, str]            # relative file -> sha256 (SHA256SUMS)
    engine_image: str = ""


# ---- the run directory's files, typed (k3infra.fileformats) ---------------------------

class _TaskScore(FileModel):
    metric: Text(256)
    score: Real(0, 1)
    samples: Count(10 ** 7, ge=1)


_Scalar = Union[StrictBool, StrictInt, StrictFloat, Text(4096), None]


class ScoresFile(FileModel):
    """scores.json: what runner.py wrote from lm-eval's results."""

    run_id: Optional[Text(256)] = None
    harness: Text(4096) = ""
    task_config: dict[Text(256), Union[_Scalar, list[_Scalar], dict[Text(256), _Scalar]]] = \
        Field(default_factory=dict, max_length=256)
    scores: dict[Text(256), _TaskScore] = Field(min_length=1, max_length=256)


class IndexFile(FileModel):
    status: Text(64)
    problems: list[Text(1 << 16)] = Field(default_factory=list, max_length=1024)


class RunConfigFile(FileModel):
    engine_image: Text(1024) = ""


def _read(run_dir: Path, name: str, model):
    # Inside the run directory: no link followed, bounded, typed.
    try:
        return load_json(run_dir / name, "accuracy file", model, follow_links=False)
    except FileFormatError as exc:
        raise RunError(str(exc)) from None


def load_run(path: Path) -> AccuracyRun:
    """A run directory (or its scores.json): every file checked against SHA256SUMS, each
    read by the one bounded reader and typed."""
    run_dir = path.parent if path.is_file() else path
    sums_file = run_dir / "SHA256SUMS"
    if not os.path.lexists(sums_file):
        raise RunError(f"{run_dir}: no SHA256SUMS (not an accuracy run directory)")
    try:
        listed = load_sha256sums(sums_file)
    except FileFormatError as exc:
        raise RunError(str(exc)) from None
    files: dict[str, str] = {}
    for name, digest in listed.items():
        try:
            actual = sha256_file(run_dir / name)      # a regular file, no link followed
        except OSError as exc:
            raise RunError(f"{run_dir}: {name} is listed in SHA256SUMS but cannot be read "
                           f"({exc.strerror or exc})") from None
        if actual != digest:
            raise RunError(f"{run_dir}: {name} does not match SHA256SUMS")
        files[name] = digest
    for required in ("scores.json", "index.json", "config.json"):
        if required not in files:
            raise RunError(f"{run_dir}: {required} is not covered by SHA256SUMS")
    index = _read(run_dir, "index.json", IndexFile)
    if index.status != "complete":
        raise RunError(f"{run_dir}: run status {index.status!r}, problems: "
                       f"{list(index.problems)[:5]}")
    scores = _read(run_dir, "scores.json", ScoresFile)
    config = _read(run_dir, "config.json", RunConfigFile)
    return AccuracyRun(path=run_dir, run_id=scores.run_id or run_dir.name,
                       harness=scores.harness,
                       task_config=dict(scores.task_config),
                       scores={t: s.model_dump() for t, s in scores.scores.items()}, files=files,
                       engine_image=config.engine_image)


@dataclass(frozen=True)
class TaskRow:
    task: str
    baseline: float
    baseline_samples: int
    measured: Optional[float]
    samples: Optional[int]
    band: tuple[float, float]

    @property
    def ok(self) -> bool:
        return self.measured is not None and self.band[0] <= self.measured <= self.band[1]


@dataclass
class AccuracyComparison:
    rows: list[TaskRow] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    def exit_status(self) -> int:
        if self.mismatches:
            return EXIT_MISMATCH
        return EXIT_PASS if self.rows and all(r.ok for r in self.rows) else EXIT_OUTSIDE

    def reasons(self) -> list[str]:
        out = list(self.mismatches)
        for r in self.rows:
            if r.measured is None:
                out.append(f"{r.task}: no score in this run (baseline {r.baseline:.4f})")
            elif not r.ok:
                out.append(f"{r.task}: score {r.measured:.4f} over {r.samples} samples is "
                           f"outside the baseline {r.baseline:.4f} over {r.baseline_samples} "
                           f"samples (Wilson {CONFIDENCE:.0%} band "
                           f"{r.band[0]:.4f}..{r.band[1]:.4f})")
        return out


def compare_run(run: AccuracyRun, baseline: AccuracyBaseline) -> AccuracyComparison:
    cmp = AccuracyComparison()
    for key in sorted(set(baseline.task_config) | set(run.task_config)):
        want, got = baseline.task_config.get(key), run.task_config.get(key)
        if want != got:
            cmp.mismatches.append(f"task configuration {key}: baseline {want!r}, run {got!r}")
    for s in baseline.scores:
        got = run.scores.get(s.task)
        measured = float(got["score"]) if isinstance(got, dict) else None
        samples = int(got["samples"]) if isinstance(got, dict) else None
        if got is not None and got.get("metric") != s.metric:
            cmp.mismatches.append(f"{s.task}: metric {got.get('metric')!r}, baseline {s.metric!r}")
        cmp.rows.append(TaskRow(s.task, s.score, s.samples, measured, samples,
                                wilson_interval(s.score, s.samples)))
    return cmp


def baseline_section(run: AccuracyRun, receipt: Receipt) -> dict:
    """The receipt's `accuracy:` section from an accepted run."""
    section = {
        "label": LABEL, "run_id": run.run_id, "harness": run.harness,
        "task_config": run.task_config,
        "scores": [{"task": t, "metric": s["metric"], "score": float(s["score"]),
                    "samples": int(s["samples"])} for t, s in sorted(run.scores.items())],
        "files": [{"file": f, "sha256": h} for f, h in sorted(run.files.items())],
        "engine": {"version": receipt.engine.version, "commit": receipt.engine.commit,
                   "image": run.engine_image or None},
        "weights": {"repo": receipt.model.repo, "revision": receipt.model.revision,
                    "tree_digest": receipt.model.tree_digest},
    }
    AccuracyBaseline.model_validate(section)
    return section
