"""The Gateway and its HTTPRoute: only the OpenAI inference routes the serving pods' proxy
allows (k3infra.serving.proxy.INFERENCE_ROUTES, the one list; not the benchmark's
/tokenize), each to the InferencePool. Every
other path gets the gateway's own 404 and never reaches a pod."""
from __future__ import annotations

from k3infra import naming
from k3infra.config import StackConfig
from k3infra.gateway.names import GatewayNames
from k3infra.gateway.versions import GATEWAY_GROUP, INFERENCE_GROUP
from k3infra.serving.proxy import INFERENCE_ROUTES, READ_TIMEOUT_SECONDS


def gateway(cfg: StackConfig, names: GatewayNames, instance: str) -> dict:
    """One listener; HTTPS when k3:gateway.tlsSecret names a certificate. Routes only
    from this namespace attach to it."""
    gw = cfg.gateway
    listener: dict = {"name": "https" if gw.tls_secret else "http",
                      "protocol": "HTTPS" if gw.tls_secret else "HTTP", "port": gw.port,
                      "allowedRoutes": {"namespaces": {"from": "Same"},
                                        "kinds": [{"group": GATEWAY_GROUP, "kind": "HTTPRoute"}]}}
    if gw.tls_secret:
        listener["tls"] = {"mode": "Terminate",
                           "certificateRefs": [{"kind": "Secret", "name": gw.tls_secret}]}
    return {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "Gateway",
            "metadata": {"name": names.gateway, "namespace": names.namespace,
                         "labels": naming.labels(instance, "gateway")},
            "spec": {"gatewayClassName": gw.class_name, "listeners": [listener]}}


def http_route(cfg: StackConfig, names: GatewayNames, instance: str) -> dict:
    """Exact path + method matches; the request timeout is the proxy's read timeout, so
    a long generation or an SSE stream is cut by neither."""
    return {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "HTTPRoute",
            "metadata": {"name": names.route, "namespace": names.namespace,
                         "labels": naming.labels(instance, "gateway")},
            "spec": {"parentRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway",
                                     "name": names.gateway}],
                     "rules": [{"matches": [{"path": {"type": "Exact", "value": r.path},
                                             "method": r.method} for r in INFERENCE_ROUTES],
                                "backendRefs": [{"group": INFERENCE_GROUP, "kind": "InferencePool",
                                                 "name": names.pool}],
                                "timeouts": {"request": f"{READ_TIMEOUT_SECONDS}s"}}]}}
