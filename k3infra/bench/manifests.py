"""Pure builders of the benchmark's Kubernetes objects: the runtime ConfigMap, the results
PVC, the benchmark Job, and the short-lived reader pod `k3infra bench fetch` uses.

Where the results live, and how they come back (the robust choice, see
docs/benchmark.md): every raw file goes to a ReadWriteOnce PVC that outlives the Job
(and, with retainOnDelete, the stack). After the Job ends, `k3infra bench fetch` starts
a reader pod that mounts the PVC read-only, streams the latest run as base64 tar over
the exec API, and checks every file against the run's SHA256SUMS. No size limit (a
ConfigMap stops at 1 MiB; per-request arrays of a wide sweep pass that), no extra RBAC
for the Job, and nothing depends on pod logs surviving.

The Job and the reader run on the serving GPU nodes without requesting a GPU: the
engine image is already there (no multi-GB pull), and so is the tokenizer in the weights
directory (node-local weights exist only on those nodes).
"""
from __future__ import annotations

import json
from typing import Any, Optional

from k3infra import checkov_skips, clientjob, ephemeral, naming, origin, placement, podfiles
from k3infra.origin import Origin, Tagged, argv, k3infra, receipt as from_receipt, stack, words
from k3infra.clientjob import RESULTS_DIR
from k3infra.podsecurity import container_security_context, pod_security_context
from k3infra.config import StackConfig
from k3infra.receipt import Receipt
from k3infra.weights.manifests import WeightsParts

RUNTIME_DIR = "/etc/k3/bench"
POD_FILES = ("workload.py", "pod_runner.py", "verdict.py")
SHARED_FILES = ("podcommon.py",)          # from the k3infra package itself (one copy)
COMPONENT = naming.BENCHMARK_COMPONENT
GATE_COMPONENT = naming.ROLLOUT_GATE_COMPONENT
RESULTS_COMPONENT = naming.BENCHMARK_RESULTS_COMPONENT
READER_COMPONENT = naming.BENCHMARK_READER_COMPONENT
# /health is already 200 when the Job starts (it runs after the StatefulSet is ready);
# the wait covers a serving pod restarting in between.
HEALTH_WAIT_SECONDS = 1800
READER_RESOURCES = ephemeral.with_storage({"requests": {"cpu": "500m", "memory": "1Gi"},
                                           "limits": {"cpu": "2", "memory": "4Gi"}},
                                          *ephemeral.LOGS_ONLY)
BENCH_TMP_GI = 8
READER_LIFETIME_SECONDS = 900


def BenchmarkNames(base: str) -> clientjob.JobNames:
    return clientjob.JobNames(base, "bench")


# The wide sweep's measured requests per point when k3:benchmark.measuredRequests is
# unset: two full waves at its largest concurrency, so every point runs at its nominal
# concurrency (the receipt does not say how many the lost sweep sent).
WIDE_SWEEP_WAVES = 2


def sweep(receipt: Receipt, cfg: StackConfig) -> tuple[list[int], int]:
    """Concurrencies and the output cap the Job runs: the configured grid, or the
    receipt's wider sweep (k3:benchmark.sweep: wide)."""
    (concurrencies, _), (output_tokens, _) = _sweep(receipt, cfg)
    return concurrencies, output_tokens


def _sweep(receipt: Receipt,
           cfg: StackConfig) -> tuple[tuple[list[int], Origin], tuple[int, Origin]]:
    """`sweep`, each figure with its origin."""
    w = receipt.workload_a
    if cfg.benchmark.sweep == "wide":
        if w.wide_sweep is None:
            raise ValueError(f"receipt {receipt.id} records no wide sweep")
        wide = "k3:benchmark.sweep = wide"
        return ((list(w.wide_sweep.concurrencies),
                 from_receipt("workload_a.wide_sweep.concurrencies", wide)),
                (w.wide_sweep.output_tokens_max,
                 from_receipt("workload_a.wide_sweep.output_tokens_max", wide)))
    grid_text = ",".join(str(c) for c in cfg.benchmark.concurrencies)
    return ((list(cfg.benchmark.concurrencies),
             stack("benchmark.concurrencies", grid_text, "unset: the receipt's grid")),
            (w.output_tokens_max, from_receipt("workload_a.output_tokens_max")))


def grid(receipt: Receipt, cfg: StackConfig) -> dict[str, int]:
    return {k: v for k, (v, _) in _grid(receipt, cfg).items()}


def _grid(receipt: Receipt, cfg: StackConfig) -> dict[str, tuple[int, Origin]]:
    w = receipt.workload_a
    measured = (w.measured_requests, from_receipt("workload_a.measured_requests"))
    if cfg.benchmark.sweep == "wide":
        measured = (WIDE_SWEEP_WAVES * max(sweep(receipt, cfg)[0]),
                    k3infra(f"{WIDE_SWEEP_WAVES} full waves at the wide sweep's largest "
                            "concurrency"))
    if cfg.benchmark.measured_requests:
        measured = (cfg.benchmark.measured_requests,
                    stack("benchmark.measuredRequests", cfg.benchmark.measured_requests))
    return {"warmups": (w.warmup_requests, from_receipt("workload_a.warmup_requests")),
            "measured": measured}


# vLLM's smallest KV block size: where a receipt leaves --block-size to the engine, prompts
# whose first 16 tokens differ share no block of any size, so 16 is the strict check.
SMALLEST_BLOCK_SIZE = 16


def block_size(receipt: Receipt) -> tuple[int, Origin]:
    """The KV block size the prefix cache hashes (the receipt's --block-size), and why."""
    arg = next((a for a in receipt.serve.engine_args if a.flag == "--block-size"), None)
    if arg is None or arg.value is None:
        return SMALLEST_BLOCK_SIZE, k3infra(
            "the receipt leaves the KV block size to the engine: vLLM's smallest, the strict "
            "check that no two prompts share their first block")
    return int(arg.value), from_receipt("serve.engine_args --block-size",
                                        "the KV block size the prefix cache hashes")


def runtime_configmap(names: clientjob.JobNames, namespace: str, labels: dict) -> dict:
    return podfiles.configmap(
        {"name": names.configmap, "namespace": namespace, "labels": labels},
        {**podfiles.package_files("k3infra.bench", POD_FILES),
         **podfiles.package_files("k3infra", SHARED_FILES)})


def results_pvc(names: clientjob.JobNames, namespace: str, labels: dict, cfg: StackConfig) -> dict:
    return clientjob.results_pvc(names, namespace, labels, size_gi=cfg.benchmark.results_size_gi,
                                 storage_class=cfg.benchmark.results_storage_class,
                                 component=RESULTS_COMPONENT)


def runner_args(receipt: Receipt, cfg: StackConfig, base_url: str, model_dir: str) -> list[str]:
    return argv(runner_arg_parts(receipt, cfg, base_url, model_dir,
                                 k3infra("the model directory")))


def runner_arg_parts(receipt: Receipt, cfg: StackConfig, base_url: str, model_dir: str,
                     model_dir_origin: Origin, gate: Optional[dict] = None) -> list[Tagged]:
    w = receipt.workload_a
    g = _grid(receipt, cfg)
    (concurrencies, concurrencies_origin), (output_tokens, output_origin) = _sweep(receipt, cfg)
    b = cfg.benchmark
    parts = [
        words(k3infra("the canary pod alone, by its DNS name, through its proxy and key check"
                      if gate else "the serving Service, through the proxy and its key check"),
              "--base-url", base_url),
        words(stack("servedModelName", cfg.served_model_name), "--served-model-name",
              cfg.served_model_name),
        words(model_dir_origin, "--model-dir", model_dir),
        words(k3infra("the results volume"), "--results", RESULTS_DIR),
        words(from_receipt("id"), "--receipt", receipt.id),
        words(concurrencies_origin, "--concurrencies", ",".join(str(c) for c in concurrencies)),
        words(stack("benchmark.runs", b.runs), "--runs", str(b.runs)),
        words(g["warmups"][1], "--warmups", str(g["warmups"][0])),
        words(g["measured"][1], "--measured", str(g["measured"][0])),
        words(from_receipt("workload_a.prompt_tokens_min"), "--min-tokens",
              str(w.prompt_tokens_min)),
        words(from_receipt("workload_a.prompt_tokens_max"), "--max-tokens",
              str(w.prompt_tokens_max)),
        words(output_origin, "--output-tokens", str(output_tokens)),
        words(block_size(receipt)[1], "--block-size", str(block_size(receipt)[0])),
        words(stack("benchmark.seed", b.seed), "--seed", str(b.seed)),
        words(k3infra("how long the runner waits for /health"), "--health-timeout",
              str(HEALTH_WAIT_SECONDS))]
    if b.ignore_eos:
        parts.append(words(stack("benchmark.ignoreEos", True), "--ignore-eos"))
    if cfg.topology != "single-node":
        # Results of a multi-node replica say so: `bench compare` marks them cross-topology.
        parts.append(words(stack("topology", cfg.topology), "--topology", cfg.topology))
    if gate is not None:
        parts.append(words(from_receipt("measured", "the rollout gate judges the canary's run "
                                        "against the receipt's e2el figures, +- "
                                        "k3:benchmark.tolerancePct (k3infra/bench/verdict.py)"),
                           "--gate", json.dumps(gate, sort_keys=True)))
    return parts


def job_timeout_seconds(cfg: StackConfig) -> int:
    return cfg.benchmark.timeout_minutes * 60




def _gpu_node_placement(cfg: StackConfig, serving_selector: dict, instance: str) -> dict:
    """On a serving node of this instance's pool, beside a serving pod: its weights
    passed that pod's gate."""
    return placement.beside_serving(
        cfg.gpu_product, placement.pool_of(cfg.node_pool.provider, instance), serving_selector)


def benchmark_job(receipt: Receipt, cfg: StackConfig, *, names: clientjob.JobNames,
                  namespace: str, labels: dict, image: Any, base_url: str,
                  api_key_secret: str, api_key_secret_key: str, weights: WeightsParts,
                  serving_selector: dict, gate: Optional[dict] = None) -> dict:
    """The Job: `vllm bench serve` over Workload A for every configured concurrency.
    The serving pods' weights gate runs first (the tokenizer is read from the same
    tree), the weights are mounted read-only, and no remote code is trusted. `gate`: the
    rollout gate's judgement (k3infra/serving/rollout.py): the runner then exits 1 when
    the canary's run is outside it, with the table as its termination message."""
    weight_mounts = [dict(m, readOnly=True) for m in weights.main_mounts]
    weight_volumes = list(weights.reader_volumes)      # the weights, and the gate's runtime
    # vllm bench serve sends the key as Bearer; the tokenizer is read from the weights dir.
    image_origin = origin.engine_image(cfg)
    env = clientjob.client_env_parts(api_key_secret, api_key_secret_key, [origin.env(
        "K3_ENGINE_IMAGE", image, Origin(image_origin.kind, f"{image_origin.detail}; the "
                                         "runner records the engine it measured"))])
    container = origin.container({
        "name": "bench", "image": Tagged(image, image_origin), "imagePullPolicy": "IfNotPresent",
        "command": [words(k3infra(f"the runner k3infra/bench/pod_runner.py, from the "
                                  f"{names.configmap} ConfigMap (vllm bench serve per point)"),
                          "python3", f"{RUNTIME_DIR}/pod_runner.py"),
                    *runner_arg_parts(receipt, cfg, base_url, weights.model_dir,
                                      weights.model_dir_origin, gate)],
        "env": env, "securityContext": container_security_context(),
        # Disk: the /tmp emptyDir (HOME) and the logs; the results go to their claim.
        "resources": ephemeral.with_storage(cfg.benchmark.resources.manifest(), 1,
                                            BENCH_TMP_GI + ephemeral.LOGS_GI),
        "volumeMounts": [*weight_mounts,
                         {"name": "bench-runtime", "mountPath": RUNTIME_DIR, "readOnly": True},
                         {"name": "results", "mountPath": RESULTS_DIR},
                         {"name": "tmp", "mountPath": "/tmp"}]})
    pod_labels = {**labels, "app.kubernetes.io/component": GATE_COMPONENT if gate else COMPONENT}
    return clientjob.client_job(
        names, namespace, pod_labels,
        annotations={"k3infra.dev/receipt": receipt.id, "k3infra.dev/results-claim": names.pvc,
                     **checkov_skips.annotations(checkov_skips.ENGINE_IMAGE_UID,
                                                 checkov_skips.BENCH_API_KEY_ENV)},
        deadline_seconds=job_timeout_seconds(cfg),
        placement=_gpu_node_placement(cfg, serving_selector, labels["app.kubernetes.io/instance"]),
        pod_extra=cfg.engine.pull_secret_refs(),
        init_containers=weights.reader_init_containers,
        containers=[container],
        volumes=[*weight_volumes,
                 podfiles.volume("bench-runtime", names.configmap,
                                 {f: f for f in (*POD_FILES, *SHARED_FILES)}),
                 {"name": "results", "persistentVolumeClaim": {"claimName": names.pvc}},
                 {"name": "tmp", "emptyDir": {"sizeLimit": f"{BENCH_TMP_GI}Gi"}}])


# --- reading the results back (k3infra bench fetch / verify) ---------------------------

# Runs in the reader pod: the latest complete run (or the named one) as a base64 tar.
_EXPORT = (
    "import base64,io,os,sys,tarfile\n"
    "root=sys.argv[1]; run=sys.argv[2] if len(sys.argv)>2 else ''\n"
    "if not run:\n"
    "    p=os.path.join(root,'LATEST')\n"
    "    if not os.path.exists(p): sys.exit('no complete benchmark run in '+root)\n"
    "    run=open(p).read().strip()\n"
    "d=os.path.join(root,run)\n"
    "if not os.path.isdir(d): sys.exit('no run '+run+' in '+root)\n"
    "b=io.BytesIO()\n"
    "with tarfile.open(fileobj=b,mode='w:gz') as t: t.add(d,arcname=run)\n"
    "sys.stdout.write(base64.b64encode(b.getvalue()).decode())\n"
)


def export_command(run_id: str = "") -> list[str]:
    return ["python3", "-c", _EXPORT, RESULTS_DIR, *([run_id] if run_id else [])]


def reader_pod(name: str, namespace: str, claim: str, image: str, job_pod_spec: dict) -> dict:
    """A pod that only mounts the results PVC read-only and waits to be exec'd into;
    placed like the benchmark Job (same node pool, image already cached)."""
    spec = {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "enableServiceLinks": False, "activeDeadlineSeconds": READER_LIFETIME_SECONDS,
        "securityContext": pod_security_context(),
        "containers": [{
            "name": "reader", "image": image, "imagePullPolicy": "IfNotPresent",
            "command": ["python3", "-c", f"import time; time.sleep({READER_LIFETIME_SECONDS})"],
            "resources": READER_RESOURCES, "securityContext": container_security_context(),
            "volumeMounts": [{"name": "results", "mountPath": RESULTS_DIR, "readOnly": True}]}],
        "volumes": [{"name": "results", "persistentVolumeClaim": {"claimName": claim,
                                                                  "readOnly": True}}],
    }
    for key in ("affinity", "tolerations", "nodeSelector", "imagePullSecrets"):
        if job_pod_spec.get(key):
            spec[key] = job_pod_spec[key]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {
                "app.kubernetes.io/part-of": "k3infra",
                "app.kubernetes.io/component": READER_COMPONENT}},
            "spec": spec}
