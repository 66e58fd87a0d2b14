"""Kubernetes side of the weights: the runtime ConfigMap, the storage (shared RWX PVC or
node-local hostPath), the prefetch Job, and the serving pod's gating init container.

Pure: (receipt, config, names, image) -> manifest dicts. The runtime that runs in pods
(k3infra/weights/{tree,verify,prefetch,__main__}.py, standard library + huggingface_hub)
reaches them through the ConfigMap, mounted as the package `k3weights`, so the prefetch
Job and the gate run in the engine image with nothing extra to build.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Optional

from k3infra import checkov_skips, placement
from k3infra.podsecurity import container_security_context, pod_security_context
from k3infra.config import StackConfig
from k3infra.receipt import Receipt

WEIGHTS_ROOT = "/weights"               # where the weights volume is mounted in pods
RUNTIME_DIR = "/etc/k3/weights"         # the runtime ConfigMap's mount
RUNTIME_PACKAGE = "k3weights"           # the runtime package's name inside pods
POD_SCRIPTS = ("prefetch.sh", "check-lock.sh", "gate.sh")
LOCK_KEY = "lock.json"
# Hashing workers in the Job and the gate: a B300 node has 192 vCPUs; the gate's fast
# path is stat calls, so this only matters after a change on disk.
HASH_WORKERS = 32


@dataclass(frozen=True)
class WeightsLayout:
    """Paths of the pinned tree and its lock on the weights volume."""

    repo: str
    revision: str

    @property
    def repo_dir(self) -> str:
        return f"{WEIGHTS_ROOT}/{self.repo.replace('/', '--')}"

    @property
    def tree(self) -> str:
        return f"{self.repo_dir}/{self.revision}"

    @property
    def lock(self) -> str:
        return f"{self.repo_dir}/{self.revision}.lock.json"


@dataclass
class WeightsParts:
    """What the weights contribute to the serving pod."""

    model_dir: str
    volumes: list[dict] = field(default_factory=list)
    init_containers: list[dict] = field(default_factory=list)
    main_mounts: list[dict] = field(default_factory=list)


def names(base: str) -> dict[str, str]:
    return {"configmap": f"{base}-weights-runtime", "pvc": f"{base}-weights",
            "job": f"{base}-weights-prefetch", "volume": "weights", "runtime": "weights-runtime"}


def layout(receipt: Receipt, cfg: StackConfig) -> WeightsLayout:
    return WeightsLayout(receipt.model.repo, cfg.weights_revision)


def runtime_files() -> dict[str, str]:
    """ConfigMap data: the runtime package and the pod scripts."""
    from k3infra.weights import runtime_paths

    data = {f"{RUNTIME_PACKAGE}.{name}": path.read_text() for name, path in runtime_paths().items()}
    pkg = resources.files("k3infra.weights")
    for script in POD_SCRIPTS:
        data[script] = pkg.joinpath("pod", script).read_text()
    return data


def runtime_configmap(base: str, namespace: str, labels: dict, lock_text: Optional[str]) -> dict:
    data = runtime_files()
    if lock_text is not None:
        data[LOCK_KEY] = lock_text
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": names(base)["configmap"], "namespace": namespace,
                         "labels": labels},
            "data": data}


def _runtime_volume(base: str, has_lock: bool) -> dict:
    from k3infra.weights import runtime_paths

    items = [{"key": f"{RUNTIME_PACKAGE}.{n}", "path": f"{RUNTIME_PACKAGE}/{n}"}
             for n in runtime_paths()]
    items += [{"key": s, "path": s} for s in POD_SCRIPTS]
    if has_lock:
        items.append({"key": LOCK_KEY, "path": LOCK_KEY})
    return {"name": names(base)["runtime"],
            "configMap": {"name": names(base)["configmap"], "items": items, "defaultMode": 0o444}}


def _storage_volume(base: str, cfg: StackConfig) -> dict:
    if cfg.weights.mode == "shared":
        return {"name": names(base)["volume"],
                "persistentVolumeClaim": {"claimName": names(base)["pvc"]}}
    # node-local: the node's NVMe under the configured root; only that path is mounted.
    return {"name": names(base)["volume"],
            "hostPath": {"path": cfg.weights.node_local_root, "type": "DirectoryOrCreate"}}


def shared_pvc(base: str, namespace: str, labels: dict, cfg: StackConfig) -> dict:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"],
                            "resources": {"requests": {"storage": f"{cfg.weights.size_gi}Gi"}}}
    if cfg.weights.storage_class:
        spec["storageClassName"] = cfg.weights.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": names(base)["pvc"], "namespace": namespace, "labels": labels},
            "spec": spec}


def _env(receipt: Receipt, cfg: StackConfig, lay: WeightsLayout,
         hf_token_secret: Optional[str]) -> list[dict]:
    env = [{"name": "K3_REPO", "value": lay.repo},
           {"name": "K3_REVISION", "value": lay.revision},
           {"name": "K3_TREE", "value": lay.tree},
           {"name": "K3_LOCK", "value": lay.lock},
           {"name": "K3_WEIGHTS_MODE", "value": cfg.weights.mode},
           {"name": "K3_HASH_WORKERS", "value": str(HASH_WORKERS)},
           {"name": "K3_RUNTIME_DIR", "value": RUNTIME_DIR},
           {"name": "PYTHONPATH", "value": RUNTIME_DIR},
           {"name": "HF_XET_HIGH_PERFORMANCE", "value": "1"},
           {"name": "HOME", "value": "/tmp"}]
    if cfg.profile != "custom":
        env.append({"name": "K3_EXPECT_TREE_DIGEST", "value": receipt.model.tree_digest})
    if hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": hf_token_secret, "key": "token"}}})
    return env


def _container(name: str, image: Any, script: str, env: list[dict], base: str,
               resources_: dict) -> dict:
    return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", f"{RUNTIME_DIR}/{script}"], "env": env,
            "resources": resources_, "securityContext": container_security_context(),
            "volumeMounts": [{"name": names(base)["volume"], "mountPath": WEIGHTS_ROOT},
                             {"name": names(base)["runtime"], "mountPath": RUNTIME_DIR,
                              "readOnly": True},
                             {"name": "tmp", "mountPath": "/tmp"}]}


JOB_RESOURCES = {"requests": {"cpu": "16", "memory": "32Gi"},
                 "limits": {"cpu": "32", "memory": "64Gi"}}
GATE_RESOURCES = {"requests": {"cpu": "8", "memory": "8Gi"},
                  "limits": {"cpu": "32", "memory": "16Gi"}}


def prefetch_job(receipt: Receipt, cfg: StackConfig, base: str, namespace: str, labels: dict,
                 image: Any, hf_token_secret: Optional[str], has_lock: bool) -> dict:
    """The prefetch Job: one pod on the shared volume, or one per serving node."""
    lay = layout(receipt, cfg)
    pod_labels = {**labels, "app.kubernetes.io/component": "weights-prefetch"}
    per_node = cfg.weights.mode == "node-local"
    spec: dict[str, Any] = {
        "restartPolicy": "OnFailure",
        "automountServiceAccountToken": False,
        **cfg.engine.pull_secret_refs(),
        "securityContext": pod_security_context(),
        "containers": [_container("prefetch", image, "prefetch.sh",
                                  _env(receipt, cfg, lay, hf_token_secret), base,
                                  JOB_RESOURCES)],
        "volumes": [_storage_volume(base, cfg), _runtime_volume(base, has_lock),
                    {"name": "tmp", "emptyDir": {}}],
    }
    if per_node:
        # The node-local copy must land on the GPU nodes that will serve.
        spec["affinity"] = {
            "nodeAffinity": placement.node_affinity([cfg.gpu_product], placement.pool_of(
                cfg.node_pool.provider, labels["app.kubernetes.io/instance"])),
            "podAntiAffinity": placement.one_replica_per_node(
                {"app.kubernetes.io/component": "weights-prefetch",
                 "app.kubernetes.io/instance": labels["app.kubernetes.io/instance"]})}
        spec["tolerations"] = placement.tolerations()
    count = cfg.replicas if per_node else 1
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": names(base)["job"], "namespace": namespace, "labels": pod_labels,
                         "annotations": checkov_skips.annotations(checkov_skips.ENGINE_IMAGE_UID)},
            "spec": {"completions": count, "parallelism": count, "backoffLimit": 20,
                     "template": {"metadata": {"labels": pod_labels}, "spec": spec}}}


def prefetch_timeout_seconds(receipt: Receipt, cfg: StackConfig) -> int:
    """How long `pulumi up` waits for the prefetch Job: download at the expected
    bandwidth, twice over for retries and hashing, plus 30 minutes."""
    return math.ceil(2 * receipt.model.size_bytes / (cfg.weights.download_gbps * 1e9)) + 1800


def serving_parts(receipt: Receipt, cfg: StackConfig, base: str, image: Any,
                  hf_token_secret: Optional[str], has_lock: bool) -> WeightsParts:
    """Volumes, the gating init container and the read-only mount for vLLM."""
    lay = layout(receipt, cfg)
    gate = _container("weights-gate", image, "gate.sh",
                      _env(receipt, cfg, lay, hf_token_secret if cfg.weights.mode == "node-local"
                           else None), base, GATE_RESOURCES)
    return WeightsParts(
        model_dir=lay.tree,
        volumes=[_storage_volume(base, cfg), _runtime_volume(base, has_lock)],
        init_containers=[gate],
        main_mounts=[{"name": names(base)["volume"], "mountPath": WEIGHTS_ROOT, "readOnly": True}])


def runtime_env(receipt: Receipt, cfg: StackConfig) -> dict[str, str]:
    """The runtime's K3_* variables as plain name -> value (a Docker host's containers,
    k3infra/host): the same ones the pods get, without the HF token reference."""
    return {e["name"]: e["value"] for e in _env(receipt, cfg, layout(receipt, cfg), None)}
