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
  "Application startup complete" (ready);
- the pod template's `k3infra.dev/startup-budget` annotation: the render's budgets.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

from k3infra.serving.start import CACHE_PREFIX, PHASE_PREFIX
from k3infra.serving.startup import BUDGET_ANNOTATION

# The measured phases, in order, each (name, start mark, end mark).
SPANS = (("pull", "scheduled", "container"),
         ("gate", "gate.start", "gate.end"),
         ("load", "engine.start", "load.end"),
         ("compile", "load.end", "graphs.end"),
         ("profiling", "graphs.end", "ready"))
VLLM_MARKS = (("load.end", re.compile(r"Loading weights took|Model loading took")),
              ("graphs.end", re.compile(r"Graph capturing finished")),
              ("ready", re.compile(r"Application startup complete")))
CACHE_HIT = re.compile(r"Directly load the compiled graph")
CACHE_MISS = re.compile(r"Compiling a graph for")
_PHASE_LINE = re.compile(rf"{PHASE_PREFIX} name=(\S+) event=(\S+) ts=(\S+)")
_CACHE_LINE = re.compile(rf"{CACHE_PREFIX} key=(\S+)")


def parse_time(text: str) -> datetime:
    """RFC 3339 as the API serves it (nanoseconds cut to microseconds)."""
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

    def seconds(self, phase: str) -> Optional[float]:
        _, start, end = next(s for s in SPANS if s[0] == phase)
        if start in self.marks and end in self.marks:
            return (self.marks[end] - self.marks[start]).total_seconds()
        return None

    @property
    def compile_cache(self) -> str:
        if self.cache_hits:
            return f"hit ({self.cache_hits} graph load(s) from the cache)"
        if self.cache_misses:
            return f"miss ({self.cache_misses} graph(s) compiled)"
        return "unknown (no compile line in the log)"

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """(phase, start, seconds, budget, verdict) for each phase, then the totals."""
        out = []
        for name, start, _end in SPANS:
            took, budget = self.seconds(name), self.budgets.get(name)
            at = self.marks.get(start)
            out.append((name, at.strftime("%Y-%m-%dT%H:%M:%SZ") if at else "-",
                        "-" if took is None else f"{took:.0f}",
                        "-" if budget is None else str(budget), verdict(took, budget)))
        engine = [self.seconds(p) for p in ("load", "compile", "profiling")]
        took = sum(engine) if None not in engine else None
        out.append(("engine (load+compile+profiling)", "-",
                    "-" if took is None else f"{took:.0f}",
                    str(self.budgets.get("engine", "-")), verdict(took, self.budgets.get("engine"))))
        if "container" in self.marks and "ready" in self.marks:
            total = (self.marks["ready"] - self.marks["container"]).total_seconds()
            out.append(("container start -> ready", "-", f"{total:.0f}",
                        str(self.budgets.get("probe", "-")), verdict(total, self.budgets.get("probe"))))
        return out


def verdict(took: Optional[float], budget: Optional[int]) -> str:
    if took is None:
        return "not recorded"
    if budget is None:
        return "no budget"
    share = took / budget if budget else float("inf")
    return f"{share:.0%} of budget" + (" OVER" if took > budget else "")


def _container_start(status: dict, container: str) -> tuple[Optional[str], int]:
    """(when the container's current run started, its restart count)."""
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != container:
            continue
        state = cs.get("state") or {}
        for key in ("running", "terminated"):
            if (state.get(key) or {}).get("startedAt"):
                return state[key]["startedAt"], int(cs.get("restartCount") or 0)
    return None, 0


def timeline(pod: dict, log: str, container: str = "vllm") -> Timeline:
    """The last start of `container` in `pod` (a dict as the API serves it) from its log
    (read with timestamps)."""
    t = Timeline()
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get(BUDGET_ANNOTATION):
        t.budgets = {k: int(v) for k, v in json.loads(annotations[BUDGET_ANNOTATION]).items()}
    status = pod.get("status") or {}
    started, restarts = _container_start(status, container)
    if started:
        t.marks["container"] = parse_time(started)
    for cond in status.get("conditions") or []:
        # The pull precedes the first start only: a restart finds the image on the node.
        if cond.get("type") == "PodScheduled" and cond.get("lastTransitionTime") and not restarts:
            t.marks["scheduled"] = parse_time(cond["lastTransitionTime"])
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        m = _PHASE_LINE.search(text)
        if m:
            name, event, ts = m.groups()
            if event == "fail":
                t.gate_failed = True
            t.marks[f"{name}.{event}"] = parse_time(ts)
            continue
        m = _CACHE_LINE.search(text)
        if m:
            t.cache_key = m.group(1)
            continue
        if CACHE_HIT.search(text):
            t.cache_hits += 1
        elif CACHE_MISS.search(text):
            t.cache_misses += 1
        for mark, pattern in VLLM_MARKS:
            if pattern.search(text):
                try:
                    t.marks[mark] = parse_time(stamp)      # the last one wins (TP ranks)
                except ValueError:
                    pass
    return t
