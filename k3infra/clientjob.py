"""One-shot client Jobs against the serving endpoint: the benchmark (`vllm bench serve`)
and the accuracy smoke test (lm-eval). They share one shape, kept here once:

- names derived from the instance: `<base>-<kind>-runtime` (ConfigMap with the pod's
  code), `<base>-<kind>-results` (PVC), `<base>-<kind>` (Job);
- a ReadWriteOnce results PVC that outlives the Job (and, retained on delete, the
  stack), read back by `k3infra bench|accuracy fetch` through a reader pod;
- the API key from the serving Secret as `OPENAI_API_KEY` (never in argv), offline Hub
  access, a writable HOME on an emptyDir;
- a restricted pod with no API token and no service links, placed beside a serving pod;
- one attempt (a retried run would mix two runs' evidence) under a deadline.

Pure builders (no Pulumi: `benchmarks/gpu_start.py` renders the benchmark's arguments on
a host without it); the Pulumi side is `k3infra.clientjob_component.ClientJob`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from k3infra import origin
from k3infra.podsecurity import pod_security_context

RESULTS_DIR = "/results"


@dataclass(frozen=True)
class JobNames:
    base: str
    kind: str           # "bench" | "accuracy"

    @property
    def configmap(self) -> str:
        return f"{self.base}-{self.kind}-runtime"

    @property
    def pvc(self) -> str:
        return f"{self.base}-{self.kind}-results"

    @property
    def job(self) -> str:
        return f"{self.base}-{self.kind}"


def results_pvc(names: JobNames, namespace: str, labels: dict, *, size_gi: int,
                storage_class: Optional[str], component: str) -> dict:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": f"{size_gi}Gi"}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": names.pvc, "namespace": namespace,
                         "labels": {**labels, "app.kubernetes.io/component": component}},
            "spec": spec}


def client_env(api_key_secret: str, api_key_secret_key: str, extra: Sequence[dict]) -> list[dict]:
    """The key as OPENAI_API_KEY (both clients send it as a Bearer token), then the
    caller's variables, then what every client pod sets."""
    return origin.entries(client_env_parts(
        api_key_secret, api_key_secret_key,
        [origin.Tagged(e, origin.k3infra("the client's own")) for e in extra]))


def client_env_parts(api_key_secret: str, api_key_secret_key: str,
                     extra: Sequence[origin.Tagged]) -> list[origin.Tagged]:
    """`client_env`, each entry tagged with its origin (k3infra.origin)."""
    return [origin.secret_env("OPENAI_API_KEY", api_key_secret, api_key_secret_key,
                              origin.stack("apiKey", "[secret]", f"the serving API key, read "
                                           f"from the Secret {api_key_secret}")),
            *extra,
            origin.env("HF_HUB_OFFLINE", "1", origin.k3infra("a client never reaches the Hub")),
            origin.env("HOME", "/tmp", origin.k3infra("a writable home on the pod's /tmp")),
            origin.env("PYTHONDONTWRITEBYTECODE", "1", origin.k3infra(
                "no bytecode written beside the mounted code")),
            origin.env("PYTHONUNBUFFERED", "1", origin.k3infra("log lines as they happen"))]


def client_job(names: JobNames, namespace: str, pod_labels: dict, *, annotations: dict,
               deadline_seconds: int, placement: dict, containers: list[dict],
               volumes: list[dict], init_containers: Sequence[dict] = (),
               pod_extra: Optional[dict] = None) -> dict:
    spec = {
        "restartPolicy": "Never",
        **(pod_extra or {}),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        **placement,
        **({"initContainers": list(init_containers)} if init_containers else {}),
        "containers": containers,
        "volumes": volumes,
    }
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": names.job, "namespace": namespace, "labels": pod_labels,
                         "annotations": annotations},
            # One attempt: a retried run would mix two runs' evidence.
            "spec": {"backoffLimit": 0, "activeDeadlineSeconds": deadline_seconds,
                     "template": {"metadata": {"labels": pod_labels}, "spec": spec}}}
