"""Serving starts only on verified weights: the StatefulSet waits for the prefetch Job,
and every serving pod re-verifies the tree in an init container before vLLM starts."""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

from pulumi_policy import (EnforcementLevel, PolicyResource, ReportViolation,
                           StackValidationArgs, StackValidationPolicy)

from k3infra.policies.drift import TREE_ENV
from k3infra.policies.workloads import Container, Workload, get, kind_of, workloads
from k3infra.receipt import load_receipt

_R = load_receipt()
LOCK_ENV = "K3_LOCK"
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
    want_volume = _mount_volume(server, model)
    for c in wl.containers():
        if not c.is_init or c.env_value(TREE_ENV) != model or LOCK_ENV not in c.env_names():
            continue
        if get(c.spec, "restartPolicy") == "Always":
            return (f"init container {c.name} is a sidecar (restartPolicy Always): it runs "
                    "alongside vLLM instead of before it")
        if want_volume is not None and _mount_volume(c, model) != want_volume:
            return (f"init container {c.name} verifies a different volume than the one "
                    f"{server.name} serves {model} from ({want_volume})")
        return None
    return (f"no init container verifies {model} ({TREE_ENV} and {LOCK_ENV}) before "
            f"{server.name} starts")


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
                 f"(which Pulumi awaits) for the model directory it serves, and each serving "
                 f"pod has an init container that re-verifies that tree and its lock before "
                 f"vLLM starts, so no pod ever loads a partial or altered copy of the "
                 f"{_R.model.size_gb:g} GB {_R.model.repo} tree."),
    validate=_serving_gate,
    enforcement_level=EnforcementLevel.MANDATORY,
)

POLICIES = [serving_gate]
