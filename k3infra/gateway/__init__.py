"""The opt-in inference gateway (k3:gateway, issue 22; docs/gateway.md).

With more than one replica a plain Service round-robins, and every replica keeps its own
prefix cache: a long shared prefix (Workload A's repository context) is prefilled again
on whichever replica a request lands on. The gateway puts the Gateway API Inference
Extension in front instead: an `InferencePool` over the serving pods, its endpoint
picker scoring each pod on prefix-cache reuse, queue depth and KV-cache use, and a
Gateway + HTTPRoute on the implementation the stack names, with that implementation's
API-key policy. The serving pods then admit clients only from the gateway's proxies.

Modules, one concern each: `versions` (the pinned releases), `names` (objects derived
from the instance), `pool` (the InferencePool), `picker` (the endpoint picker: config,
RBAC, Deployment, Service, its deployment gates), `routes` (Gateway, HTTPRoute), `auth`
(the key policy per implementation), `network` (the picker's NetworkPolicy),
`component` (`InferenceGateway`, which registers them). Builders are pure.
"""
