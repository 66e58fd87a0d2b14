"""The engine image pre-pull: a DaemonSet on the serving nodes whose only container is
the engine image, by digest, sleeping (docs/coldstart.md).

A fresh node pulls a 20-30 GB engine image before the serving container can start; the
weights download that precedes the serving pod takes far longer, so a pod of this
DaemonSet on every serving node makes the kubelet pull the image meanwhile, and the
serving pod finds it on the node (`imagePullPolicy: IfNotPresent`). It reads nothing,
listens on nothing and opens no connection (the namespace's default-deny NetworkPolicy
holds it), and asks for almost nothing. `pulumi up` does not wait for it
(`pulumi.com/skipAwait`): a node that joins late pulls for its serving pod as before.

Pure: (config, image, names) -> the DaemonSet dict.
"""
from __future__ import annotations

from typing import Any

from k3infra import checkov_skips, ephemeral, placement
from k3infra.config import StackConfig
from k3infra.naming import PREPULL_COMPONENT
from k3infra.podsecurity import container_security_context

CONTAINER = "engine-image"
# It writes nothing but its (empty) log: read-only root file system, no volume.
RESOURCES = ephemeral.with_storage({"requests": {"cpu": "10m", "memory": "16Mi"},
                                    "limits": {"cpu": "50m", "memory": "32Mi"}},
                                   *ephemeral.LOGS_ONLY)
# Ready once the container runs, i.e. once the image is on the node. No liveness probe:
# one on `sleep` could only pass (the kubelet restarts an exited container anyway), and a
# copy of the readiness probe is what linters flag (kube-score: pod-probes-identical).
READY = {"exec": {"command": ["true"]}, "periodSeconds": 300, "timeoutSeconds": 5}
# Not the engine image's user (uid 1000): `sleep` reads no file of the image's, so the
# pod runs as a uid above 10000 that owns nothing on the node or in the image (65532,
# distroless' `nonroot`), from `/` (the image's home may be closed to others).
PREPULL_UID = 65532


def name(base: str) -> str:
    return f"{base}-prepull"


def daemonset(cfg: StackConfig, image: Any, base: str, namespace: str, labels: dict,
              instance: str) -> dict:
    pod_labels = {**labels, "app.kubernetes.io/component": PREPULL_COMPONENT}
    selector = {"app.kubernetes.io/instance": instance,
                "app.kubernetes.io/component": PREPULL_COMPONENT}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name(base), "namespace": namespace, "labels": pod_labels,
                     "annotations": {"pulumi.com/skipAwait": "true",
                                     **checkov_skips.annotations(checkov_skips.PREPULL_NO_LIVENESS)}},
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    **cfg.engine.pull_secret_refs(),
                    "securityContext": {"runAsNonRoot": True, "runAsUser": PREPULL_UID,
                                        "runAsGroup": PREPULL_UID,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    # `sleep` ignores SIGTERM as PID 1: nothing to drain.
                    "terminationGracePeriodSeconds": 5,
                    "affinity": {"nodeAffinity": placement.node_affinity(
                        [cfg.gpu_product], placement.pool_of(cfg.node_pool.provider, instance))},
                    "tolerations": placement.tolerations(),
                    "containers": [{
                        "name": CONTAINER, "image": image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sleep", "infinity"], "workingDir": "/",
                        "resources": RESOURCES,
                        "readinessProbe": READY,
                        "securityContext": {**container_security_context(),
                                            "runAsUser": PREPULL_UID,
                                            "runAsGroup": PREPULL_UID}}]}}}}
