"""Pure builders of the AccuracySmoke Job's objects: the runtime ConfigMap (runner and
task files), the results PVC and the Job. `k3infra accuracy fetch` reads the PVC back
with the benchmark's reader pod (k3infra.bench.cluster), by this Job's label.

The Job runs `runner.py` (standard library) in `k3:accuracy.image`, an image with
lm-eval and the tasks' datasets in its HF cache: it reads no weights, so it needs no
weights gate; it is placed beside a serving pod like the benchmark Job (same
placement helper) and talks to the Service with the key from the serving Secret.
"""
from __future__ import annotations

from importlib import resources

from k3infra import checkov_skips, clientjob, ephemeral, placement, podfiles
from k3infra.naming import ACCURACY_COMPONENT as COMPONENT
from k3infra.config import StackConfig
from k3infra.clientjob import RESULTS_DIR
from k3infra.podsecurity import container_security_context
from k3infra.receipt import Receipt

RUNTIME_DIR = "/etc/k3/accuracy"
TASKS_DIR = f"{RUNTIME_DIR}/tasks"
RUNNER = "runner.py"
ACCURACY_TMP_GI = 4             # the /tmp emptyDir: HOME and the datasets' copy
RESULTS_COMPONENT = "accuracy-results"
# The image's datasets cache is on a read-only root: lm-eval runs on a copy in the Job's
# scratch volume (runner.copy_datasets_cache says why).
DATASETS_COPY = "/tmp/hf-datasets"
JOB_SELECTOR = f"app.kubernetes.io/component={COMPONENT}"


def AccuracyNames(base: str) -> clientjob.JobNames:
    return clientjob.JobNames(base, "accuracy")


def task_files() -> dict[str, str]:
    tasks = resources.files("k3infra.accuracy").joinpath("tasks")
    return {p.name: p.read_text() for p in sorted(tasks.iterdir(), key=lambda p: p.name)
            if p.name.endswith(".yaml")}


def runtime_configmap(names: clientjob.JobNames, namespace: str, labels: dict) -> dict:
    return podfiles.configmap(
        {"name": names.configmap, "namespace": namespace, "labels": labels},
        {**podfiles.package_files("k3infra.accuracy", [RUNNER]), **task_files()})


def results_pvc(names: clientjob.JobNames, namespace: str, labels: dict, cfg: StackConfig) -> dict:
    return clientjob.results_pvc(names, namespace, labels, size_gi=cfg.accuracy.results_size_gi,
                                 storage_class=cfg.accuracy.results_storage_class,
                                 component=RESULTS_COMPONENT)


def runner_args(cfg: StackConfig, base_url: str) -> list[str]:
    a = cfg.accuracy
    return ["--endpoint", base_url, "--model", cfg.served_model_name, "--results", RESULTS_DIR,
            "--tasks-dir", TASKS_DIR, "--tasks", ",".join(a.tasks), "--limit", str(a.limit),
            "--max-tokens", str(a.max_tokens), "--seed", str(a.seed),
            "--concurrency", str(a.concurrency), "--timeout", str(a.timeout_minutes * 60),
            "--datasets-copy", DATASETS_COPY]


def accuracy_job(receipt: Receipt, cfg: StackConfig, *, names: clientjob.JobNames, namespace: str,
                 labels: dict, base_url: str, api_key_secret: str, api_key_secret_key: str,
                 serving_selector: dict) -> dict:
    # lm-eval's local-chat-completions sends the key as Bearer; datasets from the image.
    env = clientjob.client_env(api_key_secret, api_key_secret_key,
                               [{"name": "HF_DATASETS_OFFLINE", "value": "1"}])
    files = [RUNNER, *task_files()]
    container = {
        "name": "accuracy", "image": cfg.accuracy.image, "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"{RUNTIME_DIR}/{RUNNER}", *runner_args(cfg, base_url)],
        "env": env, "securityContext": container_security_context(),
        # Disk: the /tmp emptyDir (HOME: lm-eval's caches) and the logs.
        "resources": ephemeral.with_storage(cfg.accuracy.resources.manifest(), 1,
                                            ACCURACY_TMP_GI + ephemeral.LOGS_GI),
        "volumeMounts": [{"name": "accuracy-runtime", "mountPath": RUNTIME_DIR, "readOnly": True},
                         {"name": "results", "mountPath": RESULTS_DIR},
                         {"name": "tmp", "mountPath": "/tmp"}]}
    pod_labels = {**labels, "app.kubernetes.io/component": COMPONENT}
    return clientjob.client_job(
        names, namespace, pod_labels,
        annotations={"k3infra.dev/receipt": receipt.id, "k3infra.dev/results-claim": names.pvc,
                     "k3infra.dev/label": "smoke test",
                     **checkov_skips.annotations(checkov_skips.ACCURACY_IMAGE_UID,
                                                 checkov_skips.ACCURACY_API_KEY_ENV)},
        deadline_seconds=cfg.accuracy.timeout_minutes * 60,
        placement=placement.beside_serving(
            cfg.gpu_product,
            placement.pool_of(cfg.node_pool.provider, labels["app.kubernetes.io/instance"]),
            serving_selector),
        containers=[container],
        volumes=[podfiles.volume("accuracy-runtime", names.configmap,
                                 {f: f if f == RUNNER else f"tasks/{f}" for f in files}),
                 {"name": "results", "persistentVolumeClaim": {"claimName": names.pvc}},
                 {"name": "tmp", "emptyDir": {"sizeLimit": f"{ACCURACY_TMP_GI}Gi"}}])
