"""Serving starts only on verified weights: the StatefulSet waits for the prefetch Job,
and every start of a vLLM container (restarts included) runs the weights gate first, in
the same container, against the digest the stack pins."""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

from pulumi_policy import (EnforcementLevel, PolicyResource, ReportViolation,
                           StackValidationArgs, StackValidationPolicy)

from k3infra.policies.drift import TREE_ENV
from k3infra.policies.workloads import Container, Workload, get, kind_of, workloads

from k3infra.policies import stack_config
_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs
GATE_LOCK_ENV = "K3_GATE_LOCK"
# pulumi-kubernetes waits for a Job to complete unless this annotation says not to.
SKIP_AWAIT = "pulumi.com/skipAwait"


def _closure(res: PolicyResource, children: dict[str, list[PolicyResource]]) -> list[PolicyResource]:
    """Everything `res` waits for: its dependencies, theirs, and (as the engine does for a
    component) every child of a component it depends on."""
    seen: dict[str, PolicyResource] = {}
    todo = list(res.dependencies)
    while todo:
        dep = todo.pop()
        if dep.urn in seen:
            continue
        seen[dep.urn] = dep
        todo += list(dep.dependencies) + children.get(dep.urn, [])
    return list(seen.values())


def _prefetch_trees(res: PolicyResource) -> list[str]:
    """K3_TREE of the weights containers of a Job that Pulumi waits for."""
    if kind_of(res.resource_type) != "Job":
        return []
    if str(get(res.props, "metadata", "annotations", SKIP_AWAIT, default="")).lower() == "true":
        return []
    return [c.env_value(TREE_ENV) for wl in workloads(res.resource_type, res.props)
            for c in wl.containers() if c.env_value(TREE_ENV)]


def _mount_volume(c: Container, path: str) -> Optional[str]:
    """The volume backing `path` in container `c` (longest mountPath prefix)."""
    best, name = -1, None
    for m in c.mounts():
        mp = str(get(m, "mountPath", default="")).rstrip("/")
        if (path == mp or path.startswith(mp + "/")) and len(mp) > best:
            best, name = len(mp), str(get(m, "name"))
    return name


def _gate_problem(wl: Workload, server: Container, model: str) -> Optional[str]:
    """None when `server` runs the gate on `model` before `vllm serve` in its own
    command (an init container would not run again when the container restarts)."""
    words = server.tokens()
    serve_at = next((i for i, w in enumerate(words)
                     if w.endswith("vllm") and i + 1 < len(words) and words[i + 1] == "serve"),
                    len(words))
    if "gate" not in words[:serve_at]:
        return (f"{server.name} does not run the weights gate before `vllm serve` in its own "
                "command: a restart of the container would load unverified weights")
    if server.env_value(TREE_ENV) != model or GATE_LOCK_ENV not in server.env_names():
        return (f"{server.name}'s gate does not verify {model} ({TREE_ENV} and "
                f"{GATE_LOCK_ENV}) before it starts")
    for m in server.mounts():
        if str(get(m, "name")) == _mount_volume(server, model) and not get(m, "readOnly"):
            return f"{server.name} mounts the weights at {model} writable; it must be read-only"
    return None


def _serving_gate(args: StackValidationArgs, report: ReportViolation) -> None:
    children: dict[str, list[PolicyResource]] = defaultdict(list)
    for res in args.resources:
        if res.parent is not None:
            children[res.parent.urn].append(res)
    for res in args.resources:
        for wl in workloads(res.resource_type, res.props):
            for server in wl.vllm_servers():
                model = (server.serve_tokens() or [""])[0]
                trees = {t for dep in _closure(res, children) for t in _prefetch_trees(dep)}
                if model not in trees:
                    found = f" (it waits for Jobs fetching {sorted(trees)})" if trees else ""
                    report(f"{wl.kind} {wl.name}: does not depend on a prefetch Job that "
                           f"fetches and verifies {model}{found}; pods would start on "
                           "missing or partial weights", res.urn)
                problem = _gate_problem(wl, server, model)
                if problem:
                    report(f"{wl.kind} {wl.name}: {problem}", res.urn)


serving_gate = StackValidationPolicy(
    name="k3-serving-gate",
    description=(f"Serving waits for the weights: the StatefulSet depends on the prefetch Job "
                 f"(which Pulumi awaits) for the model directory it serves, and every vLLM "
                 f"container runs the weights gate in its own command before `vllm serve` "
                 f"(so on restarts too), on a read-only mount, so no engine start ever loads "
                 f"a partial or altered copy of the {_receipt().model.size_gb:g} GB {_receipt().model.repo} "
                 f"tree."),
    validate=_serving_gate,
    enforcement_level=EnforcementLevel.MANDATORY,
)

POLICIES = [serving_gate]
