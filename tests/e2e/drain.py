"""A node drain as `kubectl drain` does it, through the API: cordon the node, then ask the
Eviction API (policy/v1, the pods/eviction subresource) to evict each selected pod of it,
again every `retry` seconds while the API server answers 429, which it does while a
PodDisruptionBudget allows no disruption ("Cannot evict pod as it would violate the pod's
disruption budget"). The API server decides from the budget's status, which the
kube-controller-manager's disruption controller keeps (apiserver.CONTROLLERS).

    attempts = drain(core, node.name, "kimi-k3", "app.kubernetes.io/component=serving",
                     timeout=30)
    evicted = [a.pod for a in attempts if a.evicted]   # a blocked drain: fewer than asked
    uncordon(core, node.name)
"""
from __future__ import annotations

import time
from dataclasses import dataclass

BLOCKED = 429       # the eviction would break a PodDisruptionBudget


@dataclass(frozen=True)
class Eviction:
    pod: str
    status: int          # 201: evicted (the pod is being deleted); 429: refused by a budget
    message: str
    seconds: float       # since the drain started

    @property
    def evicted(self) -> bool:
        return self.status in (200, 201)


def evict(core, namespace: str, pod: str) -> tuple[int, str]:
    """One eviction request: (HTTP status, the API server's message)."""
    from kubernetes.client.exceptions import ApiException

    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace}}
    try:
        core.create_namespaced_pod_eviction(pod, namespace, body)
    except ApiException as exc:
        return exc.status, _message(exc)
    return 201, "evicted"


def _message(exc) -> str:
    import json

    try:
        return json.loads(exc.body).get("message", exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)


def cordon(core, node: str, unschedulable: bool = True) -> None:
    core.patch_node(node, {"spec": {"unschedulable": unschedulable}})


def uncordon(core, node: str) -> None:
    cordon(core, node, False)


def drain(core, node: str, namespace: str, selector: str, timeout: float,
          retry: float = 2.0) -> list[Eviction]:
    """Cordon `node` and evict the pods of `namespace` matching `selector` on it, oldest
    name first, each retried while refused with 429, until all are evicted or `timeout`
    seconds passed; every attempt, in order."""
    cordon(core, node)
    start = time.monotonic()
    pods = sorted(p.metadata.name for p in core.list_namespaced_pod(
        namespace, label_selector=selector, field_selector=f"spec.nodeName={node}").items)
    attempts: list[Eviction] = []
    for pod in pods:
        while True:
            status, message = evict(core, namespace, pod)
            attempts.append(Eviction(pod, status, message, time.monotonic() - start))
            if status != BLOCKED or time.monotonic() - start > timeout:
                break
            time.sleep(retry)
        if attempts[-1].status == BLOCKED:
            break        # kubectl drain keeps retrying until its --timeout: so did this
    return attempts
