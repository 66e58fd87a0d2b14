"""Kubernetes side of the weights: the runtime ConfigMap, the storage (one shared RWX PVC,
or one local PersistentVolume per serving node), the prefetch Job(s), the gate that runs
in the serving container before every `vllm serve` start, and the periodic audit.

Pure: (receipt, config, names, image) -> manifest dicts. The runtime that runs in pods
(k3infra/weights/{tree,verify,gate,sources,prefetch,__main__}.py, standard library +
huggingface_hub) reaches them through the ConfigMap, mounted as the package `k3weights`,
so every weights container runs in the engine image with nothing extra to build. No
container runs a ConfigMap file directly: the bootstrap inlined in the pod spec
(pod/bootstrap.py) checks each file against the digest rendered here first.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from k3infra import checkov_skips, ephemeral, origin, placement, podfiles
from k3infra.origin import Origin, Tagged, entries, k3infra, receipt as from_receipt, stack, words
from k3infra.podsecurity import container_security_context, pod_security_context
from k3infra.config import StackConfig
from k3infra.receipt import Receipt
from k3infra.weights import RUNTIME_FILES, SHARED_FILES, fanout, runtime_paths
from k3infra.weights.store import ALLOW_HTTP_ENV as STORE_ALLOW_HTTP_ENV
from k3infra.weights.store import ENDPOINT_ENV as STORE_ENDPOINT_ENV
from k3infra.weights.store import REGION_ENV as STORE_REGION_ENV
from k3infra.weights.store import VIRTUAL_HOSTED_ENV as STORE_VIRTUAL_HOSTED_ENV
from k3infra.weights.store import PART_BYTES as STORE_PART_BYTES
from k3infra.weights.store import PARTS_ENV as STORE_PARTS_ENV
from k3infra.weights.store import PARTS_IN_FLIGHT as STORE_PARTS_IN_FLIGHT
from k3infra.weights.prefetch import DOWNLOAD_WORKERS

WEIGHTS_ROOT = "/weights"               # where the weights volume is mounted in pods
RUNTIME_DIR = "/etc/k3/weights"         # the runtime ConfigMap's mount
RUNTIME_PACKAGE = "k3weights"           # the runtime package's name inside pods
POD_SCRIPTS = ("prefetch.sh", "check-lock.sh")
LOCK_KEY = "lock.json"
GATE_STATE_DIR = "/var/run/k3-gate"     # stamps mode: the pod-private record (an emptyDir)
# The weights pods' /tmp (an emptyDir, HOME of the prefetch): the runtime's copy and the
# logs for a gate; for the prefetch also huggingface_hub's and hf_xet's state and at most
# hf_xet's chunk cache (10 GB where its build enables one; xet-runtime's chunk_cache.rs).
GATE_TMP_GI = 1
AUDIT_START_DEADLINE_SECONDS = 3600
PREFETCH_TMP_GI = 12
# The serving container's entrypoint: the gate, then vLLM (exec: vLLM is PID 1's child
# no more, signals reach it). It runs on every container start, restarts included.
GATE_CHECK = ('python3 -c "$K3_RUNTIME_BOOTSTRAP" gate "$K3_TREE" --lock "$K3_GATE_LOCK" '
              '--expect-digest "$K3_EXPECT_TREE_DIGEST" --repo "$K3_REPO" '
              '--revision "$K3_REVISION" --mode "$K3_GATE_MODE" --state-dir "$K3_GATE_STATE" '
              '--workers "$K3_HASH_WORKERS"')
GATE_SCRIPT = GATE_CHECK + ' || exit 1; exec "$@"'

# The prefetch container's entrypoint: the bootstrap checks the runtime files, then runs
# prefetch.sh from the verified copies.
PREFETCH_SCRIPT = 'exec python3 -c "$K3_RUNTIME_BOOTSTRAP" sh prefetch.sh'


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
    """What the weights contribute to the serving pod and to pods that only read them."""

    model_dir: str
    model_dir_origin: Origin = field(default_factory=lambda: k3infra("the model directory"))
    volumes: list[dict] = field(default_factory=list)
    main_mounts: list[dict] = field(default_factory=list)     # the weights, read-only
    # The gate in the serving container: its entrypoint prefix, env (tagged with its
    # origins, k3infra.origin) and extra mounts.
    gate_command: list[str] = field(default_factory=list)
    gate_env: list[Tagged] = field(default_factory=list)
    gate_mounts: list[dict] = field(default_factory=list)
    # node-local: the per-replica claim of a local PersistentVolume.
    claim_templates: list[dict] = field(default_factory=list)
    # A pod outside the StatefulSet that reads the weights (the benchmark): the gate as
    # its init container, and the volumes that needs (weights read-only, runtime).
    reader_init_containers: list[dict] = field(default_factory=list)
    reader_volumes: list[dict] = field(default_factory=list)


def names(base: str) -> dict[str, str]:
    return {"configmap": f"{base}-weights-runtime", "pvc": f"{base}-weights",
            "job": f"{base}-weights-prefetch",
            # CronJob names stay within 52 characters for the longest instance name.
            "audit": f"{base}-audit",
            "volume": "weights", "runtime": "weights-runtime", "gate_state": "gate-state"}


def node_local_claim(base: str, ordinal: int) -> str:
    """The PVC the StatefulSet's `weights` claim template gives replica `ordinal`
    (<template>-<statefulset>-<ordinal>); the prefetch Job of that replica mounts it
    first, so the local PV binds to the node that Job ran on."""
    return f"{names(base)['volume']}-{base}-{ordinal}"


def layout(receipt: Receipt, cfg: StackConfig) -> WeightsLayout:
    return WeightsLayout(receipt.model.repo, cfg.weights_revision)


def tree_origin(receipt: Receipt, cfg: StackConfig) -> Origin:
    return k3infra(f"the pinned tree on the weights volume: receipt model.repo "
                   f"{receipt.model.repo} at k3:weightsRevision = {cfg.weights_revision}")


def expected_tree_digest(receipt: Receipt, lock_text: Optional[str]) -> str:
    """The digest every weights container holds the tree to, in every profile: the
    stack's own lock (k3:weights.lockFile, already checked against the receipt unless
    the profile is custom) or else the receipt's."""
    if lock_text is None:
        return receipt.model.tree_digest
    return str(json.loads(lock_text)["tree_digest"])


def runtime_files() -> dict[str, str]:
    """ConfigMap data: the runtime package and the pod scripts (a fresh dict: callers add
    the lock to it)."""
    return dict(_runtime_sources())


# Read once per process: package files do not change under a running program, and every
# weights pod of every replica asks for them (a 64-replica node-local render read and
# hashed them ~6000 times: 49 s; issue 28).
@functools.lru_cache(maxsize=1)
def _runtime_sources() -> tuple[tuple[str, str], ...]:
    data = {f"{RUNTIME_PACKAGE}.{name}": path.read_text() for name, path in runtime_paths().items()}
    data.update(podfiles.package_files("k3infra.weights", POD_SCRIPTS, "pod"))
    return tuple(data.items())


def bootstrap_source() -> str:
    return podfiles.package_files("k3infra.weights", ["bootstrap.py"], "pod")["bootstrap.py"]


def runtime_configmap_name(base: str, lock_text: Optional[str]) -> str:
    """Named by its content: a new runtime is a new ConfigMap, so pods of the previous
    template (a canary partition, OnDelete) keep the files their pinned digests name and
    still pass the bootstrap on a restart."""
    tag = hashlib.sha256(runtime_pins(lock_text).encode("ascii")).hexdigest()[:8]
    return f"{names(base)['configmap']}-{tag}"


def runtime_configmap(base: str, namespace: str, labels: dict, lock_text: Optional[str]) -> dict:
    data = runtime_files()
    if lock_text is not None:
        data[LOCK_KEY] = lock_text
    # Immutable: an in-place edit is refused by the API server (and would be refused by
    # the bootstrap's digest check anyway).
    return podfiles.configmap({"name": runtime_configmap_name(base, lock_text),
                               "namespace": namespace, "labels": labels}, data, immutable=True)


def _runtime_items(has_lock: bool) -> dict[str, str]:
    """ConfigMap key -> path in the runtime volume."""
    items = {f"{RUNTIME_PACKAGE}.{n}": f"{RUNTIME_PACKAGE}/{n}"
             for n in (*RUNTIME_FILES, *SHARED_FILES)}
    items.update({s: s for s in POD_SCRIPTS})
    if has_lock:
        items[LOCK_KEY] = LOCK_KEY
    return items


@functools.lru_cache(maxsize=16)
def runtime_pins(lock_text: Optional[str]) -> str:
    """K3_RUNTIME_SHA256: path in the runtime volume -> sha256 of what Pulumi ships."""
    data = runtime_files()
    if lock_text is not None:
        data[LOCK_KEY] = lock_text
    pins = {path: hashlib.sha256(data[key].encode("utf-8")).hexdigest()
            for key, path in _runtime_items(lock_text is not None).items()}
    return json.dumps(pins, sort_keys=True, separators=(",", ":"))


def _runtime_volume(base: str, lock_text: Optional[str]) -> dict:
    return podfiles.volume(names(base)["runtime"], runtime_configmap_name(base, lock_text),
                           _runtime_items(lock_text is not None))


def _storage_volume(base: str, cfg: StackConfig, ordinal: int = 0) -> dict:
    """The weights volume of a pod outside the StatefulSet (Job, audit, benchmark)."""
    claim = names(base)["pvc"] if cfg.weights.mode == "shared" else node_local_claim(base, ordinal)
    return {"name": names(base)["volume"], "persistentVolumeClaim": {"claimName": claim}}


def _claim_spec(cfg: StackConfig) -> dict:
    spec: dict[str, Any] = {"resources": {"requests": {"storage": f"{cfg.weights.size_gi}Gi"}}}
    if cfg.weights.mode == "shared":
        spec["accessModes"] = ["ReadWriteMany"]
        if cfg.weights.storage_class:
            spec["storageClassName"] = cfg.weights.storage_class
    else:
        spec["accessModes"] = ["ReadWriteOnce"]
        spec["storageClassName"] = cfg.weights.local_storage_class
    return spec


def shared_pvc(base: str, namespace: str, labels: dict, cfg: StackConfig) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": names(base)["pvc"], "namespace": namespace, "labels": labels},
            "spec": _claim_spec(cfg)}


def node_local_pvcs(base: str, namespace: str, labels: dict, cfg: StackConfig) -> list[dict]:
    """One claim per replica, named as the StatefulSet's claim template names them (the
    StatefulSet adopts them). Each binds a local PersistentVolume of
    k3:weights.localStorageClass on the node where its prefetch Job pod lands
    (WaitForFirstConsumer), and the PV's node affinity then holds the serving replica to
    that node: the namespace needs no hostPath, so it stays `restricted`."""
    return [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": node_local_claim(base, i), "namespace": namespace,
                          "labels": labels},
             "spec": _claim_spec(cfg)} for i in range(cfg.replicas)]


# The runtime's own variables: what the bootstrap and the gate read, set by k3infra.
RUNTIME_DIR_ORIGIN = k3infra("the mount of the runtime ConfigMap (k3infra/weights/*.py and "
                             "pod/*.sh as files)")
PINS_ORIGIN = k3infra("sha256 of each file of the runtime ConfigMap, which the bootstrap "
                      "checks before any of them runs")
BOOTSTRAP_ORIGIN = k3infra("k3infra/weights/pod/bootstrap.py, in the pod spec because it "
                           "checks the ConfigMap (docs/weights.md)")


def _base_env(receipt: Receipt, cfg: StackConfig, lay: WeightsLayout,
              lock_text: Optional[str]) -> list[Tagged]:
    digest_origin = (from_receipt("model.tree_digest") if lock_text is None else
                     stack("weights.lockFile", cfg.weights.lock_file, "its tree_digest"))
    return [origin.env("K3_REPO", lay.repo, from_receipt("model.repo")),
            origin.env("K3_REVISION", lay.revision, stack("weightsRevision", lay.revision)),
            origin.env("K3_TREE", lay.tree, tree_origin(receipt, cfg)),
            origin.env("K3_LOCK", lay.lock, k3infra("the lock beside the tree (the prefetch "
                                                    "writes it)")),
            origin.env("K3_EXPECT_TREE_DIGEST", expected_tree_digest(receipt, lock_text),
                       digest_origin),
            origin.env("K3_HASH_WORKERS", str(cfg.weights.hash_workers),
                       stack("weights.hashWorkers", cfg.weights.hash_workers)),
            origin.env("K3_RUNTIME_DIR", RUNTIME_DIR, RUNTIME_DIR_ORIGIN),
            origin.env("K3_RUNTIME_SHA256", runtime_pins(lock_text), PINS_ORIGIN),
            origin.env("K3_RUNTIME_BOOTSTRAP", bootstrap_source(), BOOTSTRAP_ORIGIN),
            origin.env("K3_RUNTIME_COPY_DIR", "/tmp", k3infra(
                "where the bootstrap copies the verified files it runs"))]


def _gate_env(receipt: Receipt, cfg: StackConfig, lay: WeightsLayout,
              lock_text: Optional[str], mode: str, mode_origin: Origin) -> list[Tagged]:
    lock = f"{RUNTIME_DIR}/{LOCK_KEY}" if lock_text is not None else lay.lock
    lock_origin = (stack("weights.lockFile", cfg.weights.lock_file, "shipped in the runtime "
                         "ConfigMap") if lock_text is not None
                   else k3infra("the lock beside the tree"))
    return [*_base_env(receipt, cfg, lay, lock_text),
            origin.env("K3_GATE_LOCK", lock, lock_origin),
            origin.env("K3_GATE_MODE", mode, mode_origin),
            origin.env("K3_GATE_STATE", GATE_STATE_DIR, k3infra(
                "the record of stamps mode, private to the pod (an emptyDir)"))]


def _serving_gate_mode(cfg: StackConfig) -> tuple[str, Origin]:
    return cfg.weights.gate_mode, stack("weights.gateMode", cfg.weights.gate_mode)


# The gate outside the serving container (the audit, a reader's init container) always
# reads the whole tree.
_FULL_READ = ("warm", k3infra("a full read-and-hash: this gate runs once per pod"))


def _prefetch_env(receipt: Receipt, cfg: StackConfig, lay: WeightsLayout,
                  lock_text: Optional[str], hf_token_secret: Optional[str]) -> list[Tagged]:
    env = [*_base_env(receipt, cfg, lay, lock_text),
           # hf_xet's high-performance mode (huggingface/hub-docs PR 2260), and the stall
           # watchdog's window (k3infra/weights/prefetch.py, docs/coldstart.md).
           origin.env("HF_XET_HIGH_PERFORMANCE", "1", k3infra(
               "hf_xet high-performance mode for the download")),
           origin.env("K3_DOWNLOAD_STALL_SECONDS", str(cfg.cold_start.download_stall_seconds),
                      stack("coldStart.downloadStallSeconds",
                            cfg.cold_start.download_stall_seconds)),
           origin.env("HOME", "/tmp", k3infra("a writable home on the pod's /tmp"))]
    store = cfg.weights.store
    if store is not None:
        # The origin is your store: no Hub endpoint, no HF token in this pod.
        return env + store_env(cfg)
    if cfg.weights.hub_endpoint:
        env.append(origin.env("HF_ENDPOINT", cfg.weights.hub_endpoint,
                              stack("weights.hubEndpoint", cfg.weights.hub_endpoint)))
    if hf_token_secret:
        env.append(origin.secret_env("HF_TOKEN", hf_token_secret, "token", stack(
            "hfToken", "[secret]", f"read from the Secret {hf_token_secret}")))
    return env


# The keys a credentials Secret holds, per store scheme (the provider's own variable
# names, read by obstore in the prefetch pod): name -> required.
STORE_SECRET_KEYS = {
    "s3": {"AWS_ACCESS_KEY_ID": True, "AWS_SECRET_ACCESS_KEY": True, "AWS_SESSION_TOKEN": False},
    "gs": {"GOOGLE_SERVICE_ACCOUNT_KEY": True},
    "az": {"AZURE_STORAGE_ACCOUNT_KEY": False, "AZURE_STORAGE_SAS_KEY": False},
}


def store_parts_in_flight(cfg: StackConfig) -> int:
    """Ranged GETs in flight per file, so that the prefetch's read buffers (download
    workers x parts x part size) stay within a quarter of its container's memory limit:
    8 with the default 64 Gi, fewer on a small node."""
    # memory_max_gi: the limit, or the request where memoryLimitGi is null (no limit set).
    budget = cfg.weights.prefetch_resources.memory_max_gi * 2**30 / 4
    per_part = DOWNLOAD_WORKERS * STORE_PART_BYTES
    return max(1, min(STORE_PARTS_IN_FLIGHT, int(budget // per_part)))


def store_env(cfg: StackConfig) -> list[Tagged]:
    """The store's options (k3weights.store reads K3_STORE_*) and its credentials, each key
    from the Secret by reference: the values never enter the manifest or the state."""
    store = cfg.weights.store
    env = []
    for name, value, key in ((STORE_ENDPOINT_ENV, store.endpoint, "endpoint"),
                             (STORE_REGION_ENV, store.region, "region"),
                             (STORE_ALLOW_HTTP_ENV, "true" if store.allow_http else None,
                              "allowHttp"),
                             (STORE_VIRTUAL_HOSTED_ENV,
                              "true" if store.virtual_hosted_style else None,
                              "virtualHostedStyle")):
        if value:
            env.append(origin.env(name, value, stack(f"weights.store.{key}", value)))
    env.append(origin.env(STORE_PARTS_ENV, str(store_parts_in_flight(cfg)), k3infra(
        "ranged reads in flight per file, within a quarter of "
        "k3:weights.prefetchResources.memoryLimitGi (memoryGi where it is null)")))
    if store.credentials_secret:
        env += [Tagged({"name": key, "valueFrom": {"secretKeyRef": {
                    "name": store.credentials_secret, "key": key,
                    **({} if required else {"optional": True})}}},
                       stack("weights.store.credentialsSecret", store.credentials_secret,
                             f"the key {key}, by reference"))
                for key, required in STORE_SECRET_KEYS[store.scheme].items()]
    return env


def _runtime_mounts(base: str) -> list[dict]:
    return [{"name": names(base)["runtime"], "mountPath": RUNTIME_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"}]


def _gate_container(name: str, image: Any, receipt: Receipt, cfg: StackConfig, base: str,
                    lock_text: Optional[str]) -> dict:
    """The gate alone (warm mode, read-only mount), for pods whose main container is not
    vLLM: the audit, and the init container of a pod that reads the weights."""
    return origin.container({
        "name": name, "image": Tagged(image, origin.engine_image(cfg)),
        "imagePullPolicy": "IfNotPresent",
        "command": [words(k3infra("the weights gate (the bootstrap, then the gate; a refusal "
                                  "fails the container), then `true`"),
                          "sh", "-c", GATE_SCRIPT, f"k3-{name}", "true")],
        "env": _gate_env(receipt, cfg, layout(receipt, cfg), lock_text, *_FULL_READ),
        # Disk: the runtime's copy in /tmp and the logs.
        "resources": ephemeral.with_storage(cfg.weights.gate_resources.manifest(),
                                            ephemeral.LOGS_GI, GATE_TMP_GI),
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": names(base)["volume"], "mountPath": WEIGHTS_ROOT,
                          "readOnly": True}, *_runtime_mounts(base)]})


def _weights_pod(cfg: StackConfig, base: str, container: dict, lock_text: Optional[str],
                 restart: str, instance: str, ordinal: int = 0) -> dict:
    spec: dict[str, Any] = {
        "restartPolicy": restart,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        **cfg.engine.pull_secret_refs(),
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [_storage_volume(base, cfg, ordinal), _runtime_volume(base, lock_text),
                    {"name": "tmp", "emptyDir": {}}],
    }
    if cfg.weights.mode == "node-local":
        # The node-local copy must land on (and be read on) the GPU nodes that serve.
        spec["affinity"] = {"nodeAffinity": placement.node_affinity(
            [cfg.gpu_product], placement.pool_of(cfg.node_pool.provider, instance))}
        spec["tolerations"] = placement.tolerations()
    return spec


def prefetch_jobs(receipt: Receipt, cfg: StackConfig, base: str, namespace: str, labels: dict,
                  image: Any, hf_token_secret: Optional[str], lock_text: Optional[str]) -> list[dict]:
    """The prefetch: one Job on the shared volume, or one per replica's local volume
    (the only pods that hold the HF token and reach the Hub)."""
    lay = layout(receipt, cfg)
    pod_labels = {**labels, "app.kubernetes.io/component": "weights-prefetch"}
    per_node = cfg.weights.mode == "node-local"
    jobs = []
    for i in range(cfg.replicas if per_node else 1):
        # Where this copy's bytes come from, in order (k3infra/weights/fanout.py).
        sources = origin.env("K3_WEIGHTS_SOURCES", fanout.sources_env(cfg, base, namespace, i),
                             stack("weights.source", cfg.weights.source,
                                   f"copy {i}: its sources in order, k3infra/weights/fanout.py"))
        container = origin.container({
            "name": "prefetch", "image": Tagged(image, origin.engine_image(cfg)),
            "imagePullPolicy": "IfNotPresent",
            "command": [words(k3infra("the bootstrap checks the runtime files, then runs "
                                      "k3infra/weights/pod/prefetch.sh from the verified copies"),
                              "sh", "-c", PREFETCH_SCRIPT)],
            "env": [*_prefetch_env(receipt, cfg, lay, lock_text, hf_token_secret), sources],
            "resources": ephemeral.with_storage(cfg.weights.prefetch_resources.manifest(),
                                                1, PREFETCH_TMP_GI),
            "securityContext": container_security_context(),
            "volumeMounts": [{"name": names(base)["volume"], "mountPath": WEIGHTS_ROOT},
                             *_runtime_mounts(base)]})
        spec = _weights_pod(cfg, base, container, lock_text, "OnFailure",
                            labels["app.kubernetes.io/instance"], i)
        template_labels = pod_labels
        store = cfg.weights.store
        if store is not None and store.service_account:
            # Workload identity: the cloud maps this ServiceAccount to its role (EKS IRSA
            # or Pod Identity, GKE); the token the webhooks project is theirs, not the
            # API server's (automountServiceAccountToken stays false).
            spec["serviceAccountName"] = store.service_account
            if store.scheme == "az":
                # Azure workload identity's webhook acts on labelled pods only.
                template_labels = {**pod_labels, "azure.workload.identity/use": "true"}
        if per_node:
            # One replica's volume per node: the prefetch pods spread like the replicas.
            spec["affinity"]["podAntiAffinity"] = placement.one_replica_per_node(
                {"app.kubernetes.io/component": "weights-prefetch",
                 "app.kubernetes.io/instance": labels["app.kubernetes.io/instance"]})
        name = f"{names(base)['job']}-{i}" if per_node else names(base)["job"]
        jobs.append({"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {"name": name, "namespace": namespace, "labels": pod_labels,
                                  "annotations": checkov_skips.annotations(
                                      checkov_skips.ENGINE_IMAGE_UID)},
                     "spec": {"backoffLimit": 20,
                              "template": {"metadata": {"labels": template_labels}, "spec": spec}}})
    return jobs


def audit_cronjobs(receipt: Receipt, cfg: StackConfig, base: str, namespace: str, labels: dict,
                   image: Any, lock_text: Optional[str]) -> list[dict]:
    """A periodic full read-and-hash of every copy (k3:weights.auditSchedule), read-only:
    a copy altered between engine starts shows up as a failed Job (alert on it)."""
    if cfg.weights.audit_schedule is None:
        return []
    pod_labels = {**labels, "app.kubernetes.io/component": "weights-audit"}
    out = []
    for i in range(cfg.replicas if cfg.weights.mode == "node-local" else 1):
        container = _gate_container("audit", image, receipt, cfg, base, lock_text)
        spec = _weights_pod(cfg, base, container, lock_text, "Never",
                            labels["app.kubernetes.io/instance"], i)
        spec["volumes"][0]["persistentVolumeClaim"]["readOnly"] = True
        name = names(base)["audit"] + (f"-{i}" if cfg.weights.mode == "node-local" else "")
        out.append({"apiVersion": "batch/v1", "kind": "CronJob",
                    "metadata": {"name": name, "namespace": namespace, "labels": pod_labels,
                                 "annotations": checkov_skips.annotations(
                                     checkov_skips.ENGINE_IMAGE_UID)},
                    "spec": {"schedule": cfg.weights.audit_schedule,
                             "concurrencyPolicy": "Forbid", "successfulJobsHistoryLimit": 1,
                             # A run the controller could not start on time (it was down,
                             # or the previous audit still ran) starts within the hour or
                             # waits for the next schedule; without a deadline the
                             # controller stops starting a CronJob after 100 missed ones.
                             "startingDeadlineSeconds": AUDIT_START_DEADLINE_SECONDS,
                             "failedJobsHistoryLimit": 3,
                             "jobTemplate": {"spec": {"backoffLimit": 0, "template": {
                                 "metadata": {"labels": pod_labels}, "spec": spec}}}}})
    return out


def prefetch_timeout_seconds(receipt: Receipt, cfg: StackConfig) -> int:
    """How long `pulumi up` waits for a prefetch Job that fills from the Hub: download at
    the expected bandwidth, twice over for retries and hashing, plus 30 minutes (in-cluster
    fills: k3infra/weights/fanout.py)."""
    return fanout.hub_fill_seconds(receipt, cfg)


def gate_summary(receipt: Receipt, cfg: StackConfig) -> str:
    """What render prints about the check before every engine start."""
    gb = receipt.model.size_bytes / 1e9
    if cfg.weights.gate_mode == "warm":
        return (f"warm: full read-and-hash of {gb:.1f} GB against the pinned lock before every "
                "vLLM start (container restarts included); the reads warm the page cache the "
                "engine loads from")
    return (f"stamps: full read-and-hash of {gb:.1f} GB at pod creation, then this pod's own "
            f"stamps ({GATE_STATE_DIR}, an emptyDir) on container restarts; for nodes whose "
            "RAM cannot hold the tree")


def serving_parts(receipt: Receipt, cfg: StackConfig, base: str, image: Any,
                  lock_text: Optional[str]) -> WeightsParts:
    """The weights mount (read-only), the gate that prefixes the vLLM command, and the
    volumes. Serving pods get no HF token and never fetch."""
    lay = layout(receipt, cfg)
    weights_mount = {"name": names(base)["volume"], "mountPath": WEIGHTS_ROOT, "readOnly": True}
    runtime = _runtime_volume(base, lock_text)
    state = {"name": names(base)["gate_state"], "emptyDir": {"sizeLimit": "64Mi"}}
    volumes = [runtime, state]
    claims: list[dict] = []
    if cfg.weights.mode == "shared":
        volumes.insert(0, dict(_storage_volume(base, cfg),
                               persistentVolumeClaim={"claimName": names(base)["pvc"],
                                                      "readOnly": True}))
    else:
        claims.append({"metadata": {"name": names(base)["volume"]}, "spec": _claim_spec(cfg)})
    reader = dict(_storage_volume(base, cfg))
    reader["persistentVolumeClaim"] = dict(reader["persistentVolumeClaim"], readOnly=True)
    return WeightsParts(
        model_dir=lay.tree,
        model_dir_origin=tree_origin(receipt, cfg),
        volumes=volumes,
        main_mounts=[weights_mount],
        gate_command=["sh", "-c", GATE_SCRIPT, "k3-gate"],
        gate_env=_gate_env(receipt, cfg, lay, lock_text, *_serving_gate_mode(cfg)),
        gate_mounts=[{"name": names(base)["runtime"], "mountPath": RUNTIME_DIR, "readOnly": True},
                     {"name": names(base)["gate_state"], "mountPath": GATE_STATE_DIR}],
        claim_templates=claims,
        reader_init_containers=[_gate_container("weights-gate", image, receipt, cfg, base,
                                                lock_text)],
        reader_volumes=[reader, runtime])


# --- the same runtime for a Docker host's containers (k3infra/host) ------------------------

def runtime_file_map(lock_text: Optional[str]) -> dict[str, str]:
    """The runtime volume's files as container path -> content (uploaded into a Docker
    host's containers, or Compose configs): the paths and bytes the pods mount, so the
    bootstrap's K3_RUNTIME_SHA256 check holds there too."""
    data = runtime_files()
    if lock_text is not None:
        data[LOCK_KEY] = lock_text
    return {f"{RUNTIME_DIR}/{path}": data[key]
            for key, path in _runtime_items(lock_text is not None).items()}


def prefetch_env_map(receipt: Receipt, cfg: StackConfig, lock_text: Optional[str]) -> dict[str, str]:
    """The prefetch container's plain env (the HF token is a secret the host adds)."""
    return {e["name"]: e["value"]
            for e in entries(_prefetch_env(receipt, cfg, layout(receipt, cfg), lock_text, None))}


def gate_env_map(receipt: Receipt, cfg: StackConfig, lock_text: Optional[str]) -> dict[str, str]:
    """The gate's env in the serving container (k3:weights.gateMode)."""
    return {e["name"]: e["value"] for e in entries(_gate_env(
        receipt, cfg, layout(receipt, cfg), lock_text, *_serving_gate_mode(cfg)))}
