"""Policies on a multi-node replica (k3:topology = multi-node, a LeaderWorkerSet; NOT the
measured configuration): the receipt's exact serve line plus exactly vLLM's multi-node
arguments, and both pods held inside one NVLink domain with a ComputeDomain channel."""
from __future__ import annotations

from pulumi_policy import (EnforcementLevel, ReportViolation, ResourceValidationArgs,
                           ResourceValidationPolicy)

from k3infra import topology
from k3infra.policies import stack_config
from k3infra.policies.serve_args import serve_drift
from k3infra.policies.workloads import LEADER_WORKER_SET, Workload, get, items, workloads
from k3infra.serving.group import multi_node_args

_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs
_NOT_MEASURED = "multi-node, NOT the measured configuration: "
_RANKS = {"leader": 0, "worker": 1}


def _multi_node_text() -> str:
    leader = " ".join(multi_node_args(topology.NODES_PER_REPLICA, 0))
    worker = " ".join(multi_node_args(topology.NODES_PER_REPLICA, 1))
    return f"leader `{leader}`, worker `{worker}`"


def _groups(args: ResourceValidationArgs) -> list[Workload]:
    return [wl for wl in workloads(args.resource_type, args.props)
            if wl.kind == LEADER_WORKER_SET and wl.is_serving]


# --- serve flags ----------------------------------------------------------------------------

def _serve_flags(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for wl in _groups(args):
        # No profile exemption: k3:profile custom is refused with multi-node (topology.py).
        tail = multi_node_args(topology.NODES_PER_REPLICA, _RANKS[wl.role])
        for c in wl.vllm_servers():
            tokens = list(c.serve_tokens() or [])
            where = f"{wl.kind} {wl.name} {wl.role} container {c.name}: {_NOT_MEASURED}"
            if tokens[-len(tail):] != tail:
                report(f"{where}the serve line must end with exactly `{' '.join(tail)}` "
                       f"(vLLM's multiprocessing backend, node {_RANKS[wl.role]} of "
                       f"{topology.NODES_PER_REPLICA}); found `{' '.join(tokens[-len(tail):])}`",
                       None)
                continue
            for problem in serve_drift(_receipt(), tokens[:-len(tail)], c.env(),
                                       bool(items(get(c.spec, "envFrom")))):
                report(f"{where}{problem}", None)


serve_flags_multi_node = ResourceValidationPolicy(
    name="k3-serve-flags-multi-node",
    description=("Both pods of a multi-node replica (LeaderWorkerSet) run the receipt's engine "
                 f"path exactly (`{' '.join(_receipt().serve.engine_arg_tokens())}`, receipt {_receipt().id}), "
                 "as k3-serve-flags requires of a single node, and then exactly "
                 f"vLLM's multi-node arguments: {_multi_node_text()}. Mandatory: a multi-node "
                 "replica is not the measured configuration, but nothing else may change."),
    validate=_serve_flags,
    enforcement_level=EnforcementLevel.MANDATORY,
)


# --- one NVLink domain ------------------------------------------------------------------------

def _requires_label(wl: Workload, key: str) -> bool:
    """Every required node-selector term asks for node label `key` to exist."""
    terms = items(get(wl.pod_spec, "affinity", "nodeAffinity",
                      "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"))
    return bool(terms) and all(
        any(get(e, "key") == key and get(e, "operator") in ("Exists", "In")
            for e in items(get(t, "matchExpressions"))) for t in terms)


def _beside_leader(wl: Workload, key: str) -> bool:
    terms = items(get(wl.pod_spec, "affinity", "podAffinity",
                      "requiredDuringSchedulingIgnoredDuringExecution"))
    return any(get(t, "topologyKey") == key for t in terms)


def _claims_channel(wl: Workload) -> list[str]:
    """What is missing for the pod's ComputeDomain channel ([] when it has one)."""
    claims = {str(get(rc, "name")): rc for rc in items(get(wl.pod_spec, "resourceClaims"))}
    templated = [n for n, rc in claims.items() if get(rc, "resourceClaimTemplateName")]
    if not templated:
        return ["no resourceClaims entry with a resourceClaimTemplateName (the ComputeDomain's "
                "channel: without IMEX the trays share no GPU memory over NVLink)"]
    missing = []
    for c in wl.vllm_servers():
        used = {str(get(x, "name")) for x in items(get(c.spec, "resources", "claims"))}
        if not used & set(templated):
            missing.append(f"container {c.name} claims none of {templated} in resources.claims")
    return missing


def _nvlink_domain(args: ResourceValidationArgs, report: ReportViolation) -> None:
    label = stack_config.multi_node_domain_label()
    for wl in _groups(args):
        where = f"{wl.kind} {wl.name} {wl.role}"
        if not _requires_label(wl, label):
            report(f"{where}: no required node affinity on the NVLink domain label {label!r}: "
                   "the pods of one replica could land outside a multi-node NVLink domain "
                   "(set k3:multiNode.domainLabel to the label your nodes carry)", None)
        if wl.role == "worker" and not _beside_leader(wl, label):
            report(f"{where}: no required pod affinity to its leader with topologyKey "
                   f"{label!r}: the worker could land in another NVLink domain than the leader",
                   None)
        for problem in _claims_channel(wl):
            report(f"{where}: {problem}", None)


nvlink_domain = ResourceValidationPolicy(
    name="k3-nvlink-domain",
    description=("Both pods of a multi-node replica require the NVLink domain label "
                 "(k3:multiNode.domainLabel, default nvidia.com/gpu.clique), the worker lands in "
                 "its leader's domain (pod affinity on that label), and every pod claims its "
                 "ComputeDomain's IMEX channel: the receipt's TP8+EP world, "
                 f"{_receipt().residency.weights_gib_per_gpu:.2f} GiB of weights per GPU, split over "
                 "two trays needs one NVLink domain, never the network between racks."),
    validate=_nvlink_domain,
    enforcement_level=EnforcementLevel.MANDATORY,
)

POLICIES = [serve_flags_multi_node, nvlink_domain]
