"""With the inference gateway (k3:gateway, an InferencePool over the serving pods), the
gateway is the only front door: nothing exposes the serving pods outside their
namespace except the gateway's own proxies."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from pulumi_policy import (EnforcementLevel, PolicyResource, ReportViolation,
                           StackValidationArgs, StackValidationPolicy)

from k3infra.netpol import gateway_proxy_peers
from k3infra.policies import stack_config
from k3infra.policies.workloads import (Workload, as_int, get, items, kind_of,
                                        label_selector_matches, mapping, workloads)

_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs

# Service types that publish the pods beyond the cluster network's own addresses.
_EXPOSING_TYPES = {"NodePort", "LoadBalancer", "ExternalName"}


def _in(res: PolicyResource, kind: str, namespace: str) -> bool:
    return (kind_of(res.resource_type) == kind
            and str(get(res.props, "metadata", "namespace", default="default")) == namespace)


def _plain(value):
    """Policy properties as plain dicts/lists (to compare with the builders' peers)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(value[k]) for k in value}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _gated(args: StackValidationArgs) -> list[tuple[PolicyResource, Workload, list[int]]]:
    """Serving workloads an InferencePool selects, with the pool's target ports."""
    out = []
    for res in args.resources:
        for wl in workloads(res.resource_type, res.props):
            if not wl.is_serving:
                continue
            ports = [as_int(get(p, "number")) for pool in args.resources
                     if _in(pool, "InferencePool", wl.namespace)
                     and label_selector_matches(get(pool.props, "spec", "selector"), wl.labels())
                     for p in items(get(pool.props, "spec", "targetPorts"))]
            if ports:
                out.append((res, wl, [p for p in ports if p is not None]))
    return out


def _covers(rule, ports: list[int]) -> bool:
    listed = items(get(rule, "ports"))
    return not listed or any(as_int(get(p, "port")) in ports for p in listed)


def _front_door(args: StackValidationArgs, report: ReportViolation) -> None:
    gw_cfg = stack_config.gateway()
    for res, wl, ports in _gated(args):
        labels = wl.labels()
        for svc in args.resources:
            if not _in(svc, "Service", wl.namespace):
                continue
            selector = mapping(get(svc.props, "spec", "selector"))
            if not selector or not label_selector_matches({"matchLabels": selector}, labels):
                continue
            kind = str(get(svc.props, "spec", "type", default="ClusterIP"))
            if kind in _EXPOSING_TYPES or items(get(svc.props, "spec", "externalIPs")):
                report(f"Service {get(svc.props, 'metadata', 'name')}: type {kind}"
                       f"{' with externalIPs' if kind == 'ClusterIP' else ''} exposes the serving "
                       f"pods of {wl.kind} {wl.name} outside namespace {wl.namespace}; with the "
                       "inference gateway they are reached through the Gateway only", svc.urn)
        gateways = [str(get(g.props, "metadata", "name")) for g in args.resources
                    if _in(g, "Gateway", wl.namespace)]
        allowed = [peer for name in gateways
                   for peer in gateway_proxy_peers(gw_cfg, name, wl.namespace)]
        for pol in args.resources:
            if not (_in(pol, "NetworkPolicy", wl.namespace) and label_selector_matches(
                    get(pol.props, "spec", "podSelector"), labels)):
                continue
            for rule in items(get(pol.props, "spec", "ingress")):
                if not _covers(rule, ports):
                    continue
                peers = items(get(rule, "from"))
                if not peers:
                    report(f"NetworkPolicy {get(pol.props, 'metadata', 'name')}: a rule admits "
                           f"every source to the serving pods' API port {ports}", pol.urn)
                for peer in peers:
                    plain = _plain(peer)
                    same_namespace = (set(plain) == {"podSelector"})
                    if not same_namespace and plain not in allowed:
                        report(f"NetworkPolicy {get(pol.props, 'metadata', 'name')}: peer "
                               f"{plain} reaches the serving pods' API port {ports} from outside "
                               f"namespace {wl.namespace} without being the gateway's proxies "
                               f"({allowed or 'none configured'})", pol.urn)


gateway_front_door = StackValidationPolicy(
    name="k3-gateway-front-door",
    description=("With an InferencePool over the serving pods (k3:gateway.enabled), nothing but "
                 f"the gateway's proxies reaches the API port serving {_receipt().model.repo} from "
                 "outside the namespace: no "
                 "NodePort / LoadBalancer / ExternalName Service or externalIPs selects them, and "
                 "their NetworkPolicies admit only pods of the namespace and the gateway's proxy "
                 "pods (or GKE's proxy-only subnet) to the pool's target port."),
    validate=_front_door,
    enforcement_level=EnforcementLevel.MANDATORY,
)

POLICIES = [gateway_front_door]
