"""Objects the serving pods need around them: a NetworkPolicy that closes their port to
everyone not allowed, and a PodDisruptionBudget; plus the licence acknowledgement."""
from __future__ import annotations

from typing import Callable

from pulumi_policy import (EnforcementLevel, PolicyResource, ReportViolation,
                           StackValidationArgs, StackValidationPolicy)

from k3infra.gates import license_text
from k3infra.policies import host, stack_config
from k3infra.policies.workloads import Workload, get, items, kind_of, label_selector_matches, workloads
from k3infra.receipt import NOTHING_MEASURED

_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs


def _serving(args: StackValidationArgs) -> list[tuple[PolicyResource, Workload]]:
    return [(res, wl) for res in args.resources
            for wl in workloads(res.resource_type, res.props) if wl.is_serving]


def _in_namespace(res: PolicyResource, namespace: str) -> bool:
    return str(get(res.props, "metadata", "namespace", default="default")) == namespace


def _restricts_ingress(netpol: PolicyResource) -> bool:
    """Ingress is in policyTypes (the default when it is omitted) and no rule admits
    every source (an empty rule `{}` allows all traffic)."""
    types = [str(t) for t in items(get(netpol.props, "spec", "policyTypes"))] or ["Ingress"]
    if "Ingress" not in types:
        return False
    for rule in items(get(netpol.props, "spec", "ingress")):
        if not items(get(rule, "from")):
            return False
    return True


def _selecting(kind: str, selector: Callable[[PolicyResource], object],
               extra: Callable[[PolicyResource], bool] = lambda _: True):
    def find(args: StackValidationArgs, wl: Workload) -> list[PolicyResource]:
        return [res for res in args.resources
                if kind_of(res.resource_type) == kind and _in_namespace(res, wl.namespace)
                and label_selector_matches(selector(res), wl.labels()) and extra(res)]
    return find


_netpols = _selecting("NetworkPolicy", lambda r: get(r.props, "spec", "podSelector"),
                      _restricts_ingress)
_pdbs = _selecting("PodDisruptionBudget", lambda r: get(r.props, "spec", "selector"))


def _network_policy(args: StackValidationArgs, report: ReportViolation) -> None:
    for res, wl in _serving(args):
        if not _netpols(args, wl):
            report(f"{wl.kind} {wl.name}: no NetworkPolicy in namespace {wl.namespace} selects "
                   "its pods and restricts ingress; its port is open to every "
                   "pod in the cluster", res.urn)


network_policy = StackValidationPolicy(
    name="k3-network-policy",
    description=("A NetworkPolicy selects the serving pods and restricts ingress (no rule that "
                 "admits every source): the OpenAI-compatible port serves "
                 f"{_receipt().model.repo} to anyone who can reach it, and /health and /metrics stay "
                 "open even with an API key."),
    validate=_network_policy,
    enforcement_level=EnforcementLevel.MANDATORY,
)


def _budget_problem(pdb: PolicyResource) -> str | None:
    """Why a budget lets a drain take every serving pod at once (None when it does not):
    the builder's is maxUnavailable 1; a percentage of 100, or minAvailable 0, is none."""
    spec = get(pdb.props, "spec") or {}
    name = get(pdb.props, "metadata", "name")
    most, least = get(spec, "maxUnavailable"), get(spec, "minAvailable")
    def percent(v):
        return int(v[:-1]) if isinstance(v, str) and v.endswith("%") and v[:-1].isdigit() else None
    if most is not None and (percent(most) is not None and percent(most) >= 100
                             or isinstance(most, int) and most > 1):
        return f"PodDisruptionBudget {name} allows maxUnavailable {most!r}; one replica at a time"
    if least is not None and (least == 0 or percent(least) == 0):
        return f"PodDisruptionBudget {name} keeps minAvailable {least!r}: no replica is protected"
    if most is None and least is None:
        return f"PodDisruptionBudget {name} sets neither maxUnavailable nor minAvailable"
    return None


def _disruption_budget(args: StackValidationArgs, report: ReportViolation) -> None:
    for res, wl in _serving(args):
        found = _pdbs(args, wl)
        if not found:
            report(f"{wl.kind} {wl.name}: no PodDisruptionBudget in namespace {wl.namespace} "
                   "selects its pods", res.urn)
        for pdb in found:
            problem = _budget_problem(pdb)
            if problem:
                report(f"{wl.kind} {wl.name}: {problem}", res.urn)


disruption_budget = StackValidationPolicy(
    name="k3-disruption-budget",
    description=("A PodDisruptionBudget covers the serving pods: each is a whole "
                 f"{_receipt().measured_gpu.gpus_per_node}-GPU node that takes the "
                 f"{_receipt().model.size_gb:g} GB weights load and graph capture to come back, so a "
                 "node drain must not take several replicas at once (maxUnavailable 1; no "
                 "100 % or minAvailable 0)."),
    validate=_disruption_budget,
    enforcement_level=EnforcementLevel.MANDATORY,
)


def _license(args: StackValidationArgs, report: ReportViolation) -> None:
    # A cluster's serving workloads or a Docker host's serving container: both serve the weights.
    if not _serving(args) and not any(host.serves(r.resource_type, r.props) for r in args.resources):
        return
    if not stack_config.license_accepted():
        report(f"k3:acceptModelLicense is not true. {license_text(_receipt())}", None)


license_acknowledged = StackValidationPolicy(
    name="k3-license-acknowledged",
    description=(f"The stack acknowledges the {_receipt().license.name} (k3:acceptModelLicense): "
                 f"{_receipt().license.thresholds_text()}. Advisory: the acknowledgement is the "
                 "deployer's statement, and `pulumi up` already refuses without it."),
    validate=_license,
    enforcement_level=EnforcementLevel.ADVISORY,
)

def _candidate(args: StackValidationArgs, report: ReportViolation) -> None:
    r = _receipt()
    if r.is_candidate and (_serving(args) or any(host.serves(x.resource_type, x.props)
                                                 for x in args.resources)):
        report(f"receipt {r.id} (k3:receipt) is a candidate: {NOTHING_MEASURED} (flags from "
               f"{r.source}); its serving pods run an unmeasured flag set until `k3infra bench "
               "receipt` measures it into a receipt the stack names", None)


receipt_measured = StackValidationPolicy(
    name="k3-receipt-measured",
    description=(f"The stack's receipt (k3:receipt; here {_receipt().id}, "
                 f"{_receipt().standing()}) is measured: a candidate receipt's figures are not "
                 "known yet, so every judgement against them is said to be missing. Advisory: "
                 "trying a candidate on your own nodes is how it gets measured."),
    validate=_candidate,
    enforcement_level=EnforcementLevel.ADVISORY,
)

POLICIES = [network_policy, disruption_budget, license_acknowledged, receipt_measured]
