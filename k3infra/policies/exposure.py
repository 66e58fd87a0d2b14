"""k3-network-exposure: what each pod of the stack may reach, and what may reach it, after
every NetworkPolicy in the plan is applied (the effective exposure), held to what the
stack's own config admits. Not the shape of a rule: a rule widened to every namespace,
to 0.0.0.0/0, to every port, or a policy removed so a pod is no longer isolated, all
change the effective exposure, whichever object carries the change.

How: for a pod template and a direction, the effective set is the union of the (peer,
port) pairs of every NetworkPolicy in its namespace that selects it for that direction
(none selecting it: everything, as Kubernetes has it). The stack's own policies are
rebuilt from its `k3:*` config by the builders that render them
(k3infra.operations.network, k3infra.gateway.network); a pair the plan admits that no
pair of the rebuilt set covers is a violation. Covering is by semantics:
- a peer without a selector or block admits everything; it is covered only by the same;
- ipBlocks: the addresses of one (its cidr minus its excepts) within the other's;
- pod/namespace selectors: every requirement of the wider one implied by the narrower
  one (matchLabels and matchExpressions); a peer without namespaceSelector is the
  policy's own namespace, `namespaceSelector: {}` every namespace;
- ports: protocol, number or name, and endPort ranges; no ports is every port.
An ipBlock is never taken to cover pods or the reverse (CNIs differ on pod IPs).

A config that does not parse (a program embedding K3ServingStack under another project,
with no `k3:*` keys) has no rebuilt set: then the serving pods are held to the fixed
rule that nothing admits every source, every namespace or a /0 block to them.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from pulumi_policy import (EnforcementLevel, PolicyResource, ReportViolation,
                           StackValidationArgs, StackValidationPolicy)

from k3infra import naming
from k3infra.gateway.names import GatewayNames
from k3infra.gateway.network import picker_policy
from k3infra.netpol import NAMESPACE_NAME_LABEL
from k3infra.operations.network import network_policies
from k3infra.policies import stack_config
from k3infra.policies.workloads import (Workload, as_int, get, items, kind_of,
                                        label_selector_matches, mapping, workloads)

_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs

INSTANCE_LABEL = "app.kubernetes.io/instance"
DIRECTIONS = (("Ingress", "ingress", "from"), ("Egress", "egress", "to"))
_SHOWN = 3      # offending pairs named per pod and direction


class _Unreadable(ValueError):
    """A peer or port the policy cannot read: judged as admitting everything."""


Requirement = tuple[str, str, frozenset]


@dataclass(frozen=True)
class Peer:
    kind: str                                   # "any" | "ip" | "pods"
    net: Any = None                             # ip: the block
    excepts: tuple = ()
    namespaces: frozenset = frozenset()         # pods: requirements on the namespace
    pods: frozenset = frozenset()               # pods: requirements on the pod

    def __str__(self) -> str:
        if self.kind == "any":
            return "every source/destination"
        if self.kind == "ip":
            cut = f" except {', '.join(map(str, self.excepts))}" if self.excepts else ""
            return f"ipBlock {self.net}{cut}"
        ns = _show(self.namespaces) or "every namespace"
        return f"pods {_show(self.pods) or '(all)'} in namespaces {ns}"


@dataclass(frozen=True)
class Port:
    protocol: Optional[str]                     # None: every protocol and port
    port: Any = None                            # int, a name, or None (every port)
    end: Optional[int] = None

    def __str__(self) -> str:
        if self.protocol is None:
            return "every port"
        if self.port is None:
            return f"every {self.protocol} port"
        return f"{self.protocol} {self.port}{f'-{self.end}' if self.end else ''}"


ALL_PORTS = Port(None)


def _show(reqs: frozenset) -> str:
    return ", ".join(f"{k} {op} {sorted(v)}" if op in ("In", "NotIn") else f"{k} {op}"
                     for k, op, v in sorted(reqs, key=str))


def _selector(sel: Any) -> frozenset:
    if sel is not None and not isinstance(sel, Mapping):
        raise _Unreadable(f"selector {sel!r}")
    reqs = {(str(k), "In", frozenset([str(v)])) for k, v in mapping(get(sel, "matchLabels")).items()}
    for expr in items(get(sel, "matchExpressions")):
        op = str(get(expr, "operator"))
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise _Unreadable(f"matchExpressions operator {op!r}")
        reqs.add((str(get(expr, "key")), op, frozenset(str(v) for v in items(get(expr, "values")))))
    return frozenset(reqs)


def _peer(raw: Any, namespace: str) -> Peer:
    if not isinstance(raw, Mapping):
        raise _Unreadable(f"peer {raw!r}")
    block = get(raw, "ipBlock")
    if block is not None:
        try:
            net = ipaddress.ip_network(str(get(block, "cidr")), strict=False)
            cut = tuple(ipaddress.ip_network(str(e), strict=False) for e in items(get(block, "except")))
        except ValueError:
            raise _Unreadable(f"ipBlock {dict(mapping(block))!r}") from None
        return Peer("ip", net, tuple(e for e in cut if e.version == net.version))
    if "namespaceSelector" not in raw and "podSelector" not in raw:
        raise _Unreadable(f"peer {dict(mapping(raw))!r}")
    namespaces = (_selector(get(raw, "namespaceSelector")) if "namespaceSelector" in raw
                  else frozenset({(NAMESPACE_NAME_LABEL, "In", frozenset([namespace]))}))
    return Peer("pods", namespaces=namespaces, pods=_selector(get(raw, "podSelector")))


def _port(raw: Any) -> Port:
    protocol = str(get(raw, "protocol", default="TCP") or "TCP")
    value = get(raw, "port")
    number = as_int(value)
    end = as_int(get(raw, "endPort"))
    if value is None:
        return Port(protocol)
    if number is None:
        return Port(protocol, str(value))
    return Port(protocol, number, end if end and end > number else None)


def _rules(policy: PolicyResource, direction: str, key: str, side: str
           ) -> Optional[list[tuple[Peer, Port]]]:
    """The (peer, port) pairs a policy admits in `direction`; None when it does not take
    part in that direction (policyTypes)."""
    spec = get(policy.props, "spec") or {}
    types = [str(t) for t in items(get(spec, "policyTypes"))] or (
        ["Ingress"] + (["Egress"] if "egress" in spec else []))
    if direction not in types:
        return None
    namespace = str(get(policy.props, "metadata", "namespace", default="default"))
    pairs = []
    for rule in items(get(spec, key)):
        try:
            peers = [_peer(p, namespace) for p in items(get(rule, side))] or [Peer("any")]
            ports = [_port(p) for p in items(get(rule, "ports"))] or [ALL_PORTS]
        except _Unreadable:
            peers, ports = [Peer("any")], [ALL_PORTS]   # what cannot be read admits all
        pairs += [(peer, port) for peer in peers for port in ports]
    return pairs


def effective(policies: list, namespace: str, labels: dict[str, str], direction: str
              ) -> Optional[list[tuple[Peer, Port]]]:
    """What a pod (namespace, labels) admits in `direction` under `policies` (objects
    with .props): None when no policy isolates it (everything is admitted)."""
    _dir, key, side = next(d for d in DIRECTIONS if d[0] == direction)
    found: Optional[list] = None
    for pol in policies:
        if str(get(pol.props, "metadata", "namespace", default="default")) != namespace:
            continue
        if not label_selector_matches(get(pol.props, "spec", "podSelector"), labels):
            continue
        pairs = _rules(pol, direction, key, side)
        if pairs is not None:
            found = (found or []) + pairs
    return found


# ---- covering ---------------------------------------------------------------------------

def _implied(narrow: frozenset, req: Requirement) -> bool:
    key, op, values = req
    for k, o, v in narrow:
        if k != key:
            continue
        if op == "In" and o == "In" and v <= values:
            return True
        if op == "NotIn" and ((o == "In" and not v & values) or (o == "NotIn" and v >= values)
                              or o == "DoesNotExist"):
            return True
        if op == "Exists" and o in ("In", "Exists"):
            return True
        if op == "DoesNotExist" and o == "DoesNotExist":
            return True
    return False


def _within_selector(narrow: frozenset, wide: frozenset) -> bool:
    return all(_implied(narrow, req) for req in wide)


def _covered_by(net, excepts) -> bool:
    """Every address of `net` lies in one of `excepts`."""
    remaining = [net]
    for cut in excepts:
        nxt = []
        for part in remaining:
            if part.version != cut.version or not part.overlaps(cut):
                nxt.append(part)
            elif part.subnet_of(cut):
                continue
            else:
                nxt.extend(part.address_exclude(cut))
        remaining = nxt
    return not remaining


def _within_block(narrow: Peer, wide: Peer) -> bool:
    if narrow.net.version != wide.net.version or not narrow.net.subnet_of(wide.net):
        return False
    for cut in wide.excepts:
        if not narrow.net.overlaps(cut):
            continue
        part = cut if cut.subnet_of(narrow.net) else narrow.net
        if not _covered_by(part, narrow.excepts):
            return False
    return True


def peer_within(narrow: Peer, wide: Peer) -> bool:
    if wide.kind == "any":
        return True
    if narrow.kind != wide.kind:
        return False
    if narrow.kind == "ip":
        return _within_block(narrow, wide)
    return (_within_selector(narrow.namespaces, wide.namespaces)
            and _within_selector(narrow.pods, wide.pods))


def port_within(narrow: Port, wide: Port) -> bool:
    if wide.protocol is None:
        return True
    if narrow.protocol != wide.protocol:
        return False
    if wide.port is None:
        return True
    if narrow.port is None:
        return False
    if isinstance(narrow.port, str) or isinstance(wide.port, str):
        return narrow.port == wide.port
    return wide.port <= narrow.port and (narrow.end or narrow.port) <= (wide.end or wide.port)


def wider(plan: list[tuple[Peer, Port]], allowed: list[tuple[Peer, Port]]
          ) -> list[tuple[Peer, Port]]:
    """The pairs of `plan` no pair of `allowed` covers."""
    return [(p, q) for p, q in plan
            if not any(peer_within(p, ap) and port_within(q, aq) for ap, aq in allowed)]


# ---- the stack's own policies, rebuilt from its config -----------------------------------

@dataclass
class _Built:
    props: dict


def reference_policies(cfg, instance: str, namespace: str, multi_node: bool) -> list[_Built]:
    names = naming.ServingNames(instance, namespace, groups=multi_node)
    built = network_policies(cfg, names, instance)
    if cfg.gateway.enabled:
        built.append(picker_policy(cfg, GatewayNames(instance, namespace), instance))
    return [_Built(p) for p in built]


def _open_to_all(pairs: Optional[list[tuple[Peer, Port]]]) -> list[tuple[Peer, Port]]:
    """The fixed rule when no config is readable: nothing admits every source, every
    namespace or a /0 block."""
    if pairs is None:
        return [(Peer("any"), ALL_PORTS)]
    return [(p, q) for p, q in pairs if p.kind == "any" or (p.kind == "ip" and p.net.prefixlen == 0)
            or (p.kind == "pods" and not p.namespaces)]


def _network_exposure(args: StackValidationArgs, report: ReportViolation) -> None:
    policies = [r for r in args.resources if kind_of(r.resource_type) == "NetworkPolicy"]
    pods: list[tuple[PolicyResource, Workload]] = [
        (res, wl) for res in args.resources for wl in workloads(res.resource_type, res.props)]
    serving = [wl for _, wl in pods if wl.is_serving]
    if not serving:
        return
    cfg = stack_config.stack()
    rebuilt: dict = {}              # one rebuild per instance and namespace
    for res, wl in pods:
        labels = wl.labels()
        instance = labels.get(INSTANCE_LABEL)
        if cfg is not None and instance is not None and wl.namespace != (cfg.namespace or instance):
            continue        # another namespace (the engine build's): its own builders judge it
        if cfg is None or instance is None:
            if wl.is_serving:
                bad = _open_to_all(effective(policies, wl.namespace, labels, "Ingress"))
                if bad:
                    report(_message(wl, "Ingress", bad, "nothing admits every source, "
                                    "every namespace or a /0 block"), res.urn)
            continue
        multi = any(s.kind == "LeaderWorkerSet" for s in serving)
        if (instance, wl.namespace) not in rebuilt:
            rebuilt[instance, wl.namespace] = reference_policies(cfg, instance, wl.namespace, multi)
        reference = rebuilt[instance, wl.namespace]
        for direction, _key, _side in DIRECTIONS:
            allowed = effective(reference, wl.namespace, labels, direction)
            if allowed is None:
                continue            # the stack's own policies leave it alone: so may the plan
            plan = effective(policies, wl.namespace, labels, direction)
            bad = ([(Peer("any"), ALL_PORTS)] if plan is None else wider(plan, allowed))
            if bad:
                report(_message(wl, direction, bad, "the stack's config admits "
                                + _summary(allowed)), res.urn)


def _summary(pairs: list[tuple[Peer, Port]]) -> str:
    if not pairs:
        return "nothing"
    shown = "; ".join(f"{p} on {q}" for p, q in pairs[:_SHOWN])
    return shown + (f"; and {len(pairs) - _SHOWN} more" if len(pairs) > _SHOWN else "")


# The instance metadata services (AWS, GCP, Azure; AWS's IPv6 one): named in a refusal
# whose egress reaches them.
METADATA = tuple(map(ipaddress.ip_address, ("169.254.169.254", "fd00:ec2::254")))


def reaches(peer: Peer, address) -> bool:
    """`peer` admits `address`: an ipBlock by its cidr less its excepts, never by shape."""
    if peer.kind == "any":
        return True
    return (peer.kind == "ip" and address.version == peer.net.version and address in peer.net
            and not any(address in cut for cut in peer.excepts))


def _message(wl: Workload, direction: str, bad: list, admitted: str) -> str:
    what = "may be reached by" if direction == "Ingress" else "may reach"
    imds = [str(a) for a in METADATA if direction == "Egress" and any(reaches(p, a) for p, _ in bad)]
    return (f"{wl.kind} {wl.name} (namespace {wl.namespace}): after every NetworkPolicy, its "
            f"pods {what} {_summary(bad)}"
            + (f" (the instance metadata service, {' and '.join(imds)}, among them)" if imds else "")
            + f"; {admitted} (k3:network, k3:gateway, k3:benchmark, k3:accuracy)")


network_exposure = StackValidationPolicy(
    name="k3-network-exposure",
    description=("The effective exposure of every pod of the stack, after all NetworkPolicies: "
                 "what may reach it and what it may reach is within what the stack's own config "
                 "admits (rebuilt from its k3:* keys by the builders that render the policies). "
                 "A rule widened to every namespace, to 0.0.0.0/0 or to every port, an added "
                 "policy, or a removed one that leaves a pod unisolated, is refused whatever "
                 f"object carries it: the serving pods serve {_receipt().model.repo} and the "
                 "prefetch pods fetch its weights."),
    validate=_network_exposure,
    enforcement_level=EnforcementLevel.MANDATORY,
)

POLICIES = [network_exposure]
