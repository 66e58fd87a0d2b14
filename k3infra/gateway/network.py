"""The endpoint picker's NetworkPolicy. Ingress: its ext_proc port from the gateway's
proxies only. Egress: DNS, the serving pods' metrics port (its scorers read the queue
and KV-cache series there) and the API server (k3:gateway.apiServerCidrs; it watches
its pool and the pods)."""
from __future__ import annotations

from k3infra import naming
from k3infra.config import StackConfig
from k3infra.gateway.names import GatewayNames
from k3infra.gateway.picker import EXT_PROC_PORT, picker_selector
from k3infra.netpol import dns_egress, gateway_proxy_peers, ip_peers

API_SERVER_PORTS = (443, 6443)


def picker_policy(cfg: StackConfig, names: GatewayNames, instance: str) -> dict:
    egress = [dns_egress(cfg),
              {"to": [{"podSelector": {"matchLabels": naming.selector_labels(instance)}}],
               "ports": [{"port": cfg.serving.metrics_port, "protocol": "TCP"}]}]
    if cfg.gateway.api_server_cidrs:
        egress.append({"to": ip_peers(cfg.gateway.api_server_cidrs),
                       "ports": [{"port": p, "protocol": "TCP"} for p in API_SERVER_PORTS]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": names.picker_policy, "namespace": names.namespace,
                         "labels": naming.labels(instance, "network-policy")},
            "spec": {"podSelector": {"matchLabels": picker_selector(instance)},
                     "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": gateway_proxy_peers(cfg.gateway, names.gateway, names.namespace),
                                  "ports": [{"port": EXT_PROC_PORT, "protocol": "TCP"}]}],
                     "egress": egress}}

