"""The containers of one Docker host, pure: (plan, config, instance, image) -> `HostPlan`
(k3infra.plan: the receipt and the startup budget, resolved once).

Names derive from the instance (k3infra.naming's rule, as for a cluster): the Compose
project is `<instance>`, each container `<instance>-<role>` (prefetch, vllm, proxy), the
compile-cache volume `<instance>-cache`; two instances on one daemon share nothing.

One description feeds both outputs, so they cannot drift apart:
- `K3HostStack` (k3infra/host/component.py) turns it into pulumi-docker resources;
- `compose.yaml` (k3infra/host/compose.py) is the same containers for `docker compose up`.

The containers, in order:
  prefetch  one-shot, the `k3weights` runtime (lock check, resumable download at the
            pinned revision, overlapped verify, atomic marker); must exit 0 first;
  cache-owner  one-shot, gives the compile-cache volume to the engine's group;
  proxy     the same nginx authenticating proxy as the pod (k3infra/serving/proxy.py);
            it owns the network namespace and the published ports, their only listener;
  vllm      the weights gate, then `exec vllm serve` with the receipt's args and env;
            vLLM listens on 127.0.0.1:enginePort inside the proxy's network namespace.
The proxy owns the namespace because vllm is the container that restarts by design (a
refused gate, an engine crash): a restarted container gets a new namespace, and one that
had joined it is left in the old, empty one (tests/e2e/test_host_compose.py found that
with the opposite arrangement: the API stayed dark after vllm came back).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from k3infra.config import ConfigError, StackConfig
from k3infra.plan import ServingPlan
from k3infra.podsecurity import ENGINE_GID, ENGINE_UID
from k3infra.serving import manifests as serving
from k3infra.serving import proxy, start
from k3infra.weights import manifests as weights

SERVER = "vllm"                      # the serving container's role (Compose service name)
PROXY = "proxy"                      # the owner of the network namespace and the ports
# vLLM and NCCL pin host memory and open many files; the NVIDIA container guidance.
ULIMITS = {"memlock": (-1, -1), "stack": (67108864, 67108864), "nofile": (1048576, 1048576)}
# The secret env names the containers read (values: Pulumi secrets, or Compose's env file).
API_KEY_ENV = "VLLM_API_KEY"
HF_TOKEN_ENV = "HF_TOKEN"
PROXY_KEYS_FILE = f"{proxy.TMP_DIR}/{proxy.KEYS_KEY}"
HEALTH_INTERVAL_SECONDS = 30
HEALTH_TIMEOUT_SECONDS = 10
HEALTH_RETRIES = 4

# The proxy writes its key map from $VLLM_API_KEY at start, in the same form as the pod's
# Secret (proxy.keys_map: an anchored regex with '.' and '+' escaped), then runs nginx.
# A key outside RFC 6750's token characters stops the proxy (nothing served without auth).
PROXY_START = (
    'printf %s "$VLLM_API_KEY" | grep -Eqx \'[A-Za-z0-9._~+/-]+=*\' '
    '|| { echo "k3 proxy: VLLM_API_KEY is not an RFC 6750 bearer token" >&2; exit 1; }; '
    'umask 077; printf \'"~^Bearer %s$" 1;\\n\' '
    '"$(printf %s "$VLLM_API_KEY" | sed \'s/[.+]/\\\\&/g\')" > ' + PROXY_KEYS_FILE + '; '
    'exec nginx -e stderr -c "$0" -g "daemon off;"')
# The server's entrypoint is the pods' (k3infra/serving/pod/start.sh): phase markers and
# the keyed compile cache, the bootstrap checks the runtime files, the gate checks the
# tree (k3:weights.gateMode), then `exec vllm serve`. Every start of the container,
# restarts included, goes through the gate.


@dataclass(frozen=True)
class Mount:
    source: str          # host path (bind) or volume name
    target: str
    read_only: bool = False
    kind: str = "bind"   # bind | volume | tmpfs


@dataclass(frozen=True)
class HealthCheck:
    test: list[str]
    interval_seconds: int
    timeout_seconds: int
    retries: int
    start_period_seconds: int


@dataclass(frozen=True)
class Port:
    host_ip: str
    host_port: int
    container_port: int


@dataclass
class HostContainer:
    name: str
    image: Any
    command: list[str]
    env: dict[str, str]
    secret_env: list[str] = field(default_factory=list)   # names only: values are secrets
    files: dict[str, str] = field(default_factory=dict)   # container path -> content
    mounts: list[Mount] = field(default_factory=list)
    gpus: Optional[int] = None
    shm_size_bytes: Optional[int] = None
    ulimits: dict[str, tuple[int, int]] = field(default_factory=dict)
    ports: list[Port] = field(default_factory=list)
    healthcheck: Optional[HealthCheck] = None
    restart: str = "no"
    network_mode: Optional[str] = None       # None: the default bridge; "service:<name>"
    user: str = f"{ENGINE_UID}:{ENGINE_GID}"
    read_only_rootfs: bool = True
    one_shot: bool = False
    depends_on: dict[str, str] = field(default_factory=dict)   # name -> compose condition


def container_name(instance: str, role: str) -> str:
    """The Docker container of one role of an instance (`kimi-k3-vllm`)."""
    return f"{instance}-{role}"


def cache_volume(instance: str) -> str:
    """Compile caches (torch.compile, Triton): a named volume that survives restarts."""
    return f"{instance}-cache"


# The one-shot container that gives the cache volume to the engine's user. Docker creates
# a named volume root-owned (unless the image has the mount point, which no engine image
# has): the start script, as uid 1000, then fails at its first mkdir ("Permission
# denied", found by tests/e2e/test_host_compose.py). It runs as root with the engine's
# group and no capability at all (an owner may give its file to a group it is in, and
# chmod it): the top directory becomes root:<engine gid> 2775, so the engine's user
# creates its directories there and they keep its group. No network, nothing else.
CACHE_OWNER = "cache-owner"


@dataclass
class HostPlan:
    instance: str        # the Compose project; container and volume names derive from it
    image: Any
    containers: list[HostContainer]
    weights_root: str
    model_dir: str
    serve_command: list[str]
    endpoint: str

    def container(self, name: str) -> HostContainer:
        return next(c for c in self.containers if c.name == name)


def check_host_engine(cfg: StackConfig) -> None:
    """A host runs a pinned image it pulls (prebuilt) or builds locally: an in-cluster
    build needs a cluster."""
    if cfg.engine.build == "in-cluster":
        raise ConfigError("k3:engine.build", cfg.engine.build,
                          "a Docker host has no cluster to build in; accepted: prebuilt "
                          "(k3:engineImage = <repository>@sha256:<64 hex>) or local")


def endpoint(cfg: StackConfig) -> str:
    h = cfg.host
    address = "127.0.0.1" if h.network_mode == "host" else h.publish_address
    shown = f"[{address}]" if ":" in address else address
    return f"http://{shown}:{cfg.serving.port}"


def host_plan(plan: ServingPlan, cfg: StackConfig, instance: str, image: Any,
              lock_text: Optional[str] = None) -> HostPlan:
    receipt = plan.receipt
    if cfg.host is None:
        raise ConfigError("k3:host", None, "is required for a Docker host stack")
    check_host_engine(cfg)
    h, s = cfg.host, cfg.serving
    lay = weights.layout(receipt, cfg)
    files = weights.runtime_file_map(lock_text)
    tmp = Mount("", "/tmp", kind="tmpfs")

    prefetch = HostContainer(
        name="prefetch", image=image, command=["sh", "-c", weights.PREFETCH_SCRIPT],
        env=weights.prefetch_env_map(receipt, cfg, lock_text),
        secret_env=[HF_TOKEN_ENV] if cfg.hf_token is not None else [],
        files=files, mounts=[Mount(h.weights_root, weights.WEIGHTS_ROOT), tmp],
        one_shot=True)

    budget = plan.budget
    model_dir = lay.tree
    args = serving.serve_args(receipt, cfg, model_dir)
    env = {e["name"]: e["value"] for e in serving.serve_env(receipt, cfg, budget, "")
           if "value" in e}
    # The gate's inputs: only K3_* names (the serve-flags policy lets exactly these by).
    env.update(weights.gate_env_map(receipt, cfg, lock_text))
    env.update({e["name"]: e["value"] for e in start.env(image)})
    health_url = f"http://{serving.ENGINE_HOST}:{s.engine_port}/health"
    ports = [] if h.network_mode == "host" else [
        Port(h.publish_address, s.port, s.port),
        # Metrics for a scraper on the box itself; never on another interface.
        Port("127.0.0.1", s.metrics_port, s.metrics_port)]
    vllm = HostContainer(
        name=SERVER, image=image,
        command=[*serving.engine_command(), *args],
        env=env, secret_env=[API_KEY_ENV], files=files,
        mounts=[Mount(h.weights_root, weights.WEIGHTS_ROOT, read_only=True),
                Mount(cache_volume(instance), serving.CACHE_ROOT, kind="volume"), tmp,
                # stamps mode's record: per container start (a tmpfs), so a restart
                # re-reads the tree, never trusting a record older than this container.
                Mount("", weights.GATE_STATE_DIR, kind="tmpfs")],
        gpus=receipt.measured_gpu.gpus_per_node,
        shm_size_bytes=s.shm_size_gi * 2**30, ulimits=dict(ULIMITS),
        healthcheck=HealthCheck(
            ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen("
                                     f"{health_url!r}, timeout={HEALTH_TIMEOUT_SECONDS})"],
            HEALTH_INTERVAL_SECONDS, HEALTH_TIMEOUT_SECONDS, HEALTH_RETRIES,
            # The startup budget (gate + engine deadline, serving/startup.py).
            budget.total_seconds),
        restart=h.restart,
        network_mode="host" if h.network_mode == "host" else f"service:{PROXY}",
        depends_on={"prefetch": "service_completed_successfully",
                    CACHE_OWNER: "service_completed_successfully",
                    PROXY: "service_started"})
    cache_owner = HostContainer(
        name=CACHE_OWNER, image=image,
        command=["sh", "-c", f"chgrp {ENGINE_GID} {serving.CACHE_ROOT} && "
                             f"chmod 2775 {serving.CACHE_ROOT}"], env={},
        mounts=[Mount(cache_volume(instance), serving.CACHE_ROOT, kind="volume")],
        user=f"0:{ENGINE_GID}", network_mode="none", one_shot=True)

    conf_path = f"{proxy.CONF_DIR}/{proxy.CONF_KEY}"
    proxy_c = HostContainer(
        name=PROXY, image=s.proxy_image,
        command=["sh", "-c", PROXY_START, conf_path],
        env={}, secret_env=[API_KEY_ENV],
        files={conf_path: proxy.nginx_conf(cfg, keys_file=PROXY_KEYS_FILE)},
        mounts=[tmp], restart=h.restart, ports=ports,
        network_mode="host" if h.network_mode == "host" else None,
        user=f"{proxy.PROXY_UID}:{proxy.PROXY_UID}")
    return HostPlan(instance=instance, image=image, containers=[prefetch, cache_owner, proxy_c, vllm],
                    weights_root=h.weights_root, model_dir=model_dir,
                    serve_command=["vllm", "serve", *args], endpoint=endpoint(cfg))
