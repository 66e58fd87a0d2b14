"""Policies that refuse drift from the receipt: serve flags and env, weights revision,
weights tree digest, and the receipt labels on serving pods."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Callable, Optional

from pulumi_policy import (EnforcementLevel, ReportViolation, ResourceValidationArgs,
                           ResourceValidationPolicy, StackValidationArgs, StackValidationPolicy)

from k3infra.config import COMMIT_RE
from k3infra.policies import stack_config
from k3infra.policies.serve_args import serve_drift
from k3infra.policies.workloads import (LEADER_WORKER_SET, PROFILE_ANNOTATION, get, items, kind_of,
                                        workloads)
from k3infra.serving.manifests import RECEIPT_SHA_ANNOTATION
from k3infra.weights.manifests import LOCK_KEY, WeightsLayout

_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs
REVISION_ANNOTATION = "k3infra.dev/weights-revision"
DIGEST_ANNOTATION = "k3infra.dev/tree-digest"
# The weights runtime's contract with its containers (k3infra/weights/manifests.py).
TREE_ENV, REVISION_ENV, REPO_ENV, EXPECT_DIGEST_ENV = (
    "K3_TREE", "K3_REVISION", "K3_REPO", "K3_EXPECT_TREE_DIGEST")


def _measured_text() -> str:
    env = " ".join(f"{e.name}={e.value}" for e in _receipt().serve.engine_env)
    return (f"`vllm serve <model> {' '.join(_receipt().serve.engine_arg_tokens())}` with {env}, in that "
            f"order (receipt {_receipt().id}, engine {_receipt().engine.version} @ {_receipt().engine.commit})")


# --- serve flags and env --------------------------------------------------------------

def _serve_flags(custom: bool) -> Callable[[ResourceValidationArgs, ReportViolation], None]:
    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        for wl in workloads(args.resource_type, args.props):
            if wl.kind == LEADER_WORKER_SET:
                continue        # a multi-node group: k3infra/policies/multinode.py
            if wl.is_serving and (stack_config.effective_profile(
                    wl.annotation(PROFILE_ANNOTATION)) == "custom") != custom:
                continue
            for c in wl.vllm_servers():
                problems = serve_drift(_receipt(), c.serve_tokens() or [], c.env(),
                                       bool(items(get(c.spec, "envFrom"))))
                for problem in problems:
                    prefix = ("profile custom, NOT the measured configuration: " if custom
                              else "")
                    report(f"{wl.kind} {wl.name} container {c.name}: {prefix}{problem}", None)
    return validate


serve_flags = ResourceValidationPolicy(
    name="k3-serve-flags",
    description=(f"Every vLLM server runs the receipt's engine path exactly: {_measured_text()}; "
                 "beyond it only the receipt's allow-listed surface flags and env. Mandatory "
                 "for the measured and upstream profiles."),
    validate=_serve_flags(custom=False),
    enforcement_level=EnforcementLevel.MANDATORY,
)

serve_flags_custom = ResourceValidationPolicy(
    name="k3-serve-flags-custom",
    description=(f"A stack with profile custom may change the engine path; every change from "
                 f"{_measured_text()} is listed so the deployment is never mistaken for the "
                 "measured one. Advisory: profile custom is an explicit choice."),
    validate=_serve_flags(custom=True),
    enforcement_level=EnforcementLevel.ADVISORY,
)


# --- receipt labels on serving pods ---------------------------------------------------

def _receipt_annotations(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for wl in workloads(args.resource_type, args.props):
        if not wl.is_serving:
            continue
        profile = stack_config.effective_profile(wl.annotation(PROFILE_ANNOTATION))
        # An upstream image is not built from the receipt's commit and must not say so.
        expected = {"k3infra.dev/receipt": _receipt().id,
                    "k3infra.dev/engine-commit":
                        None if profile == "upstream" else _receipt().engine.commit,
                    "k3infra.dev/weights-repo": _receipt().model.repo,
                    # A multi-node group is never the measured configuration.
                    "k3infra.dev/measured-configuration":
                        "true" if (profile == "measured" and wl.kind != LEADER_WORKER_SET
                                   and not _receipt().is_candidate)
                        else "false"}
        # The workload names the receipt it was built from by content: a pack that finds
        # another receipt (its own k3:receipt lookup, K3INFRA_RECEIPT) never judges it.
        built_from = get(wl.metadata, "annotations", RECEIPT_SHA_ANNOTATION)
        if built_from != _receipt().sha256():
            report(f"{wl.kind} {wl.name}: annotation {RECEIPT_SHA_ANNOTATION} is {built_from!r}, "
                   f"but the stack's receipt {_receipt().id} (k3:receipt) has sha256 "
                   f"{_receipt().sha256()!r}: the workload was built from another receipt", None)
        for key, want in expected.items():
            found = get(wl.pod_metadata, "annotations", key)
            if key == "k3infra.dev/engine-commit" and want is not None:
                if not _receipt().engine.is_commit(found):
                    report(f"{wl.kind} {wl.name}: pod annotation {key} is {found!r}, expected "
                           f"{want!r} or the full commit starting with it (profile {profile})", None)
            elif found != want:
                report(f"{wl.kind} {wl.name}: pod annotation {key} is {found!r}, expected "
                       f"{want!r} (profile {profile})", None)


receipt_annotations = ResourceValidationPolicy(
    name="k3-receipt-annotations",
    description=(f"Serving pods carry the receipt they reproduce (k3infra.dev/receipt = {_receipt().id}, "
                 f"engine commit {_receipt().engine.commit} unless upstream, weights repo "
                 f"{_receipt().model.repo}) and say "
                 "honestly whether they are the measured configuration: `k3infra verify` and "
                 "operators read these labels."),
    validate=_receipt_annotations,
    enforcement_level=EnforcementLevel.MANDATORY,
)


# --- weights revision -------------------------------------------------------------------

def _lock(props: Mapping) -> Optional[dict]:
    text = get(props, "data", LOCK_KEY)
    if not isinstance(text, str):
        return None
    try:
        lock = json.loads(text)
    except json.JSONDecodeError:
        return {"unparseable": True}
    return lock if isinstance(lock, dict) else {"unparseable": True}


def _revision_sightings(args: StackValidationArgs) -> list[tuple[str, str, str]]:
    """(urn, where, revision) for every place the stack names the weights revision."""
    repo_dir = WeightsLayout(_receipt().model.repo, "x").repo_dir
    out = []
    for res in args.resources:
        if kind_of(res.resource_type) == "ConfigMap":
            lock = _lock(res.props)
            if lock is not None:
                out.append((res.urn, f"ConfigMap {get(res.props, 'metadata', 'name')} "
                            f"{LOCK_KEY} revision", str(lock.get("revision"))))
        for wl in workloads(res.resource_type, res.props):
            found = wl.annotation(REVISION_ANNOTATION)
            if found is not None:
                out.append((res.urn, f"{wl.kind} {wl.name} annotation {REVISION_ANNOTATION}",
                            found))
            for c in wl.containers():
                rev = c.env_value(REVISION_ENV)
                if rev is not None:
                    out.append((res.urn, f"{wl.kind} {wl.name} container {c.name} env "
                                f"{REVISION_ENV}", rev))
                repo = c.env_value(REPO_ENV)
                if repo is not None and repo != _receipt().model.repo:
                    out.append((res.urn, f"{wl.kind} {wl.name} container {c.name} env "
                                f"{REPO_ENV} = {repo!r}, not the receipt's {_receipt().model.repo}", ""))
                tokens = c.serve_tokens()
                if tokens:
                    model = tokens[0]
                    parent, _, rev = model.rpartition("/")
                    where = f"{wl.kind} {wl.name} container {c.name} model directory {model!r}"
                    if parent != repo_dir:
                        out.append((res.urn, f"{where} is not under {repo_dir} (the receipt's "
                                    f"{_receipt().model.repo})", ""))
                    else:
                        out.append((res.urn, where, rev))
    return out


def _weights_revision(args: StackValidationArgs, report: ReportViolation) -> None:
    sightings = _revision_sightings(args)
    for urn, where, rev in sightings:
        if not COMMIT_RE.match(rev):
            report(f"{where}: {rev!r} is not a 40-hex commit" if rev else where, urn)
    pinned = {rev for _, _, rev in sightings if COMMIT_RE.match(rev)}
    if len(pinned) > 1:
        for urn, where, rev in sightings:
            report(f"{where} = {rev}: the stack names {len(pinned)} different revisions "
                   f"({', '.join(sorted(pinned))}); weights, gate and server must be one commit",
                   urn)


weights_revision = StackValidationPolicy(
    name="k3-weights-revision",
    description=(f"The weights are {_receipt().model.repo} at one 40-hex Hub commit everywhere (prefetch "
                 "Job, verifying gate, model directory, lock, annotations). The receipt does "
                 "not publish its commit, so a deployer pins one; a branch such as `main` moves "
                 "and would serve bytes nobody measured."),
    validate=_weights_revision,
    enforcement_level=EnforcementLevel.MANDATORY,
)


# --- weights tree digest ---------------------------------------------------------------

def _stack_profile(args: StackValidationArgs) -> str:
    annotations = [wl.annotation(PROFILE_ANNOTATION) for res in args.resources
                   for wl in workloads(res.resource_type, res.props) if wl.is_serving]
    profiles = {stack_config.effective_profile(a) for a in annotations} or {
        stack_config.effective_profile(None)}
    return "custom" if profiles == {"custom"} else next(p for p in sorted(profiles)
                                                        if p != "custom")


def _digest_problems(args: StackValidationArgs) -> list[tuple[str, str]]:
    want = _receipt().model.tree_digest
    problems = []
    weights_containers = 0
    for res in args.resources:
        if kind_of(res.resource_type) == "ConfigMap":
            lock = _lock(res.props)
            if lock is not None and lock.get("tree_digest") != want:
                problems.append((res.urn, f"ConfigMap {get(res.props, 'metadata', 'name')} "
                                 f"{LOCK_KEY}: tree_digest {lock.get('tree_digest')!r} != "
                                 f"receipt {want}"))
        for wl in workloads(res.resource_type, res.props):
            found = wl.annotation(DIGEST_ANNOTATION)
            if found is not None and found != want:
                problems.append((res.urn, f"{wl.kind} {wl.name} annotation {DIGEST_ANNOTATION} "
                                 f"= {found!r} != receipt {want}"))
            for c in wl.containers():
                if TREE_ENV not in c.env_names():
                    continue
                weights_containers += 1
                found = c.env_value(EXPECT_DIGEST_ENV)
                if found != want:
                    problems.append((res.urn, f"{wl.kind} {wl.name} container {c.name}: env "
                                     f"{EXPECT_DIGEST_ENV} = {found!r}, expected receipt "
                                     f"{want}: the weights would be accepted unchecked"))
    return problems


def _tree_digest(custom: bool) -> Callable[[StackValidationArgs, ReportViolation], None]:
    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        if (_stack_profile(args) == "custom") != custom:
            return
        for urn, problem in _digest_problems(args):
            report(("profile custom, NOT the measured tree: " if custom else "") + problem, urn)
    return validate


tree_digest = StackValidationPolicy(
    name="k3-tree-digest",
    description=(f"Every weights container (prefetch Job, serving gate) verifies the tree "
                 f"against the receipt's published digest {_receipt().model.tree_digest} "
                 f"({_receipt().model.shards} {_receipt().model.shard_format} shards, {_receipt().model.size_gb:g} GB), "
                 "and a shipped lock and the pod annotations carry the same digest. Mandatory "
                 "for the measured and upstream profiles."),
    validate=_tree_digest(custom=False),
    enforcement_level=EnforcementLevel.MANDATORY,
)

tree_digest_custom = StackValidationPolicy(
    name="k3-tree-digest-custom",
    description=(f"A stack with profile custom may serve another weights tree; where it does "
                 f"not check the receipt's digest {_receipt().model.tree_digest} this is listed. "
                 "Advisory: profile custom is an explicit choice."),
    validate=_tree_digest(custom=True),
    enforcement_level=EnforcementLevel.ADVISORY,
)

POLICIES = [serve_flags, serve_flags_custom, receipt_annotations, weights_revision,
            tree_digest, tree_digest_custom]
