"""NetworkPolicy building blocks shared by every policy k3infra writes (the serving,
prefetch and benchmark policies in k3infra.operations.network, the engine build's in
k3infra.engine.manifests, the endpoint picker's in k3infra.gateway): one definition of a
namespace peer, DNS egress, ipBlocks of user CIDRs without the link-local ranges (and,
for the internet, the cluster's),
the inference gateway's proxy pods, and the namespace's default deny."""
from __future__ import annotations

import ipaddress
from typing import Any

from k3infra.config import GatewayConfig, StackConfig
# Link-local (the metadata services, NodeLocal DNS): defined beside the CIDR type that
# refuses a user CIDR inside it; cut here out of every block that contains it.
from k3infra.fieldtypes import LINK_LOCAL_CIDRS

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"   # set by the API server on every namespace
DNS_PORT = 53


def namespace_peer(namespace: str, pod_labels: dict[str, str] | None = None) -> dict:
    peer: dict[str, Any] = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}}
    if pod_labels:
        peer["podSelector"] = {"matchLabels": dict(pod_labels)}   # both: AND, not OR
    return peer


def dns_egress(cfg: StackConfig) -> dict:
    to: list[dict] = [namespace_peer(cfg.network.dns_namespace)]
    to += [{"ipBlock": {"cidr": cidr}} for cidr in cfg.network.dns_cidrs]
    return {"to": to, "ports": [{"port": DNS_PORT, "protocol": "UDP"},
                                {"port": DNS_PORT, "protocol": "TCP"}]}


def ip_peers(cidrs: list[str], excluded: tuple[str, ...] = ()) -> list[dict]:
    """ipBlocks for CIDRs a user listed (every key but k3:network.dnsCidrs): the link-local
    ranges (the instance metadata service) and `excluded` cut out of each block that
    contains them (an `except` must lie inside its block). A CIDR inside a link-local
    range is refused when the config is parsed (fieldtypes.Cidr)."""
    cut_out = [ipaddress.ip_network(c) for c in (*excluded, *LINK_LOCAL_CIDRS)]
    peers = []
    for cidr in cidrs:
        net = ipaddress.ip_network(cidr)
        cut = list(dict.fromkeys(str(x) for x in cut_out if x.version == net.version
                                 and x != net and x.subnet_of(net)))
        peers.append({"ipBlock": {"cidr": cidr, **({"except": cut} if cut else {})}})
    return peers


def internet_peers(cidrs: list[str], cfg: StackConfig) -> list[dict]:
    """ip_peers less the cluster's own ranges too (k3:network.clusterCidrs)."""
    return ip_peers(cidrs, tuple(cfg.network.cluster_cidrs))


def default_deny(name: str, namespace: str, labels: dict) -> dict:
    """Every pod of the namespace: no ingress, no egress, unless another policy opens it
    (policies are additive), so a pod no policy names is cut off, not wide open."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [], "egress": []}}


# Where each Gateway API implementation runs a Gateway's proxy pods, and the labels it
# puts on them (their install docs; not exercised against a running controller here).
# Envoy Gateway: one Deployment per Gateway in its controller's namespace; kgateway
# and Istio: a Deployment in the Gateway's own namespace, labelled with the Gateway API's
# `gateway.networking.k8s.io/gateway-name`.
ENVOY_GATEWAY_NAMESPACE = "envoy-gateway-system"


def default_proxy_pods(implementation: str, gateway: str, namespace: str) -> tuple[str, dict]:
    """(namespace, pod labels) of a Gateway's proxy pods for a pod-based implementation."""
    if implementation == "envoy-gateway":
        return ENVOY_GATEWAY_NAMESPACE, {"gateway.envoyproxy.io/owning-gateway-name": gateway,
                                         "gateway.envoyproxy.io/owning-gateway-namespace": namespace}
    return namespace, {"gateway.networking.k8s.io/gateway-name": gateway}


def gateway_proxy_peers(gw: GatewayConfig, gateway: str, namespace: str) -> list[dict]:
    """NetworkPolicy peers for the inference gateway's proxies (k3:gateway, `gw`): the
    proxy pods (namespace AND labels, never a whole namespace), or for GKE, whose
    proxies are not pods, the proxy-only subnet's CIDRs."""
    if gw.implementation == "gke":
        return ip_peers(gw.proxy_cidrs)
    ns, pod_labels = default_proxy_pods(gw.implementation, gateway, namespace)
    ns = gw.proxy_namespace or ns
    pod_labels = dict(gw.proxy_pod_labels) if gw.proxy_pod_labels else pod_labels
    if ns == namespace:
        return [{"podSelector": {"matchLabels": pod_labels}}]
    return [namespace_peer(ns, pod_labels)]
