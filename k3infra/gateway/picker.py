"""The endpoint picker (EPP): llm-d-router's, the maintained successor of the Inference
Extension's picker. Envoy-based gateways call it over ext_proc (gRPC) for every request
of the pool; it answers with the pod to send the request to.

Its config is the default profile of its own Helm chart at the pinned release: the
queue scorer (waiting requests, weight 2), the KV-cache utilization scorer (weight 2)
and the prefix-cache scorer (weight 3; the approximate prefix producer it needs is
created implicitly: it hashes the prompt in blocks and remembers which pod it sent
each prefix to). One change: the metrics source scrapes the serving pods' proxy
metrics port, because the API port (the pool's target port) answers `/metrics` with
404 (k3infra/serving/proxy.py).

Pure builders, plus the picker's deployment gates (a placeholder image digest, no API
server egress).
"""
from __future__ import annotations

import hashlib

import yaml

from k3infra import checkov_skips, ephemeral, naming
from k3infra.config import StackConfig
from k3infra.gateway.names import GatewayNames
from k3infra.gateway.versions import EPP_CONFIG_API_VERSION, INFERENCE_GROUP
from k3infra.gates import Gate, is_placeholder
from k3infra.naming import EPP_COMPONENT

EXT_PROC_PORT = 9002        # the gateway's ext_proc calls
HEALTH_PORT = 9003          # gRPC health (kubelet probes)
METRICS_PORT = 9090         # the picker's own metrics (not opened to any scraper)
CONFIG_DIR = "/config"
CONFIG_FILE = "epp.yaml"
# The image's user (distroless `nonroot`).
EPP_UID = 65532
# The default profile's weights (the picker's chart, routerlib/_config.yaml).
SCORER_WEIGHTS = {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3}


def picker_config(cfg: StackConfig) -> dict:
    return {"apiVersion": EPP_CONFIG_API_VERSION, "kind": "EndpointPickerConfig",
            "plugins": [*({"type": t} for t in SCORER_WEIGHTS),
                        {"type": "metrics-data-source",
                         "parameters": {"scheme": "http", "path": "/metrics",
                                        "port": cfg.serving.metrics_port}},
                        {"type": "core-metrics-extractor"}],
            "schedulingProfiles": [{"name": "default", "plugins": [
                {"pluginRef": t, "weight": w} for t, w in SCORER_WEIGHTS.items()]}]}


def config_text(cfg: StackConfig) -> str:
    return yaml.safe_dump(picker_config(cfg), sort_keys=False)


def configmap(cfg: StackConfig, names: GatewayNames, instance: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": names.picker, "namespace": names.namespace,
                         "labels": naming.labels(instance, EPP_COMPONENT)},
            "data": {CONFIG_FILE: config_text(cfg)}}


def service_account(names: GatewayNames, instance: str) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": names.picker, "namespace": names.namespace,
                         "labels": naming.labels(instance, EPP_COMPONENT)}}


def role(names: GatewayNames, instance: str) -> dict:
    """Read-only, this namespace: the pool, its pods, and the objectives / rewrites the
    picker's reconcilers watch (llm-d's CRDs, installed with the picker)."""
    read = ["get", "watch", "list"]
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": names.picker, "namespace": names.namespace,
                         "labels": naming.labels(instance, EPP_COMPONENT)},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": read},
                      {"apiGroups": [INFERENCE_GROUP], "resources": ["inferencepools"],
                       "verbs": read},
                      {"apiGroups": ["llm-d.ai", "inference.networking.x-k8s.io"],
                       "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                       "verbs": read}]}


def role_binding(names: GatewayNames, instance: str) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": names.picker, "namespace": names.namespace,
                         "labels": naming.labels(instance, EPP_COMPONENT)},
            "subjects": [{"kind": "ServiceAccount", "name": names.picker,
                          "namespace": names.namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": names.picker}}


def picker_selector(instance: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": naming.APP, "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/component": EPP_COMPONENT}


def _grpc_probe(period: int) -> dict:
    return {"grpc": {"port": HEALTH_PORT, "service": "inference-extension"},
            "periodSeconds": period, "failureThreshold": 3, "timeoutSeconds": 5}


def deployment(cfg: StackConfig, names: GatewayNames, instance: str) -> dict:
    """One replica (leader election for more is not wired here). Its flags: the pool by
    name, the config file, JSON logs, no tracing."""
    digest = "sha256:" + hashlib.sha256(config_text(cfg).encode()).hexdigest()
    container = {
        "name": "epp", "image": cfg.gateway.epp_image, "imagePullPolicy": "IfNotPresent",
        "args": ["--pool-name", names.pool, "--pool-namespace", names.namespace,
                 "--pool-group", INFERENCE_GROUP, "--zap-encoder", "json",
                 "--config-file", f"{CONFIG_DIR}/{CONFIG_FILE}",
                 "--grpc-port", str(EXT_PROC_PORT), "--grpc-health-port", str(HEALTH_PORT),
                 "--metrics-port", str(METRICS_PORT), "--tracing=false"],
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "grpc", "containerPort": EXT_PROC_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        # Hashing 35K-token prompts in blocks for every request is the picker's work.
        # Disk: the /tmp emptyDir (1 GiB) and the logs.
        "resources": ephemeral.with_storage({"requests": {"cpu": "4", "memory": "8Gi"},
                                             "limits": {"cpu": "8", "memory": "16Gi"}},
                                            ephemeral.LOGS_GI, 1 + ephemeral.LOGS_GI),
        "livenessProbe": _grpc_probe(10), "readinessProbe": _grpc_probe(2),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": EPP_UID, "runAsGroup": EPP_UID,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    labels = naming.labels(instance, EPP_COMPONENT)
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": names.picker, "namespace": names.namespace, "labels": labels,
                         "annotations": checkov_skips.annotations(checkov_skips.EPP_SA_TOKEN)},
            "spec": {"replicas": 1, "selector": {"matchLabels": picker_selector(instance)},
                     "template": {
                         "metadata": {"labels": labels,
                                      # A changed config rolls the picker (a ConfigMap does not).
                                      "annotations": {"k3infra.dev/epp-config": digest}},
                         "spec": {"serviceAccountName": names.picker,
                                  "automountServiceAccountToken": True,
                                  "enableServiceLinks": False,
                                  "terminationGracePeriodSeconds": 130,
                                  "securityContext": {"runAsNonRoot": True,
                                                      "seccompProfile": {"type": "RuntimeDefault"}},
                                  "containers": [container],
                                  "volumes": [{"name": "config", "configMap": {"name": names.picker}},
                                              {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]}}}}


def service(names: GatewayNames, instance: str) -> dict:
    """ClusterIP, the ext_proc port only; h2c so the gateway speaks gRPC to it."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": names.picker, "namespace": names.namespace,
                         "labels": naming.labels(instance, EPP_COMPONENT)},
            "spec": {"type": "ClusterIP", "selector": picker_selector(instance),
                     "ports": [{"name": "grpc-ext-proc", "port": EXT_PROC_PORT,
                                "targetPort": EXT_PROC_PORT, "protocol": "TCP",
                                "appProtocol": "kubernetes.io/h2c"}]}}


def picker_gates(cfg: StackConfig) -> list[Gate]:
    """Refused by `pulumi up`, warned by a render (k3infra.gates)."""
    gw = cfg.gateway
    if not gw.enabled:
        return []
    out = []
    if is_placeholder(gw.epp_image):
        out.append(Gate("k3:gateway.eppImage",
                        f"{gw.epp_image} is a placeholder: replace it with your pinned value"))
    if not gw.api_server_cidrs:
        out.append(Gate("k3:gateway.apiServerCidrs",
                        "is empty: the endpoint picker watches its pool through the API server "
                        "and its egress opens only these CIDRs (the API server's endpoint "
                        "addresses: kubectl get endpoints kubernetes -n default)"))
    return out
