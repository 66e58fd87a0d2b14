"""NetworkPolicies for the serving pods and the weights prefetch Job.

Pure: (config, names) -> manifest dicts.

Every namespace the stack creates starts from a default-deny policy (no ingress, no
egress for any pod); the policies below open what each component needs.

Serving pods: only the proxy listens on the pod's address (k3infra/serving/proxy.py).
Its API port admits the configured namespaces / pod labels and (when enabled) this
stack's benchmark Job; its metrics port admits only the metrics scraper; its health
port admits nobody (kubelet probes). Egress is DNS only: one replica is one pod, tensor parallelism runs inside it over
NVLink and /dev/shm, so a serving pod opens no connection to other pods, and with
HF_HUB_OFFLINE=1 none to the Hub, in both weights modes: only the prefetch Job fetches
(node-local included: one Job pod per node's local volume).

Prefetch Job pods: no ingress at all; egress DNS + the Hub (HTTPS to `k3:network.hubCidrs`,
minus `k3:network.clusterCidrs` and link-local 169.254.0.0/16: the cloud's instance
metadata service, in-cluster services and the node network are never "the Hub"). With
k3:weights.store, the store instead of the Hub (its CIDRs on its endpoint's port, the same
ranges cut), plus the workload identity's node-local endpoint when it has one.
With in-cluster weights sources (k3:weights.source, node-local, more than one replica):
prefetch pods may also reach this stack's source pods on the source port, and the source
pods admit exactly that: ingress from this stack's prefetch pods on that port, no egress.
Weights audit pods (k3:weights.auditSchedule) are selected by no allow rule: the default
deny leaves them no ingress and no egress (they read a volume and print). So are the
engine image pre-pull pods (k3:coldStart.prepull): they only sleep; the kubelet pulls.

Client pods of the stack's namespace (k3:network.allowFromPodLabels): the default deny
would leave them no egress, so the serving policy's rule for them would admit nobody (the
node tier's enforced probes found it): they get egress to DNS and the API port only.

Benchmark pods (k3:benchmark.enabled): the Job takes no ingress and reaches only DNS and
the serving pods' API port (its tokenizer comes from the weights directory, offline);
the reader pod `k3infra bench fetch` starts streams through the exec API and needs no
network at all. The AccuracySmoke Job (k3:accuracy.enabled) is held the same way: DNS
and the serving API port only (its datasets come from its image, offline).

With the inference gateway (k3:gateway.enabled), the API port admits only the
gateway's proxies (k3infra.netpol.gateway_proxy_peers) and this stack's own benchmark
and accuracy Jobs: `allowFromNamespaces` / `allowFromPodLabels` are refused, clients
call the Gateway. The endpoint picker reaches the metrics port (it scores on the
queue and KV-cache series); its own policy is k3infra.gateway.network's.

A multi-node replica (k3:topology = multi-node) is one torch.distributed world over two
pods: its serving pods also admit and reach each other (only each other) on TCP
1024-65535, the master port 29501 and the ports NCCL, gloo and vLLM's message queue
pick at run time.

Kubelet probes and `kubectl port-forward` reach the pod from its own node and are not
subject to these policies on the common CNIs (Calico, Cilium, VPC CNI, OCI VCN-native).
"""
from __future__ import annotations

from k3infra import naming, topology
from k3infra.config import StackConfig
from k3infra.naming import (ACCURACY_COMPONENT, BENCHMARK_COMPONENT,
                            BENCHMARK_READER_COMPONENT, EPP_COMPONENT, PREFETCH_COMPONENT,
                            ROLLOUT_GATE_COMPONENT, SOURCE_COMPONENT)
from k3infra.serving.rollout import gated
from k3infra.netpol import default_deny, dns_egress, gateway_proxy_peers, internet_peers
from k3infra.netpol import namespace_peer as _namespace_peer
from k3infra.weights import fanout


def policy_names(base: str) -> dict[str, str]:
    return {"default-deny": f"{base}-default-deny", "serving": f"{base}-serving", "prefetch": f"{base}-{PREFETCH_COMPONENT}",
            "source": f"{base}-{SOURCE_COMPONENT}",
            "benchmark": f"{base}-{BENCHMARK_COMPONENT}",
            "gate": f"{base}-{ROLLOUT_GATE_COMPONENT}",
            "benchmark-reader": f"{base}-{BENCHMARK_READER_COMPONENT}",
            "accuracy": f"{base}-{ACCURACY_COMPONENT}",
            "clients": f"{base}-clients"}


def component_selector(instance: str, component: str) -> dict:
    return {"matchLabels": {"app.kubernetes.io/name": naming.APP,
                            "app.kubernetes.io/instance": instance,
                            "app.kubernetes.io/component": component}}


def serving_ingress_peers(cfg: StackConfig, instance: str) -> list[dict]:
    """Who may open the API port. Empty means nobody (the pods still start and pass
    their probes; clients need k3:network.allowFromNamespaces or allowFromPodLabels).
    The scraper is not among them: it reaches the metrics port only."""
    net = cfg.network
    if cfg.gateway.enabled:         # the Gateway is the only front door
        peers = gateway_proxy_peers(cfg.gateway, instance, cfg.namespace or instance)
    else:
        peers = [_namespace_peer(ns) for ns in net.allow_from_namespaces]
        if net.allow_from_pod_labels:
            peers.append({"podSelector": {"matchLabels": dict(net.allow_from_pod_labels)}})
    if cfg.benchmark.enabled:
        peers.append({"podSelector": component_selector(instance, BENCHMARK_COMPONENT)})
    if gated(cfg):
        peers.append({"podSelector": component_selector(instance, ROLLOUT_GATE_COMPONENT)})
    if cfg.accuracy.enabled:
        peers.append({"podSelector": component_selector(instance, ACCURACY_COMPONENT)})
    return peers


def hub_egress(cfg: StackConfig) -> dict:
    return {"to": internet_peers(cfg.network.hub_cidrs, cfg),
            "ports": [{"port": port, "protocol": "TCP"} for port in cfg.network.hub_ports]}


def serving_policy(cfg: StackConfig, names: naming.ServingNames, instance: str) -> dict:
    peers = serving_ingress_peers(cfg, instance)
    ingress = [{"from": peers, "ports": [{"port": cfg.serving.port, "protocol": "TCP"}]}] \
        if peers else []
    net = cfg.network
    metrics_peers = []
    if net.scraper_namespace:
        metrics_peers.append(_namespace_peer(net.scraper_namespace, net.scraper_pod_labels))
    if cfg.gateway.enabled:
        metrics_peers.append({"podSelector": component_selector(instance, EPP_COMPONENT)})
    if metrics_peers:
        ingress.append({"from": metrics_peers,
                        "ports": [{"port": cfg.serving.metrics_port, "protocol": "TCP"}]})
    egress = [dns_egress(cfg)]
    if topology.is_multi_node(cfg):
        # One replica's pods are one torch.distributed world: the master port (29501) and
        # the ports NCCL's bootstrap/ring sockets, gloo and vLLM's cross-node message
        # queue pick at run time. Only between serving pods of this instance.
        ingress.append(group_rule("from", instance))
        egress.append(group_rule("to", instance))
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": policy_names(names.base)["serving"], "namespace": names.namespace,
                         "labels": naming.labels(instance, "network-policy")},
            "spec": {"podSelector": {"matchLabels": naming.selector_labels(instance)},
                     "policyTypes": ["Ingress", "Egress"],
                     "ingress": ingress, "egress": egress}}


def group_rule(direction: str, instance: str) -> dict:
    """A multi-node group's own traffic: every unprivileged TCP port between the serving
    pods of `instance` (`direction`: "from" for ingress, "to" for egress)."""
    low, high = topology.GROUP_PORT_RANGE
    return {direction: [{"podSelector": {"matchLabels": naming.selector_labels(instance)}}],
            "ports": [{"port": low, "endPort": high, "protocol": "TCP"}]}


def _policy(name: str, names: naming.ServingNames, instance: str, selector: dict,
            egress: list[dict]) -> dict:
    """A policy for one component's pods: no ingress, the given egress."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": names.namespace,
                         "labels": naming.labels(instance, "network-policy")},
            "spec": {"podSelector": selector,
                     "policyTypes": ["Ingress", "Egress"],
                     "ingress": [], "egress": egress}}


def _to_sources(instance: str) -> dict:
    return {"to": [{"podSelector": component_selector(instance, SOURCE_COMPONENT)}],
            "ports": [{"port": fanout.SOURCE_PORT, "protocol": "TCP"}]}


def store_egress(cfg: StackConfig) -> dict:
    """The prefetch's way to k3:weights.store: its CIDRs (any, less the cluster's own, by
    default) on the endpoint's port."""
    store = cfg.weights.store
    return {"to": internet_peers(store.cidrs, cfg),
            "ports": [{"port": store.port, "protocol": "TCP"}]}


# Where workload identity hands a pod its credentials on the node, per store scheme: the
# EKS Pod Identity agent (AWS documents 169.254.170.23, port 80) and GKE's metadata server
# (169.254.169.254, port 80). IRSA's STS and Azure's Entra ID are public HTTPS endpoints,
# reached through the store's own rule. Link-local stays cut everywhere else.
IDENTITY_ENDPOINTS = {"s3": ("169.254.170.23/32", 80), "gs": ("169.254.169.254/32", 80)}


def identity_egress(cfg: StackConfig) -> list[dict]:
    store = cfg.weights.store
    if store.service_account is None or store.scheme not in IDENTITY_ENDPOINTS:
        return []
    cidr, port = IDENTITY_ENDPOINTS[store.scheme]
    return [{"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"port": port, "protocol": "TCP"}]}]


def prefetch_policy(cfg: StackConfig, names: naming.ServingNames, instance: str) -> dict:
    # The origin: the Hub, or your object store instead (then no way to the Hub).
    egress = [dns_egress(cfg)] + ([hub_egress(cfg)] if cfg.weights.store is None
                                  else [store_egress(cfg), *identity_egress(cfg)])
    if fanout.serving_copies(cfg):
        egress.append(_to_sources(instance))      # this stack's in-cluster sources, their port
    return _policy(policy_names(names.base)["prefetch"], names, instance,
                   component_selector(instance, PREFETCH_COMPONENT), egress)


def source_policy(cfg: StackConfig, names: naming.ServingNames, instance: str) -> dict:
    """In-cluster weights sources: ingress only from this stack's prefetch pods, only on
    the source port; no egress (they read a volume and answer)."""
    pol = _policy(policy_names(names.base)["source"], names, instance,
                  component_selector(instance, SOURCE_COMPONENT), [])
    pol["spec"]["ingress"] = [{"from": [{"podSelector": component_selector(instance, PREFETCH_COMPONENT)}],
                               "ports": [{"port": fanout.SOURCE_PORT, "protocol": "TCP"}]}]
    return pol


def benchmark_policies(cfg: StackConfig, names: naming.ServingNames, instance: str) -> list[dict]:
    to_serving = {"to": [{"podSelector": {"matchLabels": naming.selector_labels(instance)}}],
                  "ports": [{"port": cfg.serving.port, "protocol": "TCP"}]}
    pols = policy_names(names.base)
    # The reader pod is started by the CLI, labelled by part-of and component only.
    reader = {"matchLabels": {"app.kubernetes.io/part-of": "k3infra",
                              "app.kubernetes.io/component": BENCHMARK_READER_COMPONENT}}
    # The benchmark's and the rollout gate's Jobs: DNS and the serving API port only.
    jobs = [(pols[key], component) for key, component, on in (
        ("benchmark", BENCHMARK_COMPONENT, cfg.benchmark.enabled),
        ("gate", ROLLOUT_GATE_COMPONENT, gated(cfg))) if on]
    return [*(_policy(name, names, instance, component_selector(instance, component),
                      [dns_egress(cfg), to_serving]) for name, component in jobs),
            _policy(pols["benchmark-reader"], names, instance, reader, [])]


def clients_policy(cfg: StackConfig, names: naming.ServingNames, instance: str) -> dict:
    """Client pods in the stack's namespace (k3:network.allowFromPodLabels): the
    namespace's default deny leaves them no egress, so the serving policy's ingress rule
    for them would admit nobody. Egress to DNS and the serving pods' API port only; their
    ingress stays the default deny's (this policy is Egress only)."""
    to_serving = {"to": [{"podSelector": {"matchLabels": naming.selector_labels(instance)}}],
                  "ports": [{"port": cfg.serving.port, "protocol": "TCP"}]}
    pol = _policy(policy_names(names.base)["clients"], names, instance,
                  {"matchLabels": dict(cfg.network.allow_from_pod_labels)},
                  [dns_egress(cfg), to_serving])
    pol["spec"]["policyTypes"] = ["Egress"]
    del pol["spec"]["ingress"]
    return pol


def network_policies(cfg: StackConfig, names: naming.ServingNames, instance: str) -> list[dict]:
    out = [default_deny(policy_names(names.base)["default-deny"], names.namespace,
                        naming.labels(instance, "network-policy")),
           serving_policy(cfg, names, instance), prefetch_policy(cfg, names, instance)]
    if cfg.network.allow_from_pod_labels and not cfg.gateway.enabled:
        out.append(clients_policy(cfg, names, instance))
    if fanout.serving_copies(cfg):
        out.append(source_policy(cfg, names, instance))
    if cfg.benchmark.enabled or gated(cfg):
        out += benchmark_policies(cfg, names, instance)
    if cfg.accuracy.enabled:
        out.append(accuracy_policy(cfg, names, instance))
    return out


def accuracy_policy(cfg: StackConfig, names: naming.ServingNames, instance: str) -> dict:
    """The AccuracySmoke Job: no ingress; DNS and the serving API port only."""
    to_serving = {"to": [{"podSelector": {"matchLabels": naming.selector_labels(instance)}}],
                  "ports": [{"port": cfg.serving.port, "protocol": "TCP"}]}
    return _policy(policy_names(names.base)["accuracy"], names, instance,
                   component_selector(instance, ACCURACY_COMPONENT), [dns_egress(cfg), to_serving])
