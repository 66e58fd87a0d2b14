"""Pure builders of the serving objects: the vLLM StatefulSet that carries the receipt's
flag set, its Services, PodDisruptionBudget and API-key Secret.

(receipt or plan, config, inputs) -> Kubernetes manifest dicts (k3infra.plan: the
startup budget and the drain, resolved once). Values that come from other resources
(image digest, secret values) pass through untouched, so the same builder serves
`pulumi up` (Outputs) and the offline render (strings).
"""
from __future__ import annotations

import json
from typing import Any

from k3infra import checkov_skips, ephemeral, naming, origin, placement, topology
from k3infra.origin import (Origin, Tagged, argv, engine_path, entries, k3infra, secret_env,
                            stack, surface, words)
from k3infra.serving import proxy, rollout, start
from k3infra.podsecurity import container_security_context, pod_security_context
from k3infra.config import ConfigError, StackConfig
# SHUTDOWN_SECONDS lives with the drain it follows (k3infra.plan).
from k3infra.plan import SHUTDOWN_SECONDS, ServingPlan
from k3infra.receipt import NOTHING_MEASURED, Receipt
from k3infra.serving.startup import BUDGET_ANNOTATION, PROBE_PERIOD_SECONDS, StartupBudget
from k3infra.naming import ServingNames, labels, selector_labels
from k3infra.weights.manifests import WeightsParts

APP = naming.APP
CACHE_ROOT = start.CACHE_ROOT         # the compile-cache volume (survives pod restarts)
API_KEY_SECRET_KEY = "api-key"
PROXY_CONF_VOLUME = "proxy"
# vLLM answers only inside the pod (the proxy is its one client).
ENGINE_HOST = "127.0.0.1"


def is_measured(receipt: Receipt, cfg: StackConfig) -> bool:
    """Only the measured profile of a measured receipt on one node renders a measured
    configuration (a candidate's flags are the receipt's, but nothing measured them)."""
    return (cfg.profile == "measured" and not receipt.is_candidate
            and not topology.is_multi_node(cfg))


def not_measured_warning(receipt: Receipt, cfg: StackConfig) -> str:
    """Why this render is not the receipt's configuration ('' when it is)."""
    reasons = []
    if receipt.is_candidate:
        reasons.append(f"receipt {receipt.id} is a candidate: {NOTHING_MEASURED}")
    if cfg.profile != "measured":
        reasons.append(f"profile {cfg.profile}: NOT the measured configuration of receipt "
                       f"{receipt.id}")
    if topology.is_multi_node(cfg):
        reasons.append(topology.not_measured_text(receipt))
    return "; ".join(reasons)


def workload_receipt(receipt: Receipt) -> dict[str, str]:
    """The receipt's identity on the serving workload (not its pods: a receipt whose
    content changes but whose engine, flags and env do not replaces no pod)."""
    return {RECEIPT_SHA_ANNOTATION: receipt.sha256()}


RECEIPT_SHA_ANNOTATION = "k3infra.dev/receipt-sha256"


def pin_annotations(receipt: Receipt, cfg: StackConfig,
                    engine_pins: dict[str, str]) -> dict[str, str]:
    """Pins on the StatefulSet and its pods. `engine_pins` describe the engine the pod
    really runs (EnginePlan.pins(), passed in by the stack)."""
    measured = is_measured(receipt, cfg)
    return {"k3infra.dev/receipt": receipt.id,
            "k3infra.dev/receipt-status": receipt.status,
            **engine_pins,
            "k3infra.dev/weights-repo": receipt.model.repo,
            "k3infra.dev/weights-revision": cfg.weights_revision,
            "k3infra.dev/tree-digest": receipt.model.tree_digest,
            "k3infra.dev/profile": cfg.profile,
            "k3infra.dev/measured-configuration": "true" if measured else "false",
            **({} if measured else {"k3infra.dev/warning": not_measured_warning(receipt, cfg)})}


# Why the profile custom's engine-path values are marked so wherever they show.
CUSTOM_WHY = "profile custom: NOT the measured configuration"


def surface_arg_parts(cfg: StackConfig) -> list[Tagged]:
    """Allow-listed serving-surface flags: k3infra's defaults, then the stack's (a stack
    value replaces a default in place; `false` drops the flag)."""
    values: dict[str, tuple[Any, Origin]] = {
        "--served-model-name": (cfg.served_model_name,
                                stack("servedModelName", cfg.served_model_name)),
        "--host": (ENGINE_HOST, k3infra("vLLM answers only inside the pod; the proxy is its "
                                        "one client")),
        "--port": (str(cfg.serving.engine_port),
                   stack("serving.enginePort", cfg.serving.engine_port))}
    values.update({flag: (value, stack(f"surface.args.{flag}", value))
                   for flag, value in cfg.surface.args.items()})
    parts: list[Tagged] = []
    for flag, (value, source) in values.items():
        if value is True:
            parts.append(words(surface(source), flag))
        elif value is not False:
            parts.append(words(surface(source), flag, str(value)))
    return parts


def serve_arg_parts(receipt: Receipt, cfg: StackConfig, model_dir: str,
                    model_dir_origin: Origin) -> list[Tagged]:
    """`vllm serve` arguments: the model dir, the receipt's engine args in receipt order,
    custom engine args (profile custom only), then the surface args."""
    custom = ([words(stack("custom.args", " ".join(cfg.custom.args), CUSTOM_WHY),
                     *cfg.custom.args)]
              if cfg.profile == "custom" and cfg.custom.args else [])
    return [words(model_dir_origin, model_dir),
            *(words(engine_path(a.why), *a.tokens()) for a in receipt.serve.engine_args),
            *custom, *surface_arg_parts(cfg)]


def serve_args(receipt: Receipt, cfg: StackConfig, model_dir: str) -> list[str]:
    """The words alone (the tags dropped: a Docker host's server, the summary line)."""
    return argv(serve_arg_parts(receipt, cfg, model_dir, k3infra("the model directory")))


def serve_env_parts(receipt: Receipt, cfg: StackConfig, budget: StartupBudget,
                    api_key_secret: str) -> list[Tagged]:
    """Engine-path env from the receipt, then surface env. The receipt records no NCCL
    tuning: all-reduce runs on NCCL defaults (custom all-reduce is off), so NCCL_* tuning
    is engine path (profile custom) and only NCCL_DEBUG / interface selection are surface."""
    env: dict[str, tuple[Any, Origin]] = {e.name: (e.value, engine_path(e.why))
                                          for e in receipt.serve.engine_env}
    if cfg.profile == "custom":
        env.update({k: (v, stack(f"custom.env.{k}", v, CUSTOM_WHY))
                    for k, v in cfg.custom.env.items()})
    env.update({
        "HF_HUB_OFFLINE": ("1", surface(k3infra("a serving pod never reaches the Hub"))),
        # The engine's own deadline: load + compile + profiling (serving/startup.py).
        "VLLM_ENGINE_READY_TIMEOUT_S": (str(budget.engine_seconds), surface(k3infra(
            "the engine deadline, startup + load + compile + profiling from the receipt "
            "and k3:coldStart (k3infra/serving/startup.py)"))),
        # Compile caches under /cache/current, the start script's keyed directory.
        **{k: (v, surface(start.CACHE_ORIGIN)) for k, v in start.CACHE_ENV.items()},
    })
    env.update({k: (v, surface(stack(f"surface.env.{k}", v)))
                for k, v in cfg.surface.env.items()})
    out = [Tagged({"name": k, "value": str(v)}, o) for k, (v, o) in env.items()]
    out.append(secret_env("VLLM_API_KEY", api_key_secret, API_KEY_SECRET_KEY, surface(stack(
        "apiKey", "[secret]", f"read from the Secret {api_key_secret}"))))
    return out


def serve_env(receipt: Receipt, cfg: StackConfig, budget: StartupBudget,
              api_key_secret: str) -> list[dict]:
    return entries(serve_env_parts(receipt, cfg, budget, api_key_secret))


def check_shutdown(plan: ServingPlan, cfg: StackConfig) -> None:
    drain = plan.drain_seconds
    grace = cfg.serving.termination_grace_seconds
    if grace < drain + SHUTDOWN_SECONDS:
        raise ConfigError("k3:serving.terminationGraceSeconds", grace,
                          f"must be at least the drain ({drain} s) + {SHUTDOWN_SECONDS} s for "
                          "vLLM's shutdown, or in-flight requests are killed")


def update_strategy(cfg: StackConfig) -> dict:
    if cfg.serving.update_strategy == "OnDelete":
        return {"type": "OnDelete"}
    return {"type": "RollingUpdate", "rollingUpdate": {"partition": rollout.partition(cfg)}}


# The serve flags are k3infra's: a field changed by another manager (`kubectl edit`,
# `kubectl patch`) is drift, and `pulumi up` must put the receipt's value back. Without
# this, server-side apply answers a field-manager conflict and the update fails (found
# by the real API server, tests/e2e/test_apiserver_stack.py).
RESTORE_DRIFT = {"pulumi.com/patchForce": "true"}


def await_annotations(cfg: StackConfig) -> dict[str, str]:
    """When `pulumi up` counts the StatefulSet as done (pulumi-kubernetes' await).

    The built-in StatefulSet await waits for currentRevision == updateRevision, which a
    canary (RollingUpdate with updatePartition > 0) never reaches: the pods below the
    partition keep the old revision on purpose, and `pulumi up` would fail at its
    timeout. For a canary, `pulumi.com/waitFor` replaces the built-in await: done once
    the status is current (pulumi-kubernetes checks observedGeneration before any
    JSONPath), every replica is ready and at least the replicas above the partition run
    the new revision. On create every pod starts at the new revision, so the same
    expression holds. `>=` cannot be written (the annotation's parser splits on `=`), so
    the count is `> n - 1`; `==` is kept by that parser. Without a canary, and with
    OnDelete, the built-in await stays (OnDelete: pulumi-kubernetes does not wait for a
    rollout it cannot start)."""
    s = cfg.serving
    held = rollout.partition(cfg)
    if s.update_strategy != "RollingUpdate" or held == 0:
        return {}
    canary = cfg.replicas - held
    test = f"@.readyReplicas == {cfg.replicas}"
    if canary > 0:
        test += f" && @.updatedReplicas > {canary - 1}"
    # `$[?...]` visits the object's top-level members: only `status` has these fields.
    return {rollout.WAIT_FOR_ANNOTATION: json.dumps([f"jsonpath={{$[?{test}]}}"])}


def engine_command_parts() -> list[Tagged]:
    return [*start.command_parts(),
            words(k3infra("the engine, vLLM's own command line, which the start script "
                          "execs"), "vllm", "serve")]


def engine_command() -> list[str]:
    """The vLLM container's command, for every config: the start script (phase markers,
    keyed compile cache, the weights gate), then `exec vllm serve` with the args. The
    policy pack compares the rendered command with this, byte for byte."""
    return argv(engine_command_parts())


def engine_probe_exec(port: int, timeout: int = 5) -> dict:
    """vLLM's /health from inside its own container: it listens on loopback only, and
    its liveness must not depend on the proxy (a proxy hiccup must not reload 1.5 TB)."""
    url = f"http://{ENGINE_HOST}:{port}/health"
    return {"command": ["python3", "-c",
                        f"import urllib.request; urllib.request.urlopen({url!r}, timeout={timeout})"]}


def _probe(port: int, period: int, failures: int, timeout: int = 5) -> dict:
    return {"exec": engine_probe_exec(port, timeout),
            "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": timeout}


def vllm_container(receipt: Receipt, cfg: StackConfig, image: Any, weights: WeightsParts,
                   names: ServingNames, budget: StartupBudget, drain_seconds: int, *,
                   extra_args: tuple[Tagged, ...] = (), gpus: int | None = None,
                   probes: bool = True, claims: tuple[str, ...] = ()) -> dict:
    """The vLLM container. A multi-node group (k3infra/serving/group.py) adds its
    `extra_args` (tagged words) after the receipt's and the surface's, its GPUs per pod,
    its DRA `claims`, and a headless worker has no HTTP server to probe. `budget` and
    `drain_seconds`: the plan's (k3infra.plan)."""
    port = cfg.serving.engine_port
    s = cfg.serving
    gpus_text = str(gpus if gpus is not None else receipt.measured_gpu.gpus_per_node)
    image_origin = origin.engine_image(cfg)
    container: dict[str, Any] = origin.container({
        "name": "vllm",
        "image": Tagged(image, image_origin),
        "imagePullPolicy": "IfNotPresent",
        # The start script (phase markers, keyed compile cache, then the weights gate on
        # every start of this container, restarts too), then `exec vllm serve`.
        "command": engine_command_parts(),
        "args": [*serve_arg_parts(receipt, cfg, weights.model_dir, weights.model_dir_origin),
                 *extra_args],
        "env": [*serve_env_parts(receipt, cfg, budget, names.api_key_secret),
                *weights.gate_env, *start.env_parts(image, image_origin)],
        # Disk: the /tmp emptyDir (k3:serving.tmpSizeGi), the gate's state (64 Mi) and
        # the logs; the weights and the compile cache are claims.
        "resources": ephemeral.with_storage({
            **{kind: {**quantities, "nvidia.com/gpu": gpus_text}
               for kind, quantities in s.resources.manifest().items()},
            **({"claims": [{"name": c} for c in claims]} if claims else {}),
        }, 1, s.tmp_size_gi + 1),
        "startupProbe": _probe(port, PROBE_PERIOD_SECONDS, budget.failure_threshold),
        "readinessProbe": _probe(port, 10, 3),
        "livenessProbe": _probe(port, 30, 4, timeout=10),
        "lifecycle": {"preStop": {"sleep": {"seconds": drain_seconds}}},
        "securityContext": container_security_context(),
        "volumeMounts": [*weights.main_mounts, *weights.gate_mounts,
                         {"name": "cache", "mountPath": CACHE_ROOT},
                         {"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "tmp", "mountPath": "/tmp"}],
    })
    if not probes:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            del container[probe]
    return container


def serving_pod_spec(cfg: StackConfig, weights: WeightsParts, names: ServingNames,
                     containers: list[dict], affinity: dict, *, with_proxy: bool = True,
                     resource_claims: tuple[dict, ...] = ()) -> dict:
    """The serving pod (StatefulSet or a multi-node group's leader / worker)."""
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        **cfg.engine.pull_secret_refs(),
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": cfg.serving.termination_grace_seconds,
        "securityContext": pod_security_context(),
        "affinity": affinity,
        "tolerations": placement.tolerations(),
        "containers": containers,
        "volumes": [*weights.volumes,
                    *(proxy.volumes(names.proxy_config, names.api_key_secret, PROXY_CONF_VOLUME)
                      if with_proxy else []),
                    # NCCL and the 8 TP workers exchange through /dev/shm: memory-backed.
                    {"name": "dshm", "emptyDir": {"medium": "Memory",
                                                  "sizeLimit": f"{cfg.serving.shm_size_gi}Gi"}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": f"{cfg.serving.tmp_size_gi}Gi"}}],
    }
    if resource_claims:
        spec["resourceClaims"] = list(resource_claims)
    return spec


def cache_claim_template(cfg: StackConfig) -> dict:
    """The compile cache's per-pod claim (survives pod restarts)."""
    claim: dict[str, Any] = {
        "metadata": {"name": "cache"},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": f"{cfg.serving.cache_size_gi}Gi"}}}}
    if cfg.serving.cache_storage_class:
        claim["spec"]["storageClassName"] = cfg.serving.cache_storage_class
    return claim


def statefulset(plan: ServingPlan, cfg: StackConfig, image: Any, weights: WeightsParts,
                names: ServingNames, instance: str, engine_pins: dict[str, str]) -> dict:
    """One pod = one 8-GPU node = one replica."""
    receipt, budget = plan.receipt, plan.budget
    sel = selector_labels(instance)
    pod_spec = serving_pod_spec(
        cfg, weights, names,
        [vllm_container(receipt, cfg, image, weights, names, budget, plan.drain_seconds),
         proxy.container(cfg, PROXY_CONF_VOLUME, plan.drain_seconds)],
        {"nodeAffinity": placement.node_affinity(
            [cfg.gpu_product], placement.pool_of(cfg.node_pool.provider, instance)),
         "podAntiAffinity": placement.one_replica_per_node(sel)})
    cache_claim = cache_claim_template(cfg)
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": names.statefulset, "namespace": names.namespace,
                     "labels": labels(instance),
                     "annotations": {**pin_annotations(receipt, cfg, engine_pins),
                                     **workload_receipt(receipt), **await_annotations(cfg),
                                     **RESTORE_DRIFT,
                                     **checkov_skips.annotations(
                         checkov_skips.ENGINE_IMAGE_UID, checkov_skips.VLLM_API_KEY_ENV)}},
        "spec": {
            "serviceName": names.headless,
            # With k3:autoscaling the HPA owns the count (k3infra/operations/autoscaling.py).
            **({} if cfg.autoscaling.enabled else {"replicas": cfg.replicas}),
            # Replicas load 1.5 TB each: start them together, not one after another.
            "podManagementPolicy": "Parallel",
            # One node at a time, never below the partition (docs/operations.md).
            "updateStrategy": update_strategy(cfg),
            "selector": {"matchLabels": sel},
            "template": {"metadata": {"labels": labels(instance),
                                      "annotations": {**pin_annotations(receipt, cfg, engine_pins),
                                                      "k3infra.dev/proxy-config":
                                                          proxy.conf_digest(cfg),
                                                      BUDGET_ANNOTATION: budget.annotation()}},
                         "spec": pod_spec},
            "volumeClaimTemplates": [cache_claim, *weights.claim_templates],
            # The claims the controller makes from the templates go with the StatefulSet:
            # without this, destroying an instance in a namespace it does not own left its
            # compile-cache claim behind (tests/e2e/test_apiserver_instances.py).
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete",
                                                     "whenScaled": "Retain"},
        },
    }


def api_key_secret(names: ServingNames, instance: str, value: Any) -> dict:
    """The API key, and the proxy's key map (it holds the key; k3infra/serving/proxy.py)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": names.api_key_secret, "namespace": names.namespace,
                         "labels": labels(instance)},
            "stringData": {API_KEY_SECRET_KEY: value, **proxy.secret_files(value)}}


def proxy_configmap(cfg: StackConfig, names: ServingNames, instance: str) -> dict:
    """The proxy's nginx.conf: no secret in it, so a render shows it."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": names.proxy_config, "namespace": names.namespace,
                         "labels": labels(instance)},
            "data": proxy.config_files(cfg)}


def hf_token_secret(names: ServingNames, instance: str, value: Any) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": names.hf_token_secret, "namespace": names.namespace,
                         "labels": labels(instance, "weights-prefetch")},
            "stringData": {"token": value}}


def api_selector(cfg: StackConfig, instance: str) -> dict[str, str]:
    """The pods that answer the API: every serving pod, or in a multi-node group only the
    leader (worker-index 0, set by the LeaderWorkerSet controller); the headless worker
    runs no API server."""
    sel = selector_labels(instance)
    if topology.is_multi_node(cfg):
        sel[topology.LWS_WORKER_INDEX_LABEL] = "0"
    return sel


def services(cfg: StackConfig, names: ServingNames, instance: str) -> list[dict]:
    """The API port only (the metrics port has its own Service, k3infra/operations)."""
    port = {"name": "http", "port": cfg.serving.port, "targetPort": "http", "protocol": "TCP"}
    sel = api_selector(cfg, instance)
    return [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": names.headless, "namespace": names.namespace,
                      "labels": labels(instance)},
         "spec": {"clusterIP": "None", "selector": sel, "ports": [port]}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": names.service, "namespace": names.namespace,
                      "labels": labels(instance)},
         "spec": {"type": "ClusterIP", "selector": sel, "ports": [port]}},
    ]


def disruption_budget(names: ServingNames, instance: str) -> dict:
    """At most one serving node drained at a time."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": names.pdb, "namespace": names.namespace,
                         "labels": labels(instance)},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(instance)}}}


def namespace(name: str, instance: str, pod_security: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {
                **labels(instance, "namespace"),
                "pod-security.kubernetes.io/enforce": pod_security,
                "pod-security.kubernetes.io/warn": "restricted"}}}


def pod_security_level(cfg: StackConfig) -> str:
    """`restricted` in every mode: node-local weights are local PersistentVolumes claimed
    through PVCs, never a hostPath in this namespace."""
    return "restricted"


def endpoint_url(cfg: StackConfig, names: ServingNames) -> str:
    return f"http://{names.service}.{names.namespace}.svc.cluster.local:{cfg.serving.port}"


def benchmark_url(cfg: StackConfig, names: ServingNames) -> str:
    """Where the benchmark Job measures. A receipt's figures are one node's, one replica's:
    with several single-node replicas the Service spreads the grid's concurrency over
    them and flatters every figure (a c=2 p50 of 421 ms through two replicas was 880 ms
    on one, found by the node tier), so the Job measures one replica alone, the one the
    rollout gate judges. One replica, or a multi-node group: the Service."""
    if cfg.replicas > 1 and not topology.is_multi_node(cfg):
        return rollout.canary_url(cfg, names)
    return endpoint_url(cfg, names)


def serve_command_line(receipt: Receipt, cfg: StackConfig, model_dir: str) -> str:
    return " ".join(["vllm", "serve", *serve_args(receipt, cfg, model_dir)])
