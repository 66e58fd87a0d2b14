"""The stack configuration: every `k3:*` key as a pydantic model (the sections and
`StackConfig`)."""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field, create_model, field_validator, model_validator

from k3infra.config.base import (SECRET_PLACEHOLDER, PROXY_IMAGE, Secret, _Section)
from k3infra.config.pools import NodePoolConfig
from k3infra.weights import store
from k3infra.fieldtypes import (
    API_KEY, AbsPath, Cidr, Commit, Count, CronField, DigestImage, DnsLabel,
    DnsSubdomain, DockerTag, EnvName, HubCommit, Factor, FilePath, Flag, GB, GBps, Gi, GitUrl, HttpUrl,
    IpAddress, Labels, LabelValue, Percent, Port, RegistryHost, Replicas, Repository,
    ScrapeInterval, Seconds, Seed, ServedModelName, Sha256Hex, UnprivilegedPort, Version,
    LABEL_KEY_REGEX, integer, number, pattern)

# A region name as S3 APIs take it (AWS's us-east-1, an S3-compatible store's own name).
StoreRegion, _ = pattern(r"[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?", "must be a region name (lowercase "
                         "letters, digits, '-' and '_', at most 63)", 63)
# The store's URL (its rules: k3infra.weights.store.parse_store_url, checked after this).
StoreUrlText, _ = pattern(r"[a-z0-9]+://\S+", "must be " + store.ACCEPTED_URL, 2048)
DomainLabel, _ = pattern(LABEL_KEY_REGEX, "a node label key naming the node's NVLink domain, such "
                         "as nvidia.com/gpu.clique (set by GPU feature discovery on multi-node "
                         "NVLink trays)", 317)

# The accuracy smoke test's image (k3:accuracy.image): yours, built with lm-eval and the
# task datasets; the all-zero digest is a placeholder `pulumi up` refuses.
ACCURACY_IMAGE = "k3infra-accuracy:lm-eval-0.4.13@sha256:" + "0" * 64


class SurfaceConfig(_Section):
    """Serving-surface settings from the receipt's allow-list (k3:surface)."""

    args: dict[Flag, Union[bool, str]] = Field(default_factory=dict)
    env: dict[EnvName, str] = Field(default_factory=dict)


class CustomConfig(_Section):
    """Engine-path changes; only accepted with `k3:profile: custom` (k3:custom)."""

    args: list[str] = Field(default_factory=list)
    env: dict[EnvName, str] = Field(default_factory=dict)


class ContainerResources(_Section):
    """A container's CPU and memory: the requests the scheduler reserves on the node
    and the limits. CPU in cores (0.5 is 500m), memory in GiB (0.25 is 256Mi). Each
    use below is a subclass with that container's defaults, so a stack that sets one
    number keeps the other three."""

    cpu: float = Field(default=1, ge=0.01, le=1024)
    cpu_limit: float = Field(default=1, ge=0.01, le=1024, alias="cpuLimit")
    memory_gi: float = Field(default=1, ge=1 / 64, le=65536, alias="memoryGi")
    memory_limit_gi: float = Field(default=1, ge=1 / 64, le=65536, alias="memoryLimitGi")

    @model_validator(mode="after")
    def _request_within_limit(self) -> "ContainerResources":
        # Kubernetes refuses a request above its limit; say so before anything exists.
        if self.cpu > self.cpu_limit:
            raise ValueError(f"cpu {self.cpu:g} is above cpuLimit {self.cpu_limit:g}; "
                             "a request must be at most its limit")
        if self.memory_gi > self.memory_limit_gi:
            raise ValueError(f"memoryGi {self.memory_gi:g} is above memoryLimitGi "
                             f"{self.memory_limit_gi:g}; a request must be at most its limit")
        for name, value, unit in (("cpu", self.cpu, 1000), ("cpuLimit", self.cpu_limit, 1000),
                                  ("memoryGi", self.memory_gi, 1024),
                                  ("memoryLimitGi", self.memory_limit_gi, 1024)):
            if abs(value * unit - round(value * unit)) > 1e-6:
                raise ValueError(f"{name} {value:g} is not a whole number of "
                                 f"{'millicores' if unit == 1000 else 'MiB'}")
        return self

    def manifest(self) -> dict:
        """The container's `resources`, as Kubernetes quantities ("16", "500m", "32Gi",
        "256Mi")."""
        return {"requests": {"cpu": cpu_quantity(self.cpu), "memory": memory_quantity(self.memory_gi)},
                "limits": {"cpu": cpu_quantity(self.cpu_limit),
                           "memory": memory_quantity(self.memory_limit_gi)}}


def cpu_quantity(cores: float) -> str:
    milli = round(cores * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_quantity(gi: float) -> str:
    mi = round(gi * 1024)
    return f"{mi // 1024}Gi" if mi % 1024 == 0 else f"{mi}Mi"


def _resources(name: str, doc: str, cpu: float, cpu_limit: float, memory_gi: float,
               memory_limit_gi: float) -> type[ContainerResources]:
    """A ContainerResources with one container's defaults (the bounds stay the base's)."""
    base = ContainerResources.model_fields

    def default(field: str, value: float):
        f = base[field]
        bounds = {k: getattr(m, k) for m in f.metadata for k in ("ge", "le") if hasattr(m, k)}
        return (float, Field(default=value, alias=f.alias, **bounds))

    return create_model(name, __base__=ContainerResources, __doc__=doc, __module__=__name__,
                        cpu=default("cpu", cpu), cpu_limit=default("cpu_limit", cpu_limit),
                        memory_gi=default("memory_gi", memory_gi),
                        memory_limit_gi=default("memory_limit_gi", memory_limit_gi))


# The defaults are the sizes of the receipt's 8-GPU node; a small node (a CPU test
# node, a small pool) lowers them (docs/configuration.md).
PrefetchResources = _resources(
    "PrefetchResources", "The prefetch Job: parallel downloads and hashing of a 1.5 TB tree.",
    16, 32, 32, 64)
GateResources = _resources(
    "GateResources",
    "The weights gate alone: the audit CronJob and the gate before a weights reader.",
    8, 32, 8, 16)
ProxyResources = _resources(
    "ProxyResources", "The serving pod's nginx proxy; its CPU limit is also its worker count.",
    1, 2, 0.25, 0.5)
BenchmarkResources = _resources(
    "BenchmarkResources", "The benchmark Job: `vllm bench serve` and the tokenizer of Workload A.",
    4, 8, 16, 32)
AccuracyResources = _resources(
    "AccuracyResources", "The accuracy Job: lm-eval as a client.", 2, 4, 8, 16)


class ServingConfig(_Section):
    """Pod sizing and the storage the serving pod reads (k3:serving)."""

    # Storage read throughput the weights gate sees, GB/s. 2 GB/s is a conservative
    # figure for a parallel file system or one local NVMe; a slow guess only makes the
    # startup budget more generous, a fast one kills pods still loading.
    storage_read_gbps: GBps = Field(default=2.0, alias="storageReadGBps")
    # Pod sizes: at most what one node of the pool can hold (an 8x B300 node has 2 x 128
    # cores and ~4 TiB of memory; /dev/shm is memory).
    shm_size_gi: integer(1, 8192) = Field(default=64, alias="shmSizeGi")
    # The vLLM container's request = limit. The defaults are the receipt's node; the
    # lower bounds are a small CPU node's (docs/configuration.md); the preflight holds
    # cpu to the engine's worker processes.
    cpu: integer(1, 1024) = 96
    memory_gi: integer(1, 8192) = Field(default=1536, alias="memoryGi")
    cache_size_gi: Gi = Field(default=100, alias="cacheSizeGi")
    cache_storage_class: Optional[DnsSubdomain] = Field(default=None, alias="cacheStorageClass")
    termination_grace_seconds: integer(30, 86400) = Field(default=180, alias="terminationGraceSeconds")
    # preStop drain before vLLM gets SIGTERM (which aborts requests still running):
    # unset = endpoint propagation + the receipt's slowest measured request (serving/drain).
    drain_seconds: Optional[integer(0, 3600)] = Field(default=None, alias="drainSeconds")
    # RollingUpdate replaces pods one node at a time from the highest ordinal down;
    # pods with an ordinal below updatePartition keep the old template (a canary: set
    # it to replicas - 1, check the new pod, then lower it). OnDelete replaces a pod only
    # when you delete it.
    update_strategy: Literal["RollingUpdate", "OnDelete"] = Field(default="RollingUpdate",
                                                                  alias="updateStrategy")
    update_partition: integer(0, 1024) = Field(default=0, alias="updatePartition")
    # The proxy's ports (the only ones on the pod's address): the API (clients), the
    # metrics (the scraper) and the health port (kubelet probes). vLLM itself listens
    # on 127.0.0.1:enginePort, unreachable from outside the pod.
    port: UnprivilegedPort = 8000
    metrics_port: UnprivilegedPort = Field(default=9090, alias="metricsPort")
    health_port: UnprivilegedPort = Field(default=8081, alias="healthPort")
    engine_port: UnprivilegedPort = Field(default=8001, alias="enginePort")
    proxy_image: DigestImage = Field(default=PROXY_IMAGE, alias="proxyImage")
    proxy_resources: ProxyResources = Field(default_factory=ProxyResources, alias="proxyResources")
    # The vLLM container's /tmp (an emptyDir: the gate's runtime copy, vLLM's scratch).
    tmp_size_gi: integer(1, 4096) = Field(default=16, alias="tmpSizeGi")

    @model_validator(mode="after")
    def _distinct_ports(self) -> "ServingConfig":
        ports = {"port": self.port, "metricsPort": self.metrics_port,
                 "healthPort": self.health_port, "enginePort": self.engine_port}
        if len(set(ports.values())) != len(ports):
            raise ValueError(f"port, metricsPort, healthPort and enginePort must differ: {ports}")
        return self


class ColdStartConfig(_Section):
    """The cold start's phases: rates, allowances and levers (k3:coldStart;
    k3infra/serving/startup.py, docs/coldstart.md cites each default's source)."""

    # The engine image's compressed size and the registry pull rate: 20-30 GB pulled in
    # 1-10 min (issue 20's figures); the default is the slow end.
    image_gb: number(0.01, 10_000) = Field(default=30.0, alias="imageGB")
    image_pull_gbps: GBps = Field(default=0.05, alias="imagePullGBps")
    # The engine's load rate from a hot page cache (vLLM PR 36012: DeepSeek-V3-0324, TP8
    # on B200, 215-435 s with prefetching; ~689 GB / 435 s = 1.58 GB/s, the slow end).
    warm_load_gbps: GBps = Field(default=1.5, alias="warmLoadGBps")
    # ... and with cold lazy mmap reads (the same PR: 1500-3660 s; 689 GB / 3660 s).
    cold_load_gbps: GBps = Field(default=0.18, alias="coldLoadGBps")
    # vLLM's own start before the load (imports, the API server, the engine core and its
    # workers, device init): measured 52.6-76.4 s on one H200 at TP1 with vLLM 0.25.0
    # (docs/coldstart.md "Measured rates"); 80 s is the slow end (a machine's first start).
    engine_start_seconds: Seconds = Field(default=80, alias="engineStartSeconds")
    # torch.compile + CUDA graph capture at TP8: 4-10 min cold, 1-2 min from a seeded
    # cache (issue 20's figures; vLLM PR 16848 loads compiled graphs from the cache).
    compile_cold_seconds: Seconds = Field(default=1200, alias="compileColdSeconds")
    compile_warm_seconds: Seconds = Field(default=240, alias="compileWarmSeconds")
    # "seeded": every serving node's compile cache was seeded (docs/coldstart.md), so
    # the deadline may assume the warm compile. "cold" assumes nothing.
    compile_cache: Literal["cold", "seeded"] = Field(default="cold", alias="compileCache")
    # Memory profiling, KV cache allocation and warmup after the load (an allowance).
    profiling_seconds: Seconds = Field(default=180, alias="profilingSeconds")
    # Every phase's estimate is multiplied by this: the tail is covered.
    tail_factor: Factor = Field(default=1.5, alias="tailFactor")
    # Pull the engine image on every serving node while the weights download (a
    # DaemonSet), so the pull is off the serving pod's path.
    prepull: bool = True
    # The prefetch restarts a download that moved no byte for this long (same resume path).
    download_stall_seconds: integer(30, 86400) = Field(default=300, alias="downloadStallSeconds")


# node-local weights live under one of these host prefixes only: the node pools mount
# local NVMe there, and a root elsewhere (/, /etc, /var/lib/kubelet...) would hand the
# weights volume's writers a system directory.
NODE_LOCAL_ROOT_PREFIXES = ("/mnt/", "/var/lib/k3infra/")


class StoreConfig(_Section):
    """The weights' origin in your own object store instead of the Hub (k3:weights.store;
    k3infra/weights/store.py, docs/weights.md "From your object store"). Fill it once
    with `k3infra weights mirror`. Credentials are never keys here: a Secret's name or a
    ServiceAccount bound to the cloud's workload identity."""

    # Plain HTTP to the endpoint, chosen explicitly (an S3-compatible store inside your
    # network without TLS); the bytes are hashed against the lock all the same.
    allow_http: bool = Field(default=False, alias="allowHttp")
    # An S3-compatible endpoint (MinIO, Ceph RGW, SeaweedFS, R2, OCI's or Nebius' S3 API),
    # an Azure or GCS endpoint of your own; unset: the provider's public endpoint.
    endpoint: Optional[HttpUrl] = None
    region: Optional[StoreRegion] = None
    # S3 stores that refuse path-style requests (CoreWeave AI Object Storage): the bucket
    # in the host name; the endpoint is then the bucket's own host (https://BUCKET.host).
    virtual_hosted_style: bool = Field(default=False, alias="virtualHostedStyle")
    # An existing Secret in the stack's namespace holding the provider's keys
    # (docs/weights.md lists them); read by the prefetch Job alone.
    credentials_secret: Optional[DnsSubdomain] = Field(default=None, alias="credentialsSecret")
    # An existing ServiceAccount bound to the cloud's workload identity (EKS IRSA or Pod
    # Identity, GKE or Azure workload identity): the prefetch Job runs as it. One of the two
    # is required.
    service_account: Optional[DnsSubdomain] = Field(default=None, alias="serviceAccount")
    # Where the prefetch may connect to reach the store (a cloud store has no fixed
    # addresses: any, less the cluster's own ranges; a store inside your network: its CIDRs).
    cidrs: list[Cidr] = Field(default_factory=lambda: ["0.0.0.0/0", "::/0"], min_length=1)
    # Expected download rate of one node from the store, GB/s: the download phase of the
    # cold start (the prefetch Job's timeout and the fill plan). Conservative on purpose.
    node_gbps: GBps = Field(default=2.0, alias="nodeGBps")
    url: StoreUrlText

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: Optional[str], info) -> Optional[str]:
        if v is None:
            return v
        problem = store.endpoint_problem(v, bool(info.data.get("allow_http")))
        if problem:
            raise ValueError(problem)
        return v.rstrip("/")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str, info) -> str:
        try:
            return str(store.parse_store_url(v, aws=not info.data.get("endpoint")))
        except store.StoreError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _one_identity(self) -> "StoreConfig":
        if self.virtual_hosted_style:
            problem = store.virtual_hosted_problem(store.parse_store_url(self.url, aws=False),
                                                   self.endpoint)
            if problem:
                raise ValueError(f"virtualHostedStyle {problem}")
        if self.credentials_secret and self.service_account:
            raise ValueError("set credentialsSecret or serviceAccount, not both: the prefetch "
                             "reads the store with one identity")
        if not self.credentials_secret and not self.service_account:
            raise ValueError("set credentialsSecret (a Secret with the provider's keys) or "
                             "serviceAccount (the cloud's workload identity): the prefetch's "
                             "NetworkPolicy keeps it off the node's metadata service")
        return self

    @property
    def scheme(self) -> str:
        return self.url.split("://", 1)[0]

    @property
    def port(self) -> int:
        """The endpoint's port (the prefetch's egress): 443, or 80 for plain HTTP."""
        from urllib.parse import urlsplit

        if self.endpoint is None:
            return 443
        parts = urlsplit(self.endpoint)
        return parts.port or (80 if parts.scheme == "http" else 443)


class WeightsConfig(_Section):
    """Where the weights live and how they get there (k3:weights)."""

    mode: Literal["shared", "node-local"] = "shared"
    lock_file: Optional[FilePath] = Field(default=None, alias="lockFile")
    storage_class: Optional[DnsSubdomain] = Field(default=None, alias="storageClass")
    # Two trees: a revision change fetches the new tree beside the old one (staging
    # directory, renamed into place) before the old one is cleaned up (docs/weights.md).
    size_gi: Gi = Field(default=3200, alias="sizeGi")
    node_local_root: AbsPath = Field(default="/mnt/k3-weights", alias="nodeLocalRoot")
    # node-local: the StorageClass of the per-node local PersistentVolumes (each with
    # node affinity to its node); docs/weights.md names what creates the PVs.
    local_storage_class: DnsSubdomain = Field(default="k3-local-nvme", alias="localStorageClass")
    # A Hub mirror or proxy inside your network (the prefetch's HF_ENDPOINT, as in
    # huggingface_hub); unset: the Hugging Face Hub itself. Narrow k3:network.hubCidrs to it.
    hub_endpoint: Optional[HttpUrl] = Field(default=None, alias="hubEndpoint")
    # Expected Hub download bandwidth in GB/s: sizes the prefetch Job's timeout.
    download_gbps: GBps = Field(default=0.5, alias="downloadGBps")
    # Where node-local copies after the first take their bytes (docs/weights.md, "Once per
    # cluster"): the Hub for every copy, in-cluster sources of verified copies only, or
    # those first and the Hub as the fallback (the default: 1x the tree from the Hub,
    # and a dead in-cluster source costs time, not the fill).
    source: Literal["hub", "cluster", "cluster-then-hub"] = "cluster-then-hub"
    # Your own object store as the origin instead of the Hub (StoreConfig above): every
    # fill that would read the Hub reads the store; unset: the Hub.
    store: Optional[StoreConfig] = None
    # Expected rate of one in-cluster transfer (source -> filling node), GB/s: sizes the
    # in-cluster fills' timeouts and the fill plan render prints.
    cluster_gbps: GBps = Field(default=2.0, alias="clusterGBps")
    # The check before every engine start: warm = full read-and-hash (warms the page
    # cache for the load); stamps = full at pod creation, then this pod's own stamps on
    # container restarts (nodes whose RAM cannot hold the tree).
    gate_mode: Literal["warm", "stamps"] = Field(default="warm", alias="gateMode")
    # A full re-verify of every copy on this cron schedule (a CronJob, read-only mount);
    # "disabled" turns it off.
    audit_schedule: Optional[CronField] = Field(default="30 4 * * 0", alias="auditSchedule")
    prefetch_resources: PrefetchResources = Field(default_factory=PrefetchResources,
                                                  alias="prefetchResources")
    gate_resources: GateResources = Field(default_factory=GateResources, alias="gateResources")
    # Files hashed in parallel by the prefetch, the gate and the audit. The gate reads
    # 1.56 TB before every engine start: on a B300 node (192 vCPUs) 32 threads hash
    # ~50 GB/s, above what the local NVMe array reads (docs/weights.md), so the disk
    # stays the limit; a small node sets about its CPUs.
    hash_workers: integer(1, 256) = Field(default=32, alias="hashWorkers")

    @field_validator("node_local_root")
    @classmethod
    def _abs_root(cls, v: str) -> str:
        if not v.startswith("/") or ".." in v.split("/"):
            raise ValueError("must be an absolute path without '..'")
        if not any(v.rstrip("/").startswith(p) and len(v.rstrip("/")) > len(p)
                   for p in NODE_LOCAL_ROOT_PREFIXES):
            raise ValueError(f"must be a directory under {' or '.join(NODE_LOCAL_ROOT_PREFIXES)} "
                             "(where the node pools mount local NVMe)")
        return v.rstrip("/")

    @field_validator("hub_endpoint")
    @classmethod
    def _endpoint(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else v.rstrip("/")   # huggingface_hub joins paths itself

    @field_validator("audit_schedule")
    @classmethod
    def _cron(cls, v: Optional[str]) -> Optional[str]:
        return None if v == "disabled" else v


_PLACEHOLDER_DIGEST = "@sha256:" + "0" * 64


class BaseImages(_Section):
    """The engine recipe's base images (k3:engine.baseImages), each pinned by digest and
    passed to images/Dockerfile as build args. The shipped digests are all-zero
    placeholders of the Dockerfile's exact tags: `pulumi up` refuses to build with them
    (docs/engine.md shows how to read each tag's digest)."""

    cuda_devel: DigestImage = Field(default="nvidia/cuda:13.0.2-devel-ubuntu22.04" + _PLACEHOLDER_DIGEST,
                                    alias="cudaDevel")
    uv: DigestImage = "ghcr.io/astral-sh/uv:0.8.22" + _PLACEHOLDER_DIGEST
    rust: DigestImage = "rust:1.90.0-slim-bookworm" + _PLACEHOLDER_DIGEST


class EngineConfig(_Section):
    """How the engine image is obtained (k3:engine). docs/engine.md explains each key."""

    # Unset: `prebuilt` when k3:engineImage is given, else `in-cluster` (the upstream profile
    # and a Docker host need the image): one rule for the component and the stack
    # templates. parse_stack_config fills it in; code after it always sees a mode.
    build: Optional[Literal["prebuilt", "in-cluster", "local"]] = None
    # The receipt's short engine commit resolved once to its full 40-hex SHA (docs/engine.md,
    # "Pinning the engine commit"); it must start with the receipt's short SHA. Builds
    # take only this: `pulumi up` refuses to build without it.
    commit: Optional[Commit] = None
    base_images: BaseImages = Field(default_factory=BaseImages, alias="baseImages")
    # Repository the build pushes to, without tag or digest: registry.example.com/k3/vllm.
    registry: Optional[Repository] = None
    # Tag pushed next to the digest; default: derived from the receipt's engine commit.
    tag: Optional[DockerTag] = None
    # in-cluster: an existing kubernetes.io/dockerconfigjson Secret with push rights, in
    # the build namespace.
    registry_secret: Optional[DnsLabel] = Field(default=None, alias="registrySecret")
    # in-cluster: the build's own namespace (default <k3:namespace>-build). Rootless
    # BuildKit needs Pod Security `privileged`; the serving namespace stays `restricted`.
    build_namespace: Optional[DnsLabel] = Field(default=None, alias="buildNamespace")
    # in-cluster: where BuildKit reads images/ from. `configmap` uploads this checkout's
    # images/ (a few small files); `git` builds gitUrl at a pinned 40-hex gitRevision.
    context: Literal["configmap", "git"] = "configmap"
    # profile custom: a recipe of your own instead of the shipped images/ (its Dockerfile
    # with the stages build.sh runs, wheel-export and runtime, and its own build.lock and
    # runtime.lock); relative to the Pulumi project directory.
    recipe_dir: Optional[FilePath] = Field(default=None, alias="recipeDir")
    git_url: Optional[GitUrl] = Field(default=None, alias="gitUrl")
    git_revision: Optional[Commit] = Field(default=None, alias="gitRevision")
    # The CPU build node. nvcc jobs need several GiB each: MAX_JOBS/NVCC_THREADS are
    # derived from these two unless set (k3infra.engine.plan.build_parallelism).
    # At least 1: a small recipe of your own (recipeDir) builds on one core; the
    # shipped vLLM recipe wants the default.
    build_cpu: integer(1, 1024) = Field(default=32, alias="buildCpu")
    build_memory_gi: integer(16, 8192) = Field(default=128, alias="buildMemoryGi")
    build_disk_gi: integer(50, 65536) = Field(default=200, alias="buildDiskGi")
    max_jobs: Optional[integer(1, 1024)] = Field(default=None, alias="maxJobs")
    nvcc_threads: Optional[integer(1, 8)] = Field(default=None, alias="nvccThreads")
    build_node_selector: Labels = Field(default_factory=dict, alias="buildNodeSelector")
    # in-cluster: what keeps the build (untrusted setup code, unconfined seccomp) away
    # from other workloads. `node-pool`: only nodes labelled and tainted
    # k3infra.dev/engine-build=true (a pool for builds alone); `runtime-class`: a
    # sandboxed RuntimeClass (gVisor, Kata) named by buildRuntimeClass.
    build_isolation: Literal["node-pool", "runtime-class"] = Field(default="node-pool",
                                                                   alias="buildIsolation")
    build_runtime_class: Optional[DnsLabel] = Field(default=None, alias="buildRuntimeClass")
    # in-cluster: the API server's endpoint addresses (the report container writes the
    # result there); every other cluster address is cut out of the build's egress.
    api_server_cidrs: list[Cidr] = Field(default_factory=list, alias="apiServerCidrs")
    # in-cluster: a registry or mirror inside your network (cluster CIDRs are otherwise
    # unreachable from the build).
    registry_cidrs: list[Cidr] = Field(default_factory=list, alias="registryCidrs")
    # in-cluster: registries inside your network that speak plain HTTP (host[:port]),
    # for BuildKit's pulls and its push; the nodes' container runtime must be told too.
    plain_http_registries: list[RegistryHost] = Field(default_factory=list,
                                                      alias="plainHttpRegistries")
    # Registry build cache: its own repository and push Secret (never the serving
    # image's); unset, builds use no registry cache at all.
    cache_registry: Optional[Repository] = Field(default=None, alias="cacheRegistry")
    cache_registry_secret: Optional[DnsLabel] = Field(default=None, alias="cacheRegistrySecret")
    build_timeout_minutes: integer(30, 10080) = Field(default=600, alias="buildTimeoutMinutes")
    # Optional sccache: a Secret whose `env` key holds SCCACHE_* settings (bucket, keys).
    sccache_secret: Optional[DnsLabel] = Field(default=None, alias="sccacheSecret")
    # in-cluster images: exact tag + digest. The shipped digests are all-zero
    # placeholders (renders work, `pulumi up` refuses them): docs/engine.md shows how to
    # read the real digest of each tag.
    buildkit_image: DigestImage = Field(default="moby/buildkit:v0.23.2-rootless@sha256:" + "0" * 64,
                                alias="buildkitImage")
    reporter_image: DigestImage = Field(default="python:3.12.11-slim-bookworm@sha256:" + "0" * 64,
                                alias="reporterImage")
    # profile upstream: the released vLLM version of k3:engineImage (>= 0.33.0).
    upstream_version: Optional[Version] = Field(default=None, alias="upstreamVersion")
    # prebuilt: the image's dev.k3infra.engine.wheel-sha256 label, carried to the outputs.
    wheel_sha256: Optional[Sha256Hex] = Field(default=None, alias="wheelSha256")
    # Existing kubernetes.io/dockerconfigjson Secrets in the stack's namespace that pull
    # the engine image from a private registry (every pod that runs it: serving,
    # weights prefetch, benchmark).
    pull_secrets: list[DnsLabel] = Field(default_factory=list, alias="pullSecrets")

    def pull_secret_refs(self) -> dict:
        """`imagePullSecrets` for a pod spec that runs the engine image ({} when none)."""
        return {"imagePullSecrets": [{"name": n} for n in self.pull_secrets]} if self.pull_secrets else {}


class BenchmarkConfig(_Section):
    """The optional in-cluster benchmark Job (k3:benchmark)."""

    enabled: bool = False
    # None: the receipt's grid (filled in by parse_stack_config from the receipt given).
    concurrencies: Optional[list[integer(1, 4096)]] = Field(default=None, max_length=64)
    # The receipt's grid is repeated this many times (its two runs agreed within 0.4 %);
    # every run and every request gets its own prompt.
    runs: integer(1, 10) = 2
    # Seeds Workload A's prompts: same seed + run id + tokenizer -> identical prompts.
    seed: Seed = 0
    # Measured requests per concurrency; None = the receipt's count (a different count
    # is no longer the receipt's workload and `bench compare` says so).
    measured_requests: Optional[integer(1, 10000)] = Field(default=None, alias="measuredRequests")
    # Every request generates exactly the receipt's output cap (comparable e2e latency).
    ignore_eos: bool = Field(default=True, alias="ignoreEos")
    # `bench compare` / `verify`: allowed |measured - receipt| / receipt, both directions.
    tolerance_pct: number(0, 100) = Field(default=10.0, alias="tolerancePct")
    results_size_gi: Gi = Field(default=1, alias="resultsSizeGi")
    results_storage_class: Optional[DnsSubdomain] = Field(default=None, alias="resultsStorageClass")
    # The Job's deadline and how long `pulumi up` waits for it.
    timeout_minutes: integer(10, 1440) = Field(default=90, alias="timeoutMinutes")
    resources: BenchmarkResources = Field(default_factory=BenchmarkResources)
    # "wide": the receipt's wider sweep (workload_a.wide_sweep: concurrency 32 and 128,
    # 2048-token outputs) instead of `concurrencies`; reported as new evidence.
    sweep: Optional[Literal["wide"]] = None

    @field_validator("concurrencies")
    @classmethod
    def _positive_unique(cls, v: Optional[list[int]]) -> Optional[list[int]]:
        if v is None:
            return v
        if not v or len(set(v)) != len(v):
            raise ValueError("must be a non-empty list of distinct integers >= 1")
        return v


class AccuracyConfig(_Section):
    """The optional AccuracySmoke Job (k3:accuracy): lm-eval against the endpoint, a
    smoke test (k3infra/accuracy, docs/accuracy.md)."""

    enabled: bool = False
    # An image with lm-eval (requirements-accuracy.txt) and the tasks' datasets in its
    # HF cache (the Job runs offline), by digest. The shipped value is an all-zero
    # placeholder: renders work, `pulumi up` refuses it (docs/accuracy.md).
    image: DigestImage = ACCURACY_IMAGE
    tasks: list[str] = Field(default_factory=lambda: ["k3_smoke_gsm8k", "k3_smoke_arc"],
                             min_length=1, max_length=64)
    limit: integer(1, 10000) = 100      # items per task: the first N
    max_tokens: integer(16, 32768) = Field(default=1024, alias="maxTokens")
    seed: Seed = 0
    concurrency: integer(1, 256) = 8
    timeout_minutes: integer(5, 1440) = Field(default=60, alias="timeoutMinutes")
    results_size_gi: Gi = Field(default=1, alias="resultsSizeGi")
    results_storage_class: Optional[DnsSubdomain] = Field(default=None, alias="resultsStorageClass")
    resources: AccuracyResources = Field(default_factory=AccuracyResources)

    @field_validator("tasks")
    @classmethod
    def _shipped(cls, v: list[str]) -> list[str]:
        from importlib import resources

        shipped = sorted(p.name[:-5] for p in resources.files("k3infra.accuracy").joinpath(
            "tasks").iterdir() if p.name.endswith(".yaml"))
        unknown = [t for t in v if t not in shipped]
        if unknown or len(set(v)) != len(v):
            raise ValueError(f"must be distinct task names from {shipped}")
        return v


class MonitoringConfig(_Section):
    """Prometheus Operator objects and the Grafana dashboard (k3:monitoring).

    The CRDs are not probed (there is no cluster at render time): set serviceMonitor /
    prometheusRule only where the Prometheus Operator's CRDs are installed."""

    service_monitor: bool = Field(default=False, alias="serviceMonitor")
    prometheus_rule: bool = Field(default=False, alias="prometheusRule")
    dashboard: bool = False
    # The p99 latency alert fires above the receipt's p99 x (1 + margin / 100).
    p99_margin_pct: Percent = Field(default=10.0, alias="p99MarginPct")
    # Extra labels on the ServiceMonitor and PrometheusRule, for the Prometheus's
    # selectors (kube-prometheus-stack selects `release: <helm release>` by default).
    labels: Labels = Field(default_factory=dict)
    scrape_interval: ScrapeInterval = Field(default="30s", alias="scrapeInterval")
    # KV-cache usage (0..1] above which the "nearly full" alert fires.
    kv_cache_usage_threshold: number(gt=0, le=1) = Field(default=0.9, alias="kvCacheUsageThreshold")
    # Waiting requests above which a still-growing queue alerts.
    waiting_requests_threshold: Count = Field(default=0, alias="waitingRequestsThreshold")
    # Where the dashboard ConfigMap goes (Grafana's sidecar watches its own namespace
    # unless told otherwise); unset: the stack's namespace.
    dashboard_namespace: Optional[DnsLabel] = Field(default=None, alias="dashboardNamespace")
    # What one serving node costs per hour: adds a USD-per-million-generated-tokens
    # panel to the dashboard. Unset: no panel (no invented number).
    node_rate_usd_per_hour: Optional[number(0.01, 100_000)] = Field(default=None,
                                                                   alias="nodeRateUsdPerHour")
    # dcgm-exporter series scraped without honorLabels carry the GPU's pod as
    # exported_pod / exported_namespace; set true for such a scrape.
    dcgm_exported_labels: bool = Field(default=False, alias="dcgmExportedLabels")


class NetworkConfig(_Section):
    """Who may reach the serving port, and where pods may connect (k3:network).

    Ingress to the serving pods is denied except the port from these sources; egress is
    DNS only (plus the Hub for the prefetch Job, and for serving pods in node-local mode,
    whose init container fetches missing files)."""

    # Every pod in these namespaces may call the API (an ingress controller, a gateway).
    allow_from_namespaces: list[DnsLabel] = Field(default_factory=list, alias="allowFromNamespaces")
    # Pods with all of these labels in the stack's namespace may call the API.
    allow_from_pod_labels: Labels = Field(default_factory=dict, alias="allowFromPodLabels")
    # The metrics scraper's namespace (null: no scraper access).
    scraper_namespace: Optional[DnsLabel] = Field(default="monitoring", alias="scraperNamespace")
    # Narrow the scraper to pods with these labels (empty: the whole namespace).
    scraper_pod_labels: Labels = Field(default_factory=dict, alias="scraperPodLabels")
    # Cluster DNS: its namespace, and extra CIDRs (NodeLocal DNSCache: 169.254.20.10/32).
    dns_namespace: DnsLabel = Field(default="kube-system", alias="dnsNamespace")
    dns_cidrs: list[Cidr] = Field(default_factory=list, alias="dnsCidrs")
    # Where the Hub (or your HF_ENDPOINT mirror) is reachable: its CDN has no fixed
    # addresses, so the default is any address on the HTTPS port.
    hub_cidrs: list[Cidr] = Field(default_factory=lambda: ["0.0.0.0/0", "::/0"], min_length=1,
                                  alias="hubCidrs")
    hub_ports: list[Port] = Field(default_factory=lambda: [443], min_length=1, alias="hubPorts")
    # Addresses inside the cluster and its network (pods, services, nodes, the VPC): cut
    # out of every internet egress rule (Hub, engine build). The default is every
    # private range; list yours if the cluster uses public addresses inside.
    cluster_cidrs: list[Cidr] = Field(
        default_factory=lambda: ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                 "100.64.0.0/10", "fc00::/7"], alias="clusterCidrs")


# The maintained endpoint picker (llm-d-router, where the Gateway API Inference Extension's
# EPP moved), by digest. The shipped digest is an all-zero placeholder: renders work,
# `pulumi up` refuses it (docs/gateway.md shows how to read the tag's digest).
EPP_IMAGE = "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0@sha256:" + "0" * 64


class GatewayConfig(_Section):
    """The opt-in inference gateway (k3:gateway; k3infra/gateway, docs/gateway.md): an
    InferencePool over the serving pods, its endpoint picker, a Gateway + HTTPRoute on
    the implementation named here, and that implementation's API-key policy."""

    enabled: bool = False
    # The GatewayClass of an installed implementation (Envoy Gateway's quickstart: eg).
    class_name: Optional[DnsSubdomain] = Field(default=None, alias="className")
    # Which implementation the class belongs to: decides the key policy k3infra renders
    # and where its proxy pods run (the NetworkPolicy's peers).
    implementation: Literal["envoy-gateway", "kgateway", "istio", "gke"] = "envoy-gateway"
    # The Gateway's listener: HTTP on this port, or HTTPS with tlsSecret (a
    # kubernetes.io/tls Secret in the stack's namespace).
    port: Port = 80
    tls_secret: Optional[DnsLabel] = Field(default=None, alias="tlsSecret")
    # Where the implementation runs the Gateway's proxy pods and their labels (unset:
    # the implementation's default, docs/gateway.md); gke: the proxy-only subnet's CIDRs.
    proxy_namespace: Optional[DnsLabel] = Field(default=None, alias="proxyNamespace")
    proxy_pod_labels: Optional[Labels] = Field(default=None, alias="proxyPodLabels")
    proxy_cidrs: list[Cidr] = Field(default_factory=list, alias="proxyCidrs")
    epp_image: DigestImage = Field(default=EPP_IMAGE, alias="eppImage")
    # The endpoint picker watches the InferencePool and the pods: the API server's
    # endpoint addresses are its only egress beside DNS and the pods' metrics port.
    api_server_cidrs: list[Cidr] = Field(default_factory=list, alias="apiServerCidrs")
    # What the gateway does when the picker does not answer: FailOpen routes to any
    # ready pod of the pool (still behind both key checks), FailClose answers 5xx.
    failure_mode: Literal["FailOpen", "FailClose"] = Field(default="FailOpen", alias="failureMode")

    @field_validator("proxy_pod_labels")
    @classmethod
    def _proxy_labels(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        if v is not None and not v:
            raise ValueError("must name at least one label (unset: the implementation's default)")
        return v


class AutoscalingConfig(_Section):
    """Scaling the serving StatefulSet on queue depth (k3:autoscaling): a KEDA
    ScaledObject on vllm:num_requests_waiting (k3infra/operations/autoscaling.py). One
    replica is one 8-GPU node: `max` is what you may pay for."""

    enabled: bool = False
    # At least 2: the PodDisruptionBudget lets a drain take one replica, and one must
    # keep serving (checked in parse.py).
    min: Replicas = 2
    # Required when enabled: the most 8-GPU nodes the autoscaler may run.
    max: Optional[Replicas] = None
    # The Prometheus that scrapes the serving pods (KEDA's prometheus trigger queries it).
    prometheus_url: Optional[HttpUrl] = Field(default=None, alias="prometheusUrl")
    # Target waiting requests per replica: desired = ceil(sum(waiting) / this).
    waiting_per_replica: integer(1, 100_000) = Field(default=4, alias="waitingPerReplica")
    polling_interval_seconds: integer(5, 600) = Field(default=30, alias="pollingIntervalSeconds")
    # Unset: derived from the startup budget (capped at the HPA's 3600 s maximum).
    scale_down_stabilization_seconds: Optional[integer(0, 3600)] = Field(
        default=None, alias="scaleDownStabilizationSeconds")


class HostConfig(_Section):
    """One Docker host instead of a cluster (k3:host; k3infra/host). The Docker daemon is
    Pulumi's own `docker:host` setting (ssh://user@host or the local socket)."""

    # Weights tree and lock on the host's local NVMe (bind-mounted at /weights).
    weights_root: AbsPath = Field(default="/mnt/k3-weights", alias="weightsRoot")
    # Free space on weightsRoot's filesystem in decimal GB (`df -B1000000000`), checked
    # against the lock before anything is pulled; unset = checked only by the prefetch.
    free_gb: Optional[GB] = Field(default=None, alias="freeGB")
    # Where the API port is published. 0.0.0.0 / :: only with publishAllInterfaces.
    publish_address: IpAddress = Field(default="127.0.0.1", alias="publishAddress")
    publish_all_interfaces: bool = Field(default=False, alias="publishAllInterfaces")
    # bridge (ports published as above) or host (the proxy listens on every interface:
    # an explicit publishAllInterfaces choice too).
    network_mode: Literal["bridge", "host"] = Field(default="bridge", alias="networkMode")
    restart: Literal["unless-stopped", "always", "on-failure"] = "unless-stopped"

    @field_validator("weights_root")
    @classmethod
    def _abs_root(cls, v: str) -> str:
        if not v.startswith("/") or ".." in v.split("/") or v.rstrip("/") == "":
            raise ValueError("must be an absolute path below / without '..'")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _all_interfaces_chosen(self) -> "HostConfig":
        from k3infra.fieldtypes import is_wildcard

        # Parsed, not compared as text: ::ffff:0.0.0.0 (the IPv4-mapped wildcard) binds
        # every IPv4 address as 0.0.0.0 does.
        wide = is_wildcard(self.publish_address) or self.network_mode == "host"
        if wide and not self.publish_all_interfaces:
            raise ValueError(f"publishAddress {self.publish_address} / networkMode "
                             f"{self.network_mode} exposes the API on every interface: set "
                             "publishAllInterfaces = true to choose that, or keep 127.0.0.1")
        return self


class MultiNodeConfig(_Section):
    """One replica across the nodes of one NVLink domain (k3:multiNode, with
    k3:topology = multi-node; docs/multinode.md). Not the measured configuration. The
    accepted values are checked in k3infra/topology.py, which says why they are the only ones."""

    nodes_per_replica: integer(1, 64) = Field(default=2, alias="nodesPerReplica")
    gpus_per_node: integer(1, 64) = Field(default=4, alias="gpusPerNode")
    # The node label that names a node's NVLink domain; GPU feature discovery sets
    # nvidia.com/gpu.clique (<cluster UUID>.<clique id>) on multi-node NVLink trays.
    domain_label: DomainLabel = Field(default="nvidia.com/gpu.clique", alias="domainLabel")


class StackConfig(_Section):
    """All `k3:*` keys. Field aliases are the config key names."""

    weights_revision: HubCommit = Field(alias="weightsRevision")
    # None: the receipt's GPU (filled in by parse_stack_config from the receipt given).
    gpu_product: Optional[LabelValue] = Field(default=None, alias="gpuProduct")
    gpu_memory_gib: Optional[number(gt=0, le=16384)] = Field(default=None, alias="gpuMemoryGib")
    engine_image: Optional[DigestImage] = Field(default=None, alias="engineImage")
    replicas: Replicas = 1
    # single-node: one replica = one 8-GPU node (the receipt). multi-node: one replica
    # across k3:multiNode's nodes of one NVLink domain (not measured).
    topology: Literal["single-node", "multi-node"] = "single-node"
    multi_node: MultiNodeConfig = Field(default_factory=MultiNodeConfig, alias="multiNode")
    profile: Literal["measured", "upstream", "custom"] = "measured"
    api_key: Secret = Field(alias="apiKey")
    hf_token: Optional[Secret] = Field(default=None, alias="hfToken")
    accept_model_license: bool = Field(default=False, alias="acceptModelLicense")
    # None: the component's instance name (k3infra.naming), so two instances never
    # share a namespace by default.
    namespace: Optional[DnsLabel] = None
    # Whether this instance creates (and so owns, and deletes on destroy) the namespace,
    # with its Pod Security labels. None: only when the namespace is the instance's own
    # name (k3infra.naming.creates_namespace); any other name must say true or false.
    create_namespace: Optional[bool] = Field(default=None, alias="createNamespace")
    served_model_name: ServedModelName = Field(default="kimi-k3", alias="servedModelName")
    surface: SurfaceConfig = Field(default_factory=SurfaceConfig)
    custom: CustomConfig = Field(default_factory=CustomConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)
    cold_start: ColdStartConfig = Field(default_factory=ColdStartConfig, alias="coldStart")
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    node_pool: NodePoolConfig = Field(default_factory=NodePoolConfig, alias="nodePool")
    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig)
    accuracy: AccuracyConfig = Field(default_factory=AccuracyConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    autoscaling: AutoscalingConfig = Field(default_factory=AutoscalingConfig)
    host: Optional[HostConfig] = None

    @field_validator("api_key", "hf_token", mode="before")
    @classmethod
    def _wrap_secret(cls, v: Any) -> Any:
        if v is None or isinstance(v, Secret):
            return v
        if isinstance(v, str) and not v:
            raise ValueError("must not be empty")
        return Secret(v)

    @field_validator("api_key")
    @classmethod
    def _bearer_token(cls, v: Any) -> Any:
        # The serving proxy matches `Authorization: Bearer <key>` exactly (an Output is
        # checked when it resolves, by k3infra.serving.proxy.keys_map).
        key = v.reveal() if isinstance(v, Secret) else v
        if isinstance(key, str) and key != SECRET_PLACEHOLDER and not API_KEY.matches(key):
            raise ValueError(API_KEY.accepted)
        return v
