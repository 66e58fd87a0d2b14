"""The in-cluster source of verified bytes: one per copy that other copies fill from
(k3infra/weights/fanout.py), a Deployment of one pod on that copy's node and its Service.

Why nginx: the stack already pins it (`k3:serving.proxyImage`, the API proxy), so there
is no new image to pin or scan; it serves static files with `sendfile` (the kernel copies
page cache to socket, no user-space copy), answers `Range` requests (the prefetch resumes
with them), and handles many parallel large reads with a few worker processes. It is
configured to serve the tree in the Hub's URL layout, `/<repo>/resolve/<revision>/<path>`
with `X-Repo-Commit: <revision>` and Content-Length, which is all huggingface_hub's
`get_hf_file_metadata` + `http_get` need: the filling node runs the very same download
code as against the Hub (another endpoint, no token), with the same resume, the same
overlapped verification against the lock and the same marker. No downloader of our own.

The pod:
- init container `source-check` (the engine image, the weights runtime): the serving
  gate with `--require-marker`: the lock pinned by the pod spec, the prefetch's marker
  naming that tree, and a full read-and-hash of the copy. Anything else: the pod does
  not start, nothing is served;
- container `nginx` (the proxy image): the copy read-only, GET/HEAD only, no directory
  listings, no symlinks followed, the marker and scratch directory not served, and the
  lock beside the tree at `/k3/lock/<revision>.json` (for fills without a shipped lock;
  they hold it to the pinned digest like any other).
Ingress: only this stack's prefetch pods, on SOURCE_PORT (k3infra/operations/network.py).
The source is a cache: every byte it serves is hashed against the lock by the node that
receives it, so a copy changed after the check is refused there, file by file.
"""
from __future__ import annotations

import hashlib
from typing import Any, Optional

from k3infra import checkov_skips, ephemeral, nginx
from k3infra.config import StackConfig
from k3infra.naming import SOURCE_COMPONENT
from k3infra.podsecurity import container_security_context
from k3infra.receipt import Receipt
from k3infra.weights import fanout
from k3infra.weights import manifests as w
from k3infra.weights.sources import LOCK_ROUTE

CONF_DIR = "/etc/k3-source"
CONF_KEY = "nginx.conf"
TMP_DIR = "/tmp"
LIVE_PATH = "/k3/live"
COPY_LABEL = "k3infra.dev/weights-copy"
# The start check (the serving gate, plus the marker): the pod serves nothing unless the
# copy is the pinned tree, verified in full.
CHECK_SCRIPT = w.GATE_SCRIPT.replace('--workers "$K3_HASH_WORKERS"',
                                     '--workers "$K3_HASH_WORKERS" --require-marker')
NGINX_CPU_LIMIT = 8                      # also its worker count (k3infra/nginx.py)
# Disk: nginx serves files from the read-only copy; it writes its logs and, at most,
# temporary files under TMP_DIR.
NGINX_RESOURCES = ephemeral.with_storage({"requests": {"cpu": "2", "memory": "512Mi"},
                                          "limits": {"cpu": str(NGINX_CPU_LIMIT), "memory": "1Gi"}},
                                         ephemeral.LOGS_GI, 1 + ephemeral.LOGS_GI)


def nginx_conf(lay: w.WeightsLayout, weights_root: str = w.WEIGHTS_ROOT,
               tmp_dir: str = TMP_DIR, port: int = fanout.SOURCE_PORT) -> str:
    """nginx.conf of a source. `weights_root`, `tmp_dir` and `port` are parameters only
    so tests and the benchmark run the same text outside a pod."""
    resolve = f"/{lay.repo}/resolve/{lay.revision}/"
    tree_dir = lay.tree.replace(w.WEIGHTS_ROOT, weights_root, 1)
    lock_file = lay.lock.replace(w.WEIGHTS_ROOT, weights_root, 1)
    return nginx.preamble("k3infra in-cluster weights source (rendered by "
                          "k3infra.weights.source_server).", tmp_dir, 1024,
                          NGINX_CPU_LIMIT) + f"""    # Large files straight from the page cache to the socket, in 8 MiB turns so one
    # client cannot hold a worker.
    sendfile on;
    sendfile_max_chunk 8m;
    tcp_nopush on;
    keepalive_timeout 65s;
    send_timeout 300s;
    types {{ }}
    default_type application/octet-stream;
    autoindex off;
    disable_symlinks on;
    client_max_body_size 0;
    server {{
        listen {port};
        location = {LIVE_PATH} {{ return 200; }}
        location = {LOCK_ROUTE.format(revision=lay.revision)} {{
            limit_except GET {{ deny all; }}
            alias {lock_file};
        }}
        # Reserved names beside the tree (the marker, huggingface_hub's scratch): not files
        # of the tree, never served.
        location ^~ {resolve}.cache/ {{ return 404; }}
        location ^~ {resolve}.k3- {{ return 404; }}
        location ^~ {resolve} {{
            limit_except GET {{ deny all; }}
            alias {tree_dir}/;
            add_header X-Repo-Commit {lay.revision} always;
            add_header Accept-Ranges bytes always;
        }}
        location / {{ return 404; }}
    }}
}}
"""


def conf_configmap_name(base: str, conf: str) -> str:
    return f"{base}-weights-source-{hashlib.sha256(conf.encode()).hexdigest()[:8]}"


def conf_configmap(base: str, namespace: str, labels: dict, lay: w.WeightsLayout) -> dict:
    conf = nginx_conf(lay)
    return {"apiVersion": "v1", "kind": "ConfigMap", "immutable": True,
            "metadata": {"name": conf_configmap_name(base, conf), "namespace": namespace,
                         "labels": labels},
            "data": {CONF_KEY: conf}}


def _labels(labels: dict, i: int) -> dict:
    return {**labels, "app.kubernetes.io/component": SOURCE_COMPONENT, COPY_LABEL: str(i)}


def source_deployment(receipt: Receipt, cfg: StackConfig, base: str, namespace: str,
                      labels: dict, image: Any, lock_text: Optional[str], i: int) -> dict:
    """Copy i's source: the start check (init), then nginx, on copy i's node (its local
    PersistentVolume's node affinity), the copy mounted read-only."""
    lay = w.layout(receipt, cfg)
    conf = nginx_conf(lay)
    pod_labels = _labels(labels, i)
    check = w._gate_container("source-check", image, receipt, cfg, base, lock_text)
    check["command"] = ["sh", "-c", CHECK_SCRIPT, "k3-source-check", "true"]
    nginx = {"name": "nginx", "image": cfg.serving.proxy_image, "imagePullPolicy": "IfNotPresent",
             "command": ["nginx", "-e", "stderr", "-c", f"{CONF_DIR}/{CONF_KEY}", "-g", "daemon off;"],
             "ports": [{"name": "http", "containerPort": fanout.SOURCE_PORT, "protocol": "TCP"}],
             "resources": NGINX_RESOURCES,
             "readinessProbe": {"httpGet": {"path": LIVE_PATH, "port": "http"},
                                "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 5},
             "livenessProbe": {"httpGet": {"path": LIVE_PATH, "port": "http"},
                               "periodSeconds": 20, "failureThreshold": 3, "timeoutSeconds": 5},
             # The weights' owner (uid 1000) reads the copy whatever its mode bits.
             "securityContext": container_security_context(),
             "volumeMounts": [{"name": w.names(base)["volume"], "mountPath": w.WEIGHTS_ROOT,
                               "readOnly": True},
                              {"name": "source-conf", "mountPath": CONF_DIR, "readOnly": True},
                              {"name": "tmp", "mountPath": TMP_DIR}]}
    spec = w._weights_pod(cfg, base, nginx, lock_text, "Always",
                          labels["app.kubernetes.io/instance"], i)
    spec["initContainers"] = [check]
    spec["volumes"][0]["persistentVolumeClaim"]["readOnly"] = True
    spec["volumes"].append({"name": "source-conf", "configMap": {
        "name": conf_configmap_name(base, conf), "defaultMode": 0o444}})
    selector = {"app.kubernetes.io/instance": labels["app.kubernetes.io/instance"],
                "app.kubernetes.io/component": SOURCE_COMPONENT, COPY_LABEL: str(i)}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": fanout.source_name(base, i), "namespace": namespace,
                         "labels": pod_labels,
                         "annotations": checkov_skips.annotations(checkov_skips.ENGINE_IMAGE_UID)},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                     "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": pod_labels}, "spec": spec}}}


def source_service(base: str, namespace: str, labels: dict, i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": fanout.source_name(base, i), "namespace": namespace,
                         "labels": _labels(labels, i)},
            "spec": {"type": "ClusterIP",
                     "selector": {"app.kubernetes.io/instance": labels["app.kubernetes.io/instance"],
                                  "app.kubernetes.io/component": SOURCE_COMPONENT,
                                  COPY_LABEL: str(i)},
                     "ports": [{"name": "http", "port": fanout.SOURCE_PORT,
                                "targetPort": "http", "protocol": "TCP"}]}}
