"""The timeline of a serving pod's last start, read back from what the pod recorded, and
compared with the budgets the render gave it (docs/coldstart.md). Pure: (pod dict, log
text) -> Timeline; `k3infra startup` reads both from the cluster.

Sources, each already on the pod:
- the pod status: scheduled (PodScheduled) and the vllm container's start; the gap is
  the image pull (plus volume attach and sandbox creation);
- the start script's `k3-phase name=... event=start|end ts=...` lines (gate, engine) and
  its `k3-compile-cache key=...` line (k3infra/serving/start.py);
- vLLM's own log lines, timed by the log's timestamps (`kubectl logs --timestamps`):
  "Loading weights took" / "Model loading took" (load done), "Directly load the
  compiled graph(s) ... from the cache" (a compile cache hit) or "Compiling a graph"
  (a miss), "Graph capturing finished" (compile and graph capture done) and
  "Application startup complete" (ready); "Starting to load model" (the load's start);
- the pod template's `k3infra.dev/startup-budget` annotation: the render's budgets.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from pydantic import Field, RootModel

from k3infra.fileformats import Count, FileFormatError, FileModel, Text, json_value, validate
from k3infra.serving.start import CACHE_PREFIX, PHASE_PREFIX
from k3infra.serving.startup import BUDGET_ANNOTATION

# ---- what is read, typed: the startup-budget annotation and a pod's JSON ----------------
# A phase's budget: whole seconds, at most a week (k3infra.fieldtypes.Seconds).
MAX_BUDGET_SECONDS = 7 * 86400


class StartupBudget(RootModel):
    """The `k3infra.dev/startup-budget` annotation: {phase: whole seconds}."""

    root: dict[Text(64), Count(MAX_BUDGET_SECONDS)] = Field(max_length=64)


class _Meta(FileModel):
    name: Text(253) = ""
    annotations: Optional[dict[Text(317), Text(1 << 18)]] = None


class _Started(FileModel):
    startedAt: Optional[Text(64)] = None


class _State(FileModel):
    running: Optional[_Started] = None
    terminated: Optional[_Started] = None


class _ContainerStatus(FileModel):
    name: Text(253)
    restartCount: Optional[Count(10 ** 9)] = None
    state: Optional[_State] = None


class _Condition(FileModel):
    type: Text(128)
    lastTransitionTime: Optional[Text(64)] = None


class _Status(FileModel):
    containerStatuses: Optional[list[_ContainerStatus]] = Field(default=None, max_length=256)
    conditions: Optional[list[_Condition]] = Field(default=None, max_length=256)


class PodFile(FileModel):
    """A pod as `kubectl get pod -o json` prints it (and the API serves it): the fields
    the timeline reads."""

    metadata: _Meta = _Meta()
    status: Optional[_Status] = None


def budgets_of(text: str, source: str) -> dict[str, int]:
    """The startup-budget annotation's JSON, bounded and typed; FileFormatError else."""
    return dict(validate(json_value(text, source, "startup budget"), StartupBudget, source).root)


def pod_of(data: Any, source: str = "the pod") -> PodFile:
    return data if isinstance(data, PodFile) else validate(data, PodFile, source)

# The measured phases, in order, each (name, start mark, end mark). vLLM's own start-up
# (imports, engine core and worker processes, device init) runs from the engine's start
# to "Starting to load model"; the weights load from there to "Loading weights took".
# The render budgets each (k3infra/serving/startup.py); a pod rendered before the
# startup budget existed has only "load", and its startup row shows no budget.
SPANS = (("pull", "scheduled", "container"),
         ("gate", "gate.start", "gate.end"),
         ("startup", "engine.start", "load.start"),
         ("load", "load.start", "load.end"),
         ("compile", "load.end", "graphs.end"),
         ("profiling", "graphs.end", "ready"))
# Rows that sum or span phases: (name, start mark, end mark, the budget they are held to).
TOTALS = (("engine (start -> ready)", "engine.start", "ready", "engine"),
          ("container start -> ready", "container", "ready", "probe"))
VLLM_MARKS = (("load.start", re.compile(r"Starting to load model")),
              ("load.end", re.compile(r"Loading weights took|Model loading took")),
              ("graphs.end", re.compile(r"Graph capturing finished")),
              ("ready", re.compile(r"Application startup complete")))
# vLLM's own figure for the load, when its start line is missing (older engines).
_LOAD_TOOK = re.compile(r"Loading weights took ([0-9.]+) s")
# A compile-cache hit or miss as vLLM logs it: 0.25.0's graph cache, and the AOT cache of
# later releases (0.32.0: "Directly load AOT compilation from path", a failed load
# "Compiling model again due to a load failure", a fresh compile "saved AOT compiled
# function to"; a loaded one is not saved again).
CACHE_HIT = re.compile(r"Directly load (?:the compiled graph|AOT compilation)")
CACHE_MISS = re.compile(r"Compiling a graph for|saved AOT compiled function to")
CACHE_LOAD_FAILED = re.compile(r"Compiling model again due to a load failure from \S+, reason: (.*)$")
_PHASE_LINE = re.compile(rf"{PHASE_PREFIX} name=(\S+) event=(\S+) ts=(\S+)")
_CACHE_LINE = re.compile(rf"{CACHE_PREFIX} key=(\S+)")
# vLLM's own stamp ("INFO 12-01 10:30:00 [file.py:1] ..."): whole seconds, no year.
_VLLM_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) "
                         r"(\d\d):(\d\d):(\d\d)\b")


def parse_time(text: str) -> datetime:
    """RFC 3339 as the API serves it (nanoseconds cut to microseconds); ValueError else."""
    if not isinstance(text, str) or len(text) > 64:
        raise ValueError(f"{str(text)[:64]!r}: not an RFC 3339 time")
    text = text.strip().replace("Z", "+00:00")
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(.*)$", text)
    if m:
        frac = (m.group(2) or "")[:7]
        text = m.group(1) + frac + (m.group(3) or "+00:00")
    return datetime.fromisoformat(text).astimezone(timezone.utc)


@dataclass
class Timeline:
    marks: dict[str, datetime] = field(default_factory=dict)
    budgets: dict[str, int] = field(default_factory=dict)
    cache_key: Optional[str] = None
    cache_hits: int = 0
    cache_misses: int = 0
    gate_failed: bool = False
    cache_load_failure: Optional[str] = None    # a cache was there, and vLLM could not load it

    def span(self, start: str, end: str) -> Optional[float]:
        if start in self.marks and end in self.marks:
            return (self.marks[end] - self.marks[start]).total_seconds()
        return None

    def seconds(self, phase: str) -> Optional[float]:
        _, start, end = next(s for s in SPANS if s[0] == phase)
        return self.span(start, end)

    @property
    def compile_cache(self) -> str:
        if self.cache_hits:
            return f"hit ({self.cache_hits} graph load(s) from the cache)"
        if self.cache_load_failure:
            return f"miss: the cache failed to load ({self.cache_load_failure}), compiled again"
        if self.cache_misses:
            return f"miss ({self.cache_misses} graph(s) compiled)"
        return "unknown (no compile line in the log)"

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """(phase, start, seconds, budget, verdict) for each phase, then the totals, each
        measured between its own marks (an engine without graph capture, such as
        --enforce-eager, still has its engine span)."""
        out = []
        for name, start, _end in SPANS:
            took = self.seconds(name)
            budget = self.budgets.get(name)
            at = self.marks.get(start)
            out.append((name, _stamp(at), _took(took), "-" if budget is None else str(budget),
                        verdict(took, budget)))
        for name, start, end, key in TOTALS:
            took, budget = self.span(start, end), self.budgets.get(key)
            out.append((name, _stamp(self.marks.get(start)), _took(took),
                        "-" if budget is None else str(budget), verdict(took, budget)))
        return out


def _stamp(at: Optional[datetime]) -> str:
    if at is None:
        return "-"
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _took(took: Optional[float]) -> str:
    # Tenths: the start-up and the load of a small model take seconds, not minutes.
    return "-" if took is None else f"{took:.1f}"


def verdict(took: Optional[float], budget: Optional[int]) -> str:
    if took is None:
        return "not recorded"
    if budget is None:
        return "no budget"
    share = took / budget if budget else float("inf")
    return f"{share:.0%} of budget" + (" OVER" if took > budget else "")


def _pod_time(text: str, where: str, what: str) -> datetime:
    try:
        return parse_time(text)
    except ValueError:
        raise FileFormatError(where, f"{what} {text[:64]!r} is not an RFC 3339 time") from None


def _container_start(status: _Status, container: str) -> tuple[Optional[str], int]:
    """(when the container's current run started, its restart count)."""
    for cs in status.containerStatuses or []:
        if cs.name != container or cs.state is None:
            continue
        for run in (cs.state.running, cs.state.terminated):
            if run is not None and run.startedAt:
                return run.startedAt, cs.restartCount or 0
    return None, 0


def _line_time(stamp: str, text: str, year: Optional[int]) -> Optional[datetime]:
    """When a log line was written: the log's own timestamp (`kubectl logs --timestamps`,
    sub-second), else vLLM's stamp (whole seconds) in the year of the start's k3-phase
    lines, else None (a stamp that is no date, such as 13-45, too)."""
    try:
        return parse_time(stamp)
    except ValueError:
        pass
    m = _VLLM_STAMP.search(f"{stamp} {text}")
    if m is None or year is None:
        return None
    month, day, hh, mm, ss = (int(g) for g in m.groups())
    try:
        return datetime(year, month, day, hh, mm, ss, tzinfo=timezone.utc)
    except ValueError:
        return None


def timeline(pod: dict, log: str, container: str = "vllm", year: Optional[int] = None) -> Timeline:
    """The last start of `container` in `pod` (a dict as the API serves it, or {} off a
    cluster) from its log. The log is read with timestamps where it has them (`kubectl
    logs --timestamps`); without them vLLM's own whole-second stamps are used. A log
    that holds several starts (a host's file) gives the last one, from its gate line.
    `year`: for vLLM's stamps when neither the pod nor a k3-phase line gives one."""
    t = Timeline()
    view = pod_of(pod)
    where = f"pod {view.metadata.name or '(unnamed)'}"
    annotations = view.metadata.annotations or {}
    if annotations.get(BUDGET_ANNOTATION):
        t.budgets = budgets_of(annotations[BUDGET_ANNOTATION],
                               f"{where}: annotation {BUDGET_ANNOTATION}")
    status = view.status or _Status()
    started, restarts = _container_start(status, container)
    if started:
        t.marks["container"] = _pod_time(started, where, "the container's startedAt")
    for cond in status.conditions or []:
        # The pull precedes the first start only: a restart finds the image on the node.
        if cond.type == "PodScheduled" and cond.lastTransitionTime and not restarts:
            t.marks["scheduled"] = _pod_time(cond.lastTransitionTime, where,
                                             "PodScheduled's lastTransitionTime")
    pod_marks = {k: t.marks[k] for k in ("container", "scheduled") if k in t.marks}
    year = t.marks["container"].year if "container" in t.marks else year
    load_took: Optional[float] = None
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        m = _PHASE_LINE.search(line)
        if m:
            name, event, ts = m.groups()
            try:
                at = parse_time(ts)
            except ValueError:
                continue          # not a start script's line (whatever else wrote it)
            if (name, event) == ("gate", "start"):        # a new start: forget the last
                t.marks, t.cache_hits, t.cache_misses = dict(pod_marks), 0, 0
                t.cache_load_failure = None
                t.gate_failed, load_took = False, None
            if event == "fail":
                t.gate_failed = True
            t.marks[f"{name}.{event}"] = at
            year = at.year
            continue
        m = _CACHE_LINE.search(line)
        if m:
            t.cache_key = m.group(1)
            continue
        failed = CACHE_LOAD_FAILED.search(text)
        if failed:
            t.cache_load_failure = failed.group(1).strip()
        elif CACHE_HIT.search(text):
            t.cache_hits += 1
        elif CACHE_MISS.search(text):
            t.cache_misses += 1
        took = _LOAD_TOOK.search(text)
        if took:
            try:
                value = float(took.group(1))
            except ValueError:
                value = None
            if value is not None and 0 <= value <= MAX_BUDGET_SECONDS:
                load_took = value
        for mark, pattern in VLLM_MARKS:
            if pattern.search(text):
                at = _line_time(stamp, text, year)
                # The first rank to start loading, the last to finish (TP ranks).
                if at is not None and not (mark == "load.start" and mark in t.marks):
                    t.marks[mark] = at
    if "load.start" not in t.marks and "load.end" in t.marks and load_took is not None:
        t.marks["load.start"] = t.marks["load.end"] - timedelta(seconds=load_took)
    if "container" not in t.marks and "gate.start" in t.marks:
        # Off a cluster with no pod status: the start script's first line is the start.
        t.marks["container"] = t.marks["gate.start"]
    return t


def off_cluster_pod(budgets: Optional[dict] = None, *, started: Optional[str] = None,
                    scheduled: Optional[str] = None, restarts: int = 0) -> dict:
    """A pod dict of what `k3infra startup --log` knows off a cluster: the budgets (the
    render's `k3infra.dev/startup-budget`), the container's start and the scheduling
    time when given."""
    pod: dict = {"metadata": {"annotations": {}}, "status": {}}
    if budgets:
        pod["metadata"]["annotations"][BUDGET_ANNOTATION] = json.dumps(budgets)
    if started:
        pod["status"]["containerStatuses"] = [{"name": "vllm", "restartCount": restarts,
                                               "state": {"running": {"startedAt": started}}}]
    if scheduled:
        pod["status"]["conditions"] = [{"type": "PodScheduled", "lastTransitionTime": scheduled}]
    return pod
