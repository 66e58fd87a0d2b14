"""`k3infra render --show`: every container of the serving pod, the prefetch Job(s) and the
benchmark Job as it will run (image, command and args with a script's steps line by line,
every env entry), each line with its origin.

The values are the rendered container's, what plan.json holds; the origins are the
builders' tags (k3infra/origin.py), recorded during the same render. Each rendered
container is paired with a tagged one whose projection it is (the same words and entries;
a value another resource gives, the built image's digest, counts as the same): none
found is an error, never a guess. Pure: (render) -> views -> lines.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from k3infra import naming
from k3infra.origin import ContainerSource, Origin

# The Jobs shown beside the serving pod, by their pods' component label.
JOB_COMPONENTS = (naming.PREFETCH_COMPONENT, naming.BENCHMARK_COMPONENT, naming.ROLLOUT_GATE_COMPONENT)
# A value longer than this, or of several lines, is shown by its size and digest (the
# bootstrap's source, the runtime pins); its origin names what it is.
INLINE_LIMIT = 160
ORIGIN_MARK = "  # "


class ViewError(Exception):
    """A rendered container that no builder tagged (or one whose tags disagree with it)."""


@dataclass(frozen=True)
class Line:
    value: Any          # a tuple of words, an env entry or the image, as rendered
    origin: Origin


@dataclass(frozen=True)
class ContainerView:
    workload: str       # "StatefulSet kimi-k3"
    role: str           # "container" | "init container"
    name: str
    image: Line
    command: tuple[Line, ...]
    args: tuple[Line, ...]
    env: tuple[Line, ...]

    def lines(self) -> list[str]:
        out = [f"{self.workload}: {self.role} {self.name}",
               f"  image {self.image.value}{ORIGIN_MARK}{self.image.origin}"]
        for title, parts in (("command", self.command), ("args", self.args)):
            if parts:
                out.append(f"  {title}")
                for line in parts:
                    out += _words_lines(line)
        if self.env:
            out.append("  env")
            out += [f"    {e.value['name']}={_env_value(e.value)}{ORIGIN_MARK}{e.origin}"
                    for e in self.env]
        return out


def _words_lines(line: Line) -> list[str]:
    """One line of words (shell-quoted as `sh` would read them); a script word is shown
    as <script> and its lines follow, indented."""
    scripts = [w for w in line.value if "\n" in w]
    shown = " ".join("<script>" if "\n" in w else shlex.quote(w) for w in line.value)
    out = [f"    {shown}{ORIGIN_MARK}{line.origin}"]
    for script in scripts:
        out += [f"      | {text}".rstrip() for text in script.rstrip("\n").split("\n")]
    return out


def _env_value(entry: dict) -> str:
    if "value" in entry:
        value = str(entry["value"])
        if "\n" in value or len(value) > INLINE_LIMIT:
            digest = hashlib.sha256(value.encode("utf-8")).hexdigest()
            return f"<{len(value.encode('utf-8'))} bytes, sha256 {digest[:16]}>"
        return value
    ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
    if ref is not None:
        return f"<secretKeyRef {ref.get('name')}/{ref.get('key')}>"
    return f"<valueFrom {json.dumps(entry.get('valueFrom'), sort_keys=True)}>"


def _pods(manifests: Iterable[dict]) -> list[tuple[str, dict]]:
    """(workload label, pod spec) of the serving workloads, then the prefetch Jobs, then
    the benchmark Job (each group by name: registration order is not stable)."""
    found: list[tuple[int, str, dict]] = []
    for m in manifests:
        kind, name = m.get("kind"), m.get("metadata", {}).get("name")
        spec = m.get("spec") or {}
        if kind == "StatefulSet":
            found.append((0, f"{kind} {name}", spec["template"]["spec"]))
        elif kind == "LeaderWorkerSet":
            templates = spec["leaderWorkerTemplate"]
            found += [(0, f"{kind} {name} ({role})", templates[f"{role}Template"]["spec"])
                      for role in ("leader", "worker") if f"{role}Template" in templates]
        elif kind == "Job":
            template = spec["template"]
            component = template.get("metadata", {}).get("labels", {}).get(
                "app.kubernetes.io/component")
            if component in JOB_COMPONENTS:
                found.append((1 + JOB_COMPONENTS.index(component), f"{kind} {name}",
                              template["spec"]))
    return [(label, pod) for _, label, pod in sorted(found, key=lambda f: f[:2])]


def _agrees(tagged: Any, rendered: Any) -> bool:
    """`rendered` is what `tagged` projects to; a leaf another resource gives (an
    Output in the builder's hands) agrees with any rendered value."""
    if isinstance(tagged, dict):
        return (isinstance(rendered, dict) and set(tagged) == set(rendered)
                and all(_agrees(v, rendered[k]) for k, v in tagged.items()))
    if isinstance(tagged, (list, tuple)):
        return (isinstance(rendered, (list, tuple)) and len(tagged) == len(rendered)
                and all(_agrees(a, b) for a, b in zip(tagged, rendered)))
    if tagged is None or isinstance(tagged, (str, int, float, bool)):
        return tagged == rendered
    return True


def _source_of(container: dict, sources: Iterable[ContainerSource]) -> Optional[ContainerSource]:
    rendered = {"image": container.get("image"), "command": container.get("command") or [],
                "args": container.get("args") or [], "env": container.get("env") or []}
    return next((s for s in sources
                 if s.name == container.get("name") and _agrees(s.projection(), rendered)),
                None)


def _view(workload: str, role: str, container: dict, source: ContainerSource) -> ContainerView:
    def split(parts, words: list) -> tuple[Line, ...]:
        lines, at = [], 0
        for part in parts:
            lines.append(Line(tuple(words[at:at + len(part.value)]), part.origin))
            at += len(part.value)
        return tuple(lines)

    return ContainerView(
        workload, role, container["name"], Line(container.get("image"), source.image.origin),
        split(source.command, container.get("command") or []),
        split(source.args, container.get("args") or []),
        tuple(Line(e, p.origin) for e, p in zip(container.get("env") or [], source.env)))


def container_views(render) -> list[ContainerView]:
    """Every container of the serving pod(s), the prefetch Job(s) and the benchmark Job
    of `render` (a k3infra.render.Render), init containers first, as the kubelet runs them."""
    views = []
    for workload, pod in _pods(render.manifests()):
        for role, key in (("init container", "initContainers"), ("container", "containers")):
            for c in pod.get(key) or []:
                source = _source_of(c, render.sources)
                if source is None:
                    raise ViewError(f"{workload}: {role} {c.get('name')} has no origins: no "
                                    "builder tagged a container that renders as this one "
                                    "(k3infra.origin.container)")
                views.append(_view(workload, role, c, source))
    return views


def show(render, receipt_id: str, profile: str, only: str = "") -> list[str]:
    """What `k3infra render --show [ONLY]` prints: a header, then each container's lines
    (only those named `only`, when given)."""
    views = container_views(render)
    if only:
        names = sorted({v.name for v in views})
        views = [v for v in views if v.name == only]
        if not views:
            raise ViewError(f"--show {only}: no container of that name; accepted: "
                            f"{', '.join(names)}")
    out = [f"stack {render.stack}, receipt {receipt_id}, profile {profile}: each line as it "
           "will run, then # where it comes from"]
    for v in views:
        out += ["", *v.lines()]
    return out
