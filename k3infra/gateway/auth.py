"""The API key, checked at the gateway with the implementation's own policy (as well as
by the serving pods' proxy and by vLLM behind it).

Envoy Gateway: a `SecurityPolicy` with `apiKeyAuth` on the Gateway, reading its keys
from a Secret whose every data key is a client id and every value a key. Envoy's
api_key_auth filter reads the `Authorization` header and drops a leading `Bearer `
before it compares, so clients send the same header as to vLLM, and the header is
forwarded unchanged (the in-pod proxy checks it again). The keys Secret is its own,
filled from the same Pulumi secret (k3:apiKey): the serving Secret also holds the
proxy's key map, which as a data key of a credentials Secret would become a valid key.

kgateway, Istio and GKE: no policy is rendered (docs/gateway.md names each one's
equivalent); the render says so, and the key is then checked in the pods only.
"""
from __future__ import annotations

from typing import Any, Optional

from k3infra import naming
from k3infra.config import StackConfig
from k3infra.gateway.names import GatewayNames
from k3infra.gateway.versions import GATEWAY_GROUP
from k3infra.gates import Gate

CLIENT_ID = "k3infra"        # the one client of the one key
AUTH_HEADER = "Authorization"


def renders_key_policy(cfg: StackConfig) -> bool:
    return cfg.gateway.enabled and cfg.gateway.implementation == "envoy-gateway"


def keys_secret(names: GatewayNames, instance: str, api_key: Any) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": names.keys_secret, "namespace": names.namespace,
                         "labels": naming.labels(instance, "gateway")},
            "stringData": {CLIENT_ID: api_key}}


def security_policy(names: GatewayNames, instance: str) -> dict:
    return {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "SecurityPolicy",
            "metadata": {"name": names.key_policy, "namespace": names.namespace,
                         "labels": naming.labels(instance, "gateway")},
            # On the Gateway, so every route attached to it is covered, and the route
            # can be created after it (no moment with a route and no key check).
            "spec": {"targetRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway",
                                     "name": names.gateway}],
                     "apiKeyAuth": {"credentialRefs": [{"group": "", "kind": "Secret",
                                                        "name": names.keys_secret}],
                                    "extractFrom": [{"headers": [AUTH_HEADER]}]}}}


def key_policy_note(cfg: StackConfig) -> Optional[Gate]:
    """A warning (never a refusal) where no gateway key policy is rendered."""
    if not cfg.gateway.enabled or renders_key_policy(cfg):
        return None
    return Gate("k3:gateway.implementation",
                f"{cfg.gateway.implementation}: k3infra renders no gateway key policy for it; "
                "the key is checked by the serving pods' proxy only until you add the "
                "implementation's own (docs/gateway.md, API keys)", refuses=False)
