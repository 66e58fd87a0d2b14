"""The authenticating proxy in front of vLLM, in the serving pod (issue 21, item 2).

vLLM's own `--api-key` guards only some path prefixes (`/v1`, `/v2`, `/inference`, ...):
`/invocations` (the same inference), `/tokenize`, the dev-mode and pooling routes and
`/metrics` stay open on its port. So vLLM listens on 127.0.0.1 only, and nginx, in the
same pod, is the only thing on the pod's address:

    API port      the OpenAI routes of ALLOWED_ROUTES, each only with a valid bearer key
                  (401 without one); every other path 404. Clients reach only this port.
    metrics port  GET /metrics, nothing else (no key: Prometheus scrapes it). Only the
                  scraper reaches this port (NetworkPolicy).
    health port   GET /health (vLLM's) and the proxy's own liveness; kubelet probes only.

Why nginx: one small, long-maintained binary with an allow-list routing model (exact
`location =` matches, everything else falls to `return 404`), streaming proxying for
server-sent events, several ports in one process, and a key read from a mounted Secret
file (no templating at start, no shell). Envoy does the same with a far larger config
surface; oauth2-proxy and similar do OIDC logins, not static bearer keys.

Pure: (config, key) -> the nginx.conf text, the key map text, the container, volumes.
The config holds no secret and lives in a ConfigMap (a render shows it); only the key
map, which holds the key, is in the API-key Secret. One projected volume puts both in
CONF_DIR.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from k3infra import ephemeral, nginx, origin
from k3infra.config import API_KEY_RE, SECRET_PLACEHOLDER, StackConfig

CONTAINER = "proxy"
# The proxy's own user: not the engine's (it reads no weights), high enough for checkov's
# CKV_K8S_40; nginx needs no passwd entry when it does not start as root.
PROXY_UID = 10101
CONF_DIR = "/etc/k3-proxy"
CONF_KEY = "nginx.conf"
KEYS_KEY = "keys.map"
TMP_DIR = "/tmp"
PROXY_TMP_GI = 1                       # the proxy-tmp emptyDir
LIVE_PATH = "/proxy-live"             # the proxy's own liveness: nginx answers it itself
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
# Request bodies nginx accepts: a ~36K-token prompt is ~150 KB; images as base64 more.
MAX_BODY = "32m"
# Longest a single request may run. A 256-token answer took ~19 s in the receipt; long
# generations and queueing at high concurrency need far more, and SSE streams must not
# be cut between tokens.
READ_TIMEOUT_SECONDS = 3600


@dataclass(frozen=True)
class Route:
    method: str
    path: str


# The OpenAI routes clients may call, each only with the key (the gateway's too).
INFERENCE_ROUTES = (Route("POST", "/v1/chat/completions"),
                    Route("POST", "/v1/completions"),
                    Route("GET", "/v1/models"))
# The server's own token count, with the key: the benchmark Job holds Workload A's
# lengths to it (k3infra/bench/pod_runner.py). It tokenizes, runs no inference, and
# vLLM's own --api-key does not guard it, so only the proxy does. /detokenize is not
# needed (the Job refuses a mismatch instead of re-aligning) and stays 404. Anything
# else vLLM serves (SageMaker, pooling, dev-mode, LoRA, profiler, docs, realtime...)
# is 404.
ALLOWED_ROUTES = (*INFERENCE_ROUTES, Route("POST", "/tokenize"))


def keys_map(api_key: str) -> str:
    """The nginx `map` entries that authorize a request: the exact header
    `Authorization: Bearer <key>`, case-sensitive (nginx compares plain map strings
    ignoring case, so the entry is an anchored regex with the key's metacharacters
    escaped). Lives in the API-key Secret, never in a ConfigMap or the pod spec."""
    if api_key == SECRET_PLACEHOLDER:          # an offline render never holds the key
        return f"# {SECRET_PLACEHOLDER}\n"
    if not isinstance(api_key, str) or not API_KEY_RE.match(api_key):
        raise ValueError("the API key must be an RFC 6750 bearer token: letters, digits and "
                         "-._~+/ with optional trailing '=' (openssl rand -hex 32 makes one)")
    escaped = re.sub(r"([.+])", r"\\\1", api_key)
    return f'"~^Bearer {escaped}$" 1;\n'


def _authorized_location(route: Route, upstream: str) -> str:
    # Exact match, and proxy_pass with the same URI: vLLM receives the normalized path
    # nginx matched, never the raw one (no `%2F..` or `//` tricks reach the app).
    return (f"        location = {route.path} {{\n"
            f"            if ($k3_authorized != 1) {{ return 401; }}\n"
            f"            limit_except {route.method} {{ deny all; }}\n"
            f"            proxy_pass http://{upstream}{route.path};\n"
            f"        }}\n")


def _open_location(path: str, upstream: str) -> str:
    return (f"        location = {path} {{\n"
            f"            limit_except GET {{ deny all; }}\n"
            f"            proxy_pass http://{upstream}{path};\n"
            f"        }}\n")


def nginx_conf(cfg: StackConfig, keys_file: str = f"{CONF_DIR}/{KEYS_KEY}",
               tmp_dir: str = TMP_DIR, engine_host: str = "127.0.0.1") -> str:
    """nginx.conf for the proxy. `keys_file`, `tmp_dir` and `engine_host` are
    parameters only so a test can run the same text outside a pod."""
    s = cfg.serving
    upstream = "vllm"
    api = "".join(_authorized_location(r, upstream) for r in ALLOWED_ROUTES)
    return nginx.preamble("k3infra authenticating proxy (rendered by k3infra.serving.proxy).",
                          tmp_dir, 4096, s.proxy_resources.cpu_max) + f"""    client_max_body_size {MAX_BODY};
    map $http_authorization $k3_authorized {{
        default 0;
        include {keys_file};
    }}
    upstream {upstream} {{
        server {engine_host}:{s.engine_port};
        keepalive 64;
    }}
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header Host $host;
    # Server-sent events: pass each token as vLLM sends it, never spool to disk.
    proxy_buffering off;
    proxy_read_timeout {READ_TIMEOUT_SECONDS}s;
    proxy_send_timeout {READ_TIMEOUT_SECONDS}s;
    server {{
        listen {s.port};
{api}        location / {{ return 404; }}
    }}
    server {{
        listen {s.metrics_port};
{_open_location(METRICS_PATH, upstream)}        location / {{ return 404; }}
    }}
    server {{
        listen {s.health_port};
{_open_location(HEALTH_PATH, upstream)}        location = {LIVE_PATH} {{ return 200; }}
        location / {{ return 404; }}
    }}
}}
"""


def conf_digest(cfg: StackConfig) -> str:
    """On the pod template: a changed proxy config rolls the pods (a changed ConfigMap
    does not)."""
    return "sha256:" + hashlib.sha256(nginx_conf(cfg).encode()).hexdigest()


def _probe(path: str, port: int, period: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 5}


def container(cfg: StackConfig, conf_volume: str, drain_seconds: int) -> dict:
    """`drain_seconds`: the engine's preStop drain. The proxy is the pod's one listener:
    on SIGTERM nginx stops at once (its fast shutdown), so without the same drain a
    replaced pod refused requests while vLLM behind it was still draining (found by the
    node tier's two-replica roll: connection errors through the Service)."""
    s = cfg.serving
    return origin.container({
        "name": CONTAINER,
        "image": origin.Tagged(s.proxy_image, origin.stack("serving.proxyImage", s.proxy_image)),
        "imagePullPolicy": "IfNotPresent",
        "command": [origin.words(
            origin.k3infra(f"nginx with the proxy's config ({CONF_DIR}/{CONF_KEY} from the "
                           "ConfigMap, k3infra/serving/proxy.py): the API key check in front "
                           "of vLLM, the pod's one listener"),
            "nginx", "-e", "stderr", "-c", f"{CONF_DIR}/{CONF_KEY}", "-g", "daemon off;")],
        "ports": [{"name": "http", "containerPort": s.port, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": s.metrics_port, "protocol": "TCP"},
                  {"name": "health", "containerPort": s.health_port, "protocol": "TCP"}],
        # Disk: proxy-tmp (1 GiB, request bodies nginx buffers) and the logs.
        "resources": ephemeral.with_storage(s.proxy_resources.manifest(), ephemeral.LOGS_GI,
                                            PROXY_TMP_GI + ephemeral.LOGS_GI),
        # Ready only when vLLM is: the pod takes traffic once both are up.
        "readinessProbe": _probe(HEALTH_PATH, "health", 10, 3),
        # Alive is nginx itself: a loading engine must not restart the proxy.
        "livenessProbe": _probe(LIVE_PATH, "health", 10, 3),
        "lifecycle": {"preStop": {"sleep": {"seconds": drain_seconds}}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": PROXY_UID,
                            "runAsGroup": PROXY_UID, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": conf_volume, "mountPath": CONF_DIR, "readOnly": True},
                         {"name": "proxy-tmp", "mountPath": TMP_DIR}],
    })


def volumes(configmap_name: str, secret_name: str, conf_volume: str) -> list[dict]:
    """CONF_DIR: nginx.conf from the ConfigMap, keys.map from the API-key Secret."""
    return [{"name": conf_volume, "projected": {
                "defaultMode": 0o440,
                "sources": [{"configMap": {"name": configmap_name,
                                           "items": [{"key": CONF_KEY, "path": CONF_KEY}]}},
                            {"secret": {"name": secret_name,
                                        "items": [{"key": KEYS_KEY, "path": KEYS_KEY}]}}]}},
            {"name": "proxy-tmp", "emptyDir": {"sizeLimit": f"{PROXY_TMP_GI}Gi"}}]


def config_files(cfg: StackConfig) -> dict[str, str]:
    """The proxy's ConfigMap data: its config, no secret in it."""
    return {CONF_KEY: nginx_conf(cfg)}


def secret_files(api_key: Any) -> dict[str, Any]:
    """The proxy's file in the API-key Secret: the key map. `api_key` is the plaintext
    or a Pulumi Output (then the map is an Output too)."""
    if isinstance(api_key, str):
        return {KEYS_KEY: keys_map(api_key)}
    return {KEYS_KEY: api_key.apply(keys_map)}
