"""The stack configuration: every `k3:*` key as a pydantic model (the sections and
`StackConfig`)."""
from __future__ import annotations

from importlib import resources
from typing import Annotated, Any, Literal, Optional, Union
from urllib.parse import urlsplit

from pydantic import Field, create_model, field_validator, model_validator

from k3infra.config.base import (SECRET_PLACEHOLDER, PROXY_IMAGE, Secret, _Section, unset)
from k3infra.config.pools import NodePoolConfig
from k3infra.weights import store
from k3infra.fieldtypes import (API_KEY, Accepted, AbsPath, Cidr, Commit, Count, CronField,
                                DigestImage, DnsCidr, DnsLabel, DnsSubdomain, DockerTag, EnvName,
                                HubCommit, Factor, FilePath, Flag, GB, GBps, Gi, GitUrl, HttpUrl,
                                IpAddress, Labels, LabelValue, Percent, Port, RegistryHost,
                                Replicas, Repository, ScrapeInterval, Seconds, Seed,
                                ServedModelName, Sha256Hex, UnprivilegedPort, Version,
                                LABEL_KEY_REGEX, integer, number, pattern, is_wildcard)

# A region name as S3 APIs take it (AWS's us-east-1, an S3-compatible store's own name).
StoreRegion, _ = pattern(r"[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?", "must be a region name (lowercase "
                         "letters, digits, '-' and '_', at most 63)", 63)
# The store's URL (its rules: k3infra.weights.store.parse_store_url, checked after this).
StoreUrlText, _ = pattern(r"[a-z0-9]+://\S+", "must be " + store.ACCEPTED_URL, 2048)
DomainLabel, _ = pattern(LABEL_KEY_REGEX, "a node label key naming the node's NVLink domain, such "
                         "as nvidia.com/gpu.clique (set by GPU feature discovery on multi-node "
                         "NVLink trays)", 317)

# k3:receipt: a shipped receipt's id or a project-relative .yaml path (the rest of its
# rules, and the file it names: k3infra.receipt.named_receipt_path).
ReceiptName, _ = pattern(r"[A-Za-z0-9][A-Za-z0-9._/-]*", "a shipped receipt's id (k3infra receipt "
                         "list) or a .yaml file inside the Pulumi project", 255)

# The accuracy smoke test's image (k3:accuracy.image): yours, built with lm-eval and the
# task datasets; the all-zero digest is a placeholder `pulumi up` refuses.
ACCURACY_IMAGE = "k3infra-accuracy:lm-eval-0.4.13@sha256:" + "0" * 64


class SurfaceConfig(_Section):
    """Serving-surface settings from the receipt's allow-list (k3:surface)."""

    args: dict[Flag, Union[bool, str]] = Field(
        default_factory=dict,
        description="allow-listed `vllm serve` flags to a string value (or `true` for a "
                    "switch); the allow-list is the receipt's `serve.surface.args`")
    env: dict[EnvName, str] = Field(
        default_factory=dict,
        description="allow-listed variables to values; the allow-list is the receipt's "
                    "`serve.surface.env` (`VLLM_API_KEY` only ever comes from `k3:apiKey`)")


class CustomConfig(_Section):
    """Engine-path changes; only accepted with `k3:profile: custom` (k3:custom)."""

    args: list[str] = Field(default_factory=list,
                            description="tokens appended after the receipt's engine args")
    env: dict[EnvName, str] = Field(default_factory=dict,
                                    description="variables added to the engine's environment")


class ContainerResources(_Section):
    """A container's CPU and memory: the requests the scheduler reserves on the node
    and the limits. CPU in cores (0.5 is 500m), memory in GiB (0.25 is 256Mi). Each
    use below is a subclass with that container's defaults, so a stack that sets one
    number keeps the other three."""

    cpu: float = Field(default=1, ge=0.01, le=1024,
                       description="the CPU request in cores, what the scheduler reserves on "
                                   "the node (`0.5` renders as `500m`)")
    cpu_limit: Optional[float] = Field(default=1, ge=0.01, le=1024, alias="cpuLimit",
                                       description="the CPU limit in cores",
                                       json_schema_extra=unset("the request"))
    memory_gi: float = Field(default=1, ge=1 / 64, le=65536, alias="memoryGi",
                             description="the memory request in GiB (`0.25` renders as `256Mi`)")
    memory_limit_gi: Optional[float] = Field(default=1, ge=1 / 64, le=65536, alias="memoryLimitGi",
                                             description="the memory limit in GiB",
                                             json_schema_extra=unset("the request"))

    @property
    def cpu_max(self) -> float:
        """The CPU limit (the request where cpuLimit is unset)."""
        return self.cpu if self.cpu_limit is None else self.cpu_limit

    @property
    def memory_max_gi(self) -> float:
        """The memory limit in GiB (the request where memoryLimitGi is unset)."""
        return self.memory_gi if self.memory_limit_gi is None else self.memory_limit_gi

    @field_validator("cpu", "cpu_limit", "memory_gi", "memory_limit_gi", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        # pydantic's lax mode reads `true` as 1: a switch is never a size.
        if isinstance(v, bool):
            raise ValueError("must be a number, not true/false")
        return v

    @model_validator(mode="after")
    def _request_within_limit(self) -> "ContainerResources":
        # Kubernetes refuses a request above its limit; say so before anything exists.
        if self.cpu > self.cpu_max:
            raise ValueError(f"cpu {self.cpu:g} is above cpuLimit {self.cpu_max:g}; "
                             "a request must be at most its limit")
        if self.memory_gi > self.memory_max_gi:
            raise ValueError(f"memoryGi {self.memory_gi:g} is above memoryLimitGi "
                             f"{self.memory_max_gi:g}; a request must be at most its limit")
        for name, value, unit in (("cpu", self.cpu, 1000), ("cpuLimit", self.cpu_max, 1000),
                                  ("memoryGi", self.memory_gi, 1024),
                                  ("memoryLimitGi", self.memory_max_gi, 1024)):
            if abs(value * unit - round(value * unit)) > 1e-6:
                raise ValueError(f"{name} {value:g} is not a whole number of "
                                 f"{'millicores' if unit == 1000 else 'MiB'}")
        return self

    def manifest(self) -> dict:
        """The container's `resources`, as Kubernetes quantities ("16", "500m", "32Gi",
        "256Mi")."""
        return {"requests": {"cpu": cpu_quantity(self.cpu), "memory": memory_quantity(self.memory_gi)},
                "limits": {"cpu": cpu_quantity(self.cpu_max),
                           "memory": memory_quantity(self.memory_max_gi)}}


class _LimitIsRequest(ContainerResources):
    """Resources whose limits are their requests (the vLLM container: the scheduler
    reserves what the engine uses; docs/serving.md#sizing)."""

    @model_validator(mode="after")
    def _limits_are_requests(self) -> "_LimitIsRequest":
        for name, limit, request_name, request in (
                ("cpuLimit", self.cpu_limit, "cpu", self.cpu),
                ("memoryLimitGi", self.memory_limit_gi, "memoryGi", self.memory_gi)):
            if limit is not None and limit != request:
                raise ValueError(f"{name} {limit:g} differs from {request_name} {request:g}: "
                                 f"this container's limit is its request; leave {name} unset")
        return self


def cpu_quantity(cores: float) -> str:
    milli = round(cores * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_quantity(gi: float) -> str:
    mi = round(gi * 1024)
    return f"{mi // 1024}Gi" if mi % 1024 == 0 else f"{mi}Mi"


def _resources(name: str, doc: str, cpu: float, cpu_limit: Optional[float], memory_gi: float,
               memory_limit_gi: Optional[float],
               base: type[ContainerResources] = ContainerResources,
               bounds: Optional[dict[str, tuple[float, float]]] = None
               ) -> type[ContainerResources]:
    """A ContainerResources with one container's defaults; `bounds` (`{"cpu": (1, 1024)}`)
    narrow the shape's for that container. The descriptions stay the shape's."""
    shape = ContainerResources.model_fields

    def default(field: str, value: Optional[float]):
        f = shape[field]
        ge, le = (bounds or {}).get(field, [next(getattr(m, k) for m in f.metadata if hasattr(m, k))
                                    for k in ("ge", "le")])
        return (f.annotation, Field(default=value, alias=f.alias, ge=ge, le=le,
                                    description=f.description,
                                    json_schema_extra=f.json_schema_extra))

    return create_model(name, __base__=base, __doc__=doc, __module__=__name__,
                        cpu=default("cpu", cpu), cpu_limit=default("cpu_limit", cpu_limit),
                        memory_gi=default("memory_gi", memory_gi),
                        memory_limit_gi=default("memory_limit_gi", memory_limit_gi))


# The defaults are the sizes of the receipt's 8-GPU node; a small node (a CPU test
# node, a small pool) lowers them (docs/configuration.md).
# The vLLM container: its lower bounds are a small CPU node's; the preflight holds cpu to
# the engine's worker processes (k3infra/preflight.py).
EngineResources = _resources(
    "EngineResources", "The vLLM container (its limits are its requests).",
    96, None, 1536, None, base=_LimitIsRequest, bounds={"cpu": (1, 1024), "memory_gi": (1, 8192)})
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

    storage_read_gbps: GBps = Field(
        default=2.0, alias="storageReadGBps",
        description="storage read throughput the weights gate sees (GB/s); sizes the gate's "
                    "budget ([cold start](coldstart.md)). 2 GB/s is conservative for one local "
                    "NVMe or a parallel file system (a p6-b300's 8 x 3.84 TB NVMe read far "
                    "faster in RAID 0): a slow guess only makes the startup budget more "
                    "generous, a fast one kills pods still loading")
    # Pod sizes: at most what one node of the pool can hold (an 8x B300 node has 2 x 128
    # cores and ~4 TiB of memory; /dev/shm is memory).
    shm_size_gi: integer(1, 8192) = Field(default=64, alias="shmSizeGi",
                                          description="`/dev/shm` (memory-backed emptyDir) "
                                                      "size, GiB")
    resources: EngineResources = Field(
        default_factory=EngineResources,
        description="the vLLM container's requests = limits ([container "
                    "resources](configuration.md#container-resources)); the preflight refuses "
                    "a cpu below the engine's worker processes (one per GPU of the pod)")
    cache_size_gi: Gi = Field(default=100, alias="cacheSizeGi",
                              description="the compile-cache volume per replica, GiB")
    cache_storage_class: Optional[DnsSubdomain] = Field(
        default=None, alias="cacheStorageClass", description="the compile cache's storage class",
        json_schema_extra=unset("the cluster default"))
    termination_grace_seconds: integer(30, 86400) = Field(
        default=180, alias="terminationGraceSeconds",
        description="the pod's termination grace period; must cover the drain + 30 s")
    drain_seconds: Optional[integer(0, 3600)] = Field(
        default=None, alias="drainSeconds",
        description="the preStop drain before vLLM gets SIGTERM (which aborts requests still "
                    "running)",
        json_schema_extra=unset("derived: 10 s of endpoint propagation + the receipt's "
                                "slowest measured request"))
    update_strategy: Literal["RollingUpdate", "OnDelete"] = Field(
        default="RollingUpdate", alias="updateStrategy",
        description="`RollingUpdate` replaces pods one node at a time from the highest ordinal "
                    "down; `OnDelete` replaces a pod only when you delete it")
    update_partition: integer(0, 1024) = Field(
        default=0, alias="updatePartition",
        description="pods with an ordinal below it keep the old template (a canary: set it to "
                    "replicas - 1, check the new pod, then lower it); ≤ `k3:replicas`")
    port: UnprivilegedPort = Field(
        default=8000,
        description="the API port: the authenticating proxy's, the only one clients reach "
                    "([security](security.md)); the four ports are distinct and ≥ 1024 (the "
                    "proxy runs non-root)")
    metrics_port: UnprivilegedPort = Field(
        default=9090, alias="metricsPort",
        description="the proxy's `/metrics` port, the only one the scraper reaches")
    health_port: UnprivilegedPort = Field(
        default=8081, alias="healthPort",
        description="the proxy's `/health` port (kubelet probes; no NetworkPolicy peer)")
    engine_port: UnprivilegedPort = Field(
        default=8001, alias="enginePort",
        description="vLLM's own port, on `127.0.0.1` only: unreachable from outside the pod")
    proxy_image: DigestImage = Field(
        default=PROXY_IMAGE, alias="proxyImage",
        description="the proxy's image (nginx, non-root) by digest; the shipped digest is a "
                    "placeholder `pulumi up` refuses ([security](security.md))")
    proxy_resources: ProxyResources = Field(
        default_factory=ProxyResources, alias="proxyResources",
        description="the proxy's requests and limits; nginx runs one worker per CPU of "
                    "`cpuLimit` (at least one)")
    tmp_size_gi: integer(1, 4096) = Field(
        default=16, alias="tmpSizeGi",
        description="the `sizeLimit` of the vLLM container's `/tmp` emptyDir (the gate's "
                    "verified runtime copy, vLLM's scratch), GiB. A limit, not a reservation: "
                    "past it the kubelet evicts the pod. 16 Gi is generous on the receipt's "
                    "node; a small node whose disk also holds the weights lowers it so a "
                    "runaway writer is evicted before the node's disk fills")

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

    page = "coldstart.md"

    image_gb: number(0.01, 10_000) = Field(
        default=30.0, alias="imageGB",
        description="the engine image's compressed size, GB (the pull phase). Issue 20: 20-30 "
                    "GB images pulled in 1-10 min; 30 GB in 10 min is the slow end")
    image_pull_gbps: GBps = Field(default=0.05, alias="imagePullGBps",
                                  description="the registry pull rate, GB/s (same source)")
    warm_load_gbps: GBps = Field(
        default=1.5, alias="warmLoadGBps",
        description="the engine's load rate from a hot page cache, GB/s. vllm-project/vllm PR "
                    "36012: DeepSeek-V3-0324 (~689 GB), TP8 on 8 x B200, 215-435 s with the "
                    "checkpoint prefetched into the page cache; 689 GB / 435 s = 1.58 GB/s, "
                    "the slow end")
    cold_load_gbps: GBps = Field(
        default=0.18, alias="coldLoadGBps",
        description="the load rate with cold lazy mmap reads, GB/s. The same PR without "
                    "prefetching: 1500-3660 s; 689 GB / 3660 s = 0.19 GB/s. vllm-project/vllm "
                    "issue 40988: a ~60 min load stall on ext4 without prefetch")
    engine_start_seconds: Seconds = Field(
        default=80, alias="engineStartSeconds",
        description="vLLM's own start before the load (imports, the API server, the engine "
                    "core and its workers, device init). Measured: 52.6-76.4 s on one H200 at "
                    "TP1 with vLLM 0.25.0 ([cold start](coldstart.md)); the slowest, rounded up "
                    "(a machine's first start)")
    compile_cold_seconds: Seconds = Field(
        default=1200, alias="compileColdSeconds",
        description="torch.compile and CUDA graph capture at TP8 from an empty cache. Issue "
                    "20: 4-10 min cold; twice the top")
    compile_warm_seconds: Seconds = Field(
        default=240, alias="compileWarmSeconds",
        description="the same from a seeded cache. Issue 20: 1-2 min with warm caches (vLLM "
                    "PR 16848 loads compiled graphs from the cache); twice the top")
    compile_cache: Literal["cold", "seeded"] = Field(
        default="cold", alias="compileCache",
        description="`seeded`: every serving node's compile cache was seeded "
                    "([cold start](coldstart.md)), so the deadline may assume the warm compile; "
                    "`cold` assumes nothing is seeded")
    profiling_seconds: Seconds = Field(
        default=180, alias="profilingSeconds",
        description="memory profiling, KV cache allocation and warmup after the load: an "
                    "allowance, not a measurement (no public figure for this model)")
    tail_factor: Factor = Field(
        default=1.5, alias="tailFactor",
        description="every phase's estimate is multiplied by this: k3infra's margin for the "
                    "tail")
    prepull: bool = Field(
        default=True,
        description="pull the engine image on every serving node while the weights download "
                    "(a DaemonSet), so the pull is off the serving pod's path")
    download_stall_seconds: integer(30, 86400) = Field(
        default=300, alias="downloadStallSeconds",
        description="the prefetch restarts a download that moved no byte for this long (same "
                    "resume path)")


# node-local weights live under one of these host prefixes only: the node pools mount
# local NVMe there, and a root elsewhere (/, /etc, /var/lib/kubelet...) would hand the
# weights volume's writers a system directory.
NODE_LOCAL_ROOT_PREFIXES = ("/mnt/", "/var/lib/k3infra/")


class StoreConfig(_Section):
    """The weights' origin in your own object store instead of the Hub (k3:weights.store;
    k3infra/weights/store.py, docs/weights.md "From your object store"). Fill it once
    with `k3infra weights mirror`. Credentials are never keys here: a Secret's name or a
    ServiceAccount bound to the cloud's workload identity."""

    allow_http: bool = Field(
        default=False, alias="allowHttp",
        description="plain HTTP to the endpoint, chosen explicitly (an S3-compatible store inside "
                    "your network without TLS); the bytes are hashed against the lock all the "
                    "same, the credentials travel in the clear")
    endpoint: Optional[HttpUrl] = Field(
        default=None,
        description="an S3-compatible endpoint (MinIO, Ceph RGW, SeaweedFS, R2, OCI's or Nebius' "
                    "S3 API), or an Azure or GCS endpoint of your own",
        json_schema_extra=unset("the provider's public endpoint"))
    region: Optional[StoreRegion] = Field(
        default=None, description="the bucket's region (S3)",
        json_schema_extra=unset("the provider's default"))
    # CoreWeave AI Object Storage refuses path-style requests.
    virtual_hosted_style: bool = Field(
        default=False, alias="virtualHostedStyle",
        description="S3 stores that refuse path-style requests: the bucket in the host name; "
                    "the endpoint is then the bucket's own host (`https://BUCKET.host`)")
    credentials_secret: Optional[DnsSubdomain] = Field(
        default=None, alias="credentialsSecret",
        description="an existing Secret in the stack's namespace with the provider's keys: "
                    "`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (optional "
                    "`AWS_SESSION_TOKEN`); `GOOGLE_SERVICE_ACCOUNT_KEY`; "
                    "`AZURE_STORAGE_ACCOUNT_KEY` or `AZURE_STORAGE_SAS_KEY`. Read by the "
                    "prefetch Job alone, by reference")
    service_account: Optional[DnsSubdomain] = Field(
        default=None, alias="serviceAccount",
        description="instead of a Secret: an existing ServiceAccount bound to the cloud's "
                    "workload identity (EKS IRSA or Pod Identity, GKE or Azure workload "
                    "identity); the prefetch Job runs as it, its NetworkPolicy reaching that "
                    "identity's node-local endpoint (EKS Pod Identity's agent, GKE's metadata "
                    "server). One of `credentialsSecret` and `serviceAccount` is required")
    cidrs: list[Cidr] = Field(
        default_factory=lambda: ["0.0.0.0/0", "::/0"], min_length=1,
        description="where the prefetch may connect to reach the store, on the endpoint's port "
                    "(443 by default), less `k3:network.clusterCidrs` inside these blocks; a "
                    "store inside your network: its CIDRs")
    node_gbps: GBps = Field(
        default=2.0, alias="nodeGBps",
        description="expected download rate of one node from the store, GB/s: the download "
                    "phase of the cold start (the prefetch Job's timeout and the fill plan); "
                    "conservative on purpose")
    url: StoreUrlText = Field(
        description="`s3://BUCKET[/PREFIX]`, `gs://BUCKET[/PREFIX]` or "
                    "`az://ACCOUNT/CONTAINER[/PREFIX]`; the tree lies under "
                    "`<owner>--<name>/<revision>/` with `<revision>.lock.json` beside it "
                    "(`k3infra weights mirror` writes both)")

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
        if self.endpoint is None:
            return 443
        parts = urlsplit(self.endpoint)
        return parts.port or (80 if parts.scheme == "http" else 443)


class WeightsConfig(_Section):
    """Where the weights live and how they get there (k3:weights)."""

    mode: Literal["shared", "node-local"] = Field(
        default="shared",
        description="`shared`: one ReadWriteMany PVC, one prefetch Job; `node-local`: one local "
                    "PersistentVolume per serving node, claimed per replica; one prefetch Job "
                    "per replica; the serving pods never fetch")
    lock_file: Optional[FilePath] = Field(
        default=None, alias="lockFile",
        description="a k3-tree-v1 lock file; its revision must be `k3:weightsRevision` and its "
                    "tree digest the receipt's (unless `custom`). Every weights container then "
                    "holds the tree to this lock's digest. Unset: the prefetch Job derives the "
                    "lock from Hub metadata at the pinned revision, and every container holds "
                    "it to the receipt's digest, in every profile (a `custom` stack serving "
                    "another tree must ship its lock)")
    storage_class: Optional[DnsSubdomain] = Field(
        default=None, alias="storageClass",
        description="the RWX storage class for `shared` (your cloud's parallel file system)",
        json_schema_extra=unset("the cluster default"))
    size_gi: Gi = Field(
        default=3200, alias="sizeGi",
        description="each weights volume's size, GiB: two trees (a revision change fetches the "
                    "new tree beside the old one, in a staging directory renamed into place, "
                    "before the old one is cleaned up) plus headroom; the preflight refuses a "
                    "size below two trees (the lock total, or the receipt's size)")
    node_local_root: AbsPath = Field(
        default="/mnt/k3-weights", alias="nodeLocalRoot",
        description="where the node pools mount local NVMe for `node-local`; a directory under "
                    "`/mnt/` or `/var/lib/k3infra/`, no `..`")
    local_storage_class: DnsSubdomain = Field(
        default="k3-local-nvme", alias="localStorageClass",
        description="`node-local`: the StorageClass of the per-node local PersistentVolumes "
                    "(node affinity, `WaitForFirstConsumer`); see "
                    "[weights](weights.md#node-local-mode-local-persistentvolumes) for what "
                    "creates them")
    hub_endpoint: Optional[HttpUrl] = Field(
        default=None, alias="hubEndpoint",
        description="a Hub mirror or proxy inside your network: the prefetch's `HF_ENDPOINT` "
                    "(as in huggingface_hub, `http(s)://host[:port][/path]`); narrow "
                    "`k3:network.hubCidrs`/`hubPorts` to it",
        json_schema_extra=unset("the Hugging Face Hub"))
    download_gbps: GBps = Field(
        default=0.5, alias="downloadGBps",
        description="expected Hub download bandwidth, GB/s; sizes how long `pulumi up` waits "
                    "for the prefetch Job")
    source: Literal["hub", "cluster", "cluster-then-hub"] = Field(
        default="cluster-then-hub",
        description="where node-local copies after the first take their bytes: `hub` (every "
                    "copy from the Hub, N x the tree), `cluster` (in-cluster sources of "
                    "verified copies only; copy 0 still from the Hub), `cluster-then-hub` "
                    "(those first, the Hub as fallback: 1x the tree from the Hub, and a dead "
                    "source costs time, not the fill). No effect in `shared` mode (one copy, "
                    "one Hub pull). See [weights](weights.md#once-per-cluster-in-cluster-sources)")
    store: Optional[StoreConfig] = Field(
        default=None,
        description="your own object store as the weights' origin instead of the Hub: every "
                    "fill that would read the Hub reads it (copy 0, the fan-out's fallback). "
                    "Fill it once with `k3infra weights mirror`; see "
                    "[weights](weights.md#from-your-own-object-store)",
        json_schema_extra=unset("the Hub"))
    cluster_gbps: GBps = Field(
        default=2.0, alias="clusterGBps",
        description="expected rate of one in-cluster transfer (a source to a filling node), "
                    "GB/s: sizes the in-cluster fills' timeouts and the fill plan `k3infra "
                    "render` prints; conservative on purpose (a low guess only lengthens the "
                    "timeouts)")
    gate_mode: Literal["warm", "stamps"] = Field(
        default="warm", alias="gateMode",
        description="the check before every vLLM start: `warm` = full read-and-hash of the "
                    "tree (also warms the page cache for the load); `stamps` = full at pod "
                    "creation, then the pod's own stamps on container restarts (nodes whose "
                    "RAM cannot hold the tree)")
    audit_schedule: Optional[CronField] = Field(
        default="30 4 * * 0", alias="auditSchedule",
        description="cron schedule of the read-only full re-verify of every copy (a CronJob "
                    "per volume); `disabled` turns it off")
    prefetch_resources: PrefetchResources = Field(
        default_factory=PrefetchResources, alias="prefetchResources",
        description="the prefetch Job's container: parallel downloads and hashing of the "
                    "1.5 TB tree")
    gate_resources: GateResources = Field(
        default_factory=GateResources, alias="gateResources",
        description="the gate alone: the audit CronJob, the gate before a weights reader "
                    "(benchmark Job), an in-cluster source's start check. The serving gate runs "
                    "inside the vLLM container, under `k3:serving.resources`")
    hash_workers: integer(1, 256) = Field(
        default=32, alias="hashWorkers",
        description="files hashed in parallel by the prefetch, the gate and the audit. The "
                    "gate reads the whole tree before every engine start: on the receipt's node "
                    "(192 vCPUs) 32 threads hash ~50 GB/s, faster than the local NVMe reads "
                    "([weights](weights.md)), so the disk stays the limit; a small node sets "
                    "about its CPU count")

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

    cuda_devel: DigestImage = Field(
        default="nvidia/cuda:13.0.2-devel-ubuntu22.04" + _PLACEHOLDER_DIGEST, alias="cudaDevel",
        description="the build and runtime base (vLLM's own CUDA 13 build base)")
    uv: DigestImage = Field(default="ghcr.io/astral-sh/uv:0.8.22" + _PLACEHOLDER_DIGEST,
                            description="uv, which installs the locked Python packages")
    rust: DigestImage = Field(default="rust:1.90.0-slim-bookworm" + _PLACEHOLDER_DIGEST,
                              description="the Rust toolchain (its `/usr/local/cargo` and "
                                          "`/usr/local/rustup` are copied; no `curl | sh`)")


class EngineConfig(_Section):
    """How the engine image is obtained (k3:engine). docs/engine.md explains each key."""

    page = "engine.md"

    # parse_stack_config fills `build` in; code after it always sees a mode.
    build: Optional[Literal["prebuilt", "in-cluster", "local"]] = Field(
        default=None,
        description="`prebuilt` (nothing is built: `k3:engineImage`), `in-cluster` (a Job on "
                    "a CPU node runs rootless BuildKit over `images/`), `local` "
                    "(pulumi-docker-build on the operator's machine); one rule for "
                    "`K3ServingStack` and the stack templates, which leave it unset",
        json_schema_extra=unset("`prebuilt` with `k3:engineImage`, else `in-cluster` (the "
                                "`upstream` profile and a Docker host need `k3:engineImage`)"))
    commit: Optional[Commit] = Field(
        default=None,
        description="the receipt's short engine commit resolved once to its full 40-hex SHA "
                    "(docs/engine.md, \"Pinning the engine commit\"); it must start with the "
                    "receipt's short SHA. Builds take only this: `pulumi up` refuses to build "
                    "without it")
    base_images: BaseImages = Field(
        default_factory=BaseImages, alias="baseImages",
        description="the recipe's base images by digest; the shipped placeholders are refused "
                    "for a build")
    registry: Optional[Repository] = Field(
        default=None,
        description="the repository the build pushes to, without tag or digest; required with "
                    "a build")
    tag: Optional[DockerTag] = Field(
        default=None, description="the tag pushed beside the digest",
        json_schema_extra=unset("`vllm-<commit>-cu130`, from the receipt's engine commit"))
    registry_secret: Optional[DnsLabel] = Field(
        default=None, alias="registrySecret",
        description="in-cluster: an existing kubernetes.io/dockerconfigjson Secret with push "
                    "rights, in the build namespace; required")
    build_namespace: Optional[DnsLabel] = Field(
        default=None, alias="buildNamespace",
        description="in-cluster: the build's own namespace (must differ from `k3:namespace`). "
                    "Rootless BuildKit needs Pod Security `privileged`; the serving namespace "
                    "stays `restricted`",
        json_schema_extra=unset("`<k3:namespace>-build`"))
    context: Literal["configmap", "git"] = Field(
        default="configmap",
        description="in-cluster: where BuildKit reads `images/` from: `configmap` uploads this "
                    "checkout's `images/` (a few small files); `git` builds `gitUrl` at a "
                    "pinned 40-hex `gitRevision`")
    recipe_dir: Optional[FilePath] = Field(
        default=None, alias="recipeDir",
        description="`profile: custom`: a recipe of your own (its `Dockerfile` with the "
                    "`wheel-export` and `runtime` stages build.sh runs, its `build.lock` and "
                    "`runtime.lock`), relative to the Pulumi project; `local`, or `in-cluster` "
                    "with `context: configmap`",
        json_schema_extra=unset("the shipped `images/`"))
    git_url: Optional[GitUrl] = Field(
        default=None, alias="gitUrl",
        description="`context: git`: the repository BuildKit reads `images/` from")
    git_revision: Optional[Commit] = Field(
        default=None, alias="gitRevision", description="`context: git`: its commit")
    # MAX_JOBS/NVCC_THREADS are derived from buildCpu and buildMemoryGi unless set
    # (k3infra.engine.plan.build_parallelism): nvcc jobs need several GiB each.
    build_cpu: integer(1, 1024) = Field(
        default=32, alias="buildCpu",
        description="the CPU build node's cores (request = limit); MAX_JOBS/NVCC_THREADS "
                    "derive from this and `buildMemoryGi`. At least 1: a small recipe of your "
                    "own (`recipeDir`) builds on one core; the shipped vLLM recipe wants the "
                    "default")
    build_memory_gi: integer(16, 8192) = Field(
        default=128, alias="buildMemoryGi",
        description="the build node's memory, GiB (request = limit: what MAX_JOBS is sized "
                    "for)")
    build_disk_gi: integer(50, 65536) = Field(
        default=200, alias="buildDiskGi",
        description="the build's ephemeral storage, GiB")
    max_jobs: Optional[integer(1, 1024)] = Field(
        default=None, alias="maxJobs",
        description="override MAX_JOBS; more jobs than the memory holds are refused",
        json_schema_extra=unset("derived"))
    nvcc_threads: Optional[integer(1, 8)] = Field(
        default=None, alias="nvccThreads", description="override NVCC_THREADS",
        json_schema_extra=unset("derived"))
    build_node_selector: Labels = Field(
        default_factory=dict, alias="buildNodeSelector",
        description="where the build pod goes (always off `nvidia.com/gpu.product` nodes)")
    build_isolation: Literal["node-pool", "runtime-class"] = Field(
        default="node-pool", alias="buildIsolation",
        description="in-cluster: what keeps the build (untrusted setup code, unconfined "
                    "seccomp) away from other workloads: `node-pool`, only nodes labelled and "
                    "tainted `k3infra.dev/engine-build=true` (a pool for builds alone); "
                    "`runtime-class`, a sandboxed RuntimeClass (gVisor, Kata) named by "
                    "`buildRuntimeClass`")
    build_runtime_class: Optional[DnsLabel] = Field(
        default=None, alias="buildRuntimeClass",
        description="`runtime-class`: the sandboxed RuntimeClass's name")
    api_server_cidrs: list[Cidr] = Field(
        default_factory=list, alias="apiServerCidrs",
        description="in-cluster: the API server's endpoint addresses (the report container "
                    "writes the result there); every other cluster address is cut out of the "
                    "build's egress; required for `pulumi up`")
    registry_cidrs: list[Cidr] = Field(
        default_factory=list, alias="registryCidrs",
        description="in-cluster: a registry or mirror inside your network (cluster CIDRs are "
                    "otherwise unreachable from the build)")
    plain_http_registries: list[RegistryHost] = Field(
        default_factory=list, alias="plainHttpRegistries",
        description="in-cluster: registries inside your network without TLS, for BuildKit's "
                    "pulls and its push (`buildkitd.toml`, `http = true`); your nodes' "
                    "container runtime must be told as well")
    cache_registry: Optional[Repository] = Field(
        default=None, alias="cacheRegistry",
        description="the build cache's own repository (never `registry`, the serving image's)",
        json_schema_extra=unset("unset: no registry cache"))
    cache_registry_secret: Optional[DnsLabel] = Field(
        default=None, alias="cacheRegistrySecret",
        description="in-cluster: its own dockerconfigjson push Secret (not `registrySecret`)")
    build_timeout_minutes: integer(30, 10080) = Field(
        default=600, alias="buildTimeoutMinutes",
        description="the build Job's deadline (Pulumi waits 15 min longer)")
    sccache_secret: Optional[DnsLabel] = Field(
        default=None, alias="sccacheSecret",
        description="in-cluster: a Secret whose key `env` holds SCCACHE_* settings (bucket, "
                    "keys) for a remote sccache")
    buildkit_image: DigestImage = Field(
        default="moby/buildkit:v0.23.2-rootless@sha256:" + "0" * 64, alias="buildkitImage",
        description="in-cluster: the BuildKit image, exact tag + digest. The shipped digest is "
                    "an all-zero placeholder (renders work, `pulumi up` refuses it): "
                    "[engine](engine.md) shows how to read the real digest of each tag")
    reporter_image: DigestImage = Field(
        default="python:3.12.11-slim-bookworm@sha256:" + "0" * 64, alias="reporterImage",
        description="in-cluster: the report container's image, pinned the same way")
    upstream_version: Optional[Version] = Field(
        default=None, alias="upstreamVersion",
        description="`upstream` profile: the released vLLM version of `k3:engineImage` "
                    "(≥ 0.33.0)")
    wheel_sha256: Optional[Sha256Hex] = Field(
        default=None, alias="wheelSha256",
        description="`prebuilt`: the image's `dev.k3infra.engine.wheel-sha256` label, carried "
                    "to the outputs")
    pull_secrets: list[DnsLabel] = Field(
        default_factory=list, alias="pullSecrets",
        description="existing kubernetes.io/dockerconfigjson Secrets in the stack's namespace "
                    "that pull the engine image from a private registry (every pod that runs "
                    "it: serving, weights prefetch, benchmark)")

    def pull_secret_refs(self) -> dict:
        """`imagePullSecrets` for a pod spec that runs the engine image ({} when none)."""
        return {"imagePullSecrets": [{"name": n} for n in self.pull_secrets]} if self.pull_secrets else {}


class BenchmarkConfig(_Section):
    """The optional in-cluster benchmark Job (k3:benchmark)."""

    page = "benchmark.md"

    enabled: bool = Field(default=False, description="add the Benchmark component")
    # parse_stack_config fills the receipt's grid in, from the receipt given.
    concurrencies: Optional[list[integer(1, 4096)]] = Field(
        default=None, max_length=64, description="the concurrencies of Workload A, distinct",
        json_schema_extra=unset("the receipt's grid"))
    runs: integer(1, 10) = Field(
        default=2,
        description="the grid is repeated this many times (the receipt's two runs agreed "
                    "within 0.4 %); every run and every request gets its own prompt")
    seed: Seed = Field(default=0,
                       description="seeds Workload A's prompts: same seed + run id + tokenizer "
                                   "-> identical prompts")
    measured_requests: Optional[integer(1, 10000)] = Field(
        default=None, alias="measuredRequests",
        description="measured requests per concurrency; another count is no longer the "
                    "receipt's workload and `bench compare` says so",
        json_schema_extra=unset("the receipt's count"))
    ignore_eos: bool = Field(
        default=True, alias="ignoreEos",
        description="every request generates exactly the receipt's output cap (comparable "
                    "end-to-end latency)")
    tolerance_pct: number(0, 100) = Field(
        default=10.0, alias="tolerancePct",
        description="`bench compare` / `verify`: allowed |measured - receipt| / receipt, both "
                    "directions, percent")
    results_size_gi: Gi = Field(default=1, alias="resultsSizeGi",
                                description="the results volume, GiB")
    results_storage_class: Optional[DnsSubdomain] = Field(
        default=None, alias="resultsStorageClass", description="its storage class",
        json_schema_extra=unset("the cluster default"))
    timeout_minutes: integer(10, 1440) = Field(
        default=90, alias="timeoutMinutes",
        description="the Job's `activeDeadlineSeconds`; `pulumi up` waits 10 min more")
    resources: BenchmarkResources = Field(
        default_factory=BenchmarkResources,
        description="the Job container's requests and limits: the tokenizer of 36K-token "
                    "prompts and `vllm bench serve` at concurrency 8")
    sweep: Optional[Literal["wide"]] = Field(
        default=None,
        description="`wide`: the receipt's wider sweep (`workload_a.wide_sweep`: concurrency "
                    "32 and 128, 2048-token outputs) instead of `concurrencies`; reported as "
                    "new evidence")

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

    page = "accuracy.md"

    enabled: bool = Field(default=False, description="add the AccuracySmoke component")
    image: DigestImage = Field(
        default=ACCURACY_IMAGE,
        description="an image with lm-eval (requirements-accuracy.txt) and the tasks' datasets "
                    "in its HF cache (the Job runs offline), by digest. The shipped value is an "
                    "all-zero placeholder: renders work, `pulumi up` refuses it")
    tasks: list[str] = Field(default_factory=lambda: ["k3_smoke_gsm8k", "k3_smoke_arc"],
                             min_length=1, max_length=64,
                             description="distinct shipped task names")
    limit: integer(1, 10000) = Field(default=100, description="items per task: the first N")
    max_tokens: integer(16, 32768) = Field(default=1024, alias="maxTokens",
                                           description="the generation cap per item")
    seed: Seed = Field(default=0, description="lm-eval's seed")
    concurrency: integer(1, 256) = Field(default=8, description="requests in flight")
    timeout_minutes: integer(5, 1440) = Field(default=60, alias="timeoutMinutes",
                                              description="the Job's deadline")
    results_size_gi: Gi = Field(default=1, alias="resultsSizeGi",
                                description="the results volume, GiB")
    results_storage_class: Optional[DnsSubdomain] = Field(
        default=None, alias="resultsStorageClass", description="its storage class",
        json_schema_extra=unset("the cluster default"))
    resources: AccuracyResources = Field(
        default_factory=AccuracyResources,
        description="the Job container's requests and limits; lm-eval is only a client")

    @field_validator("tasks")
    @classmethod
    def _shipped(cls, v: list[str]) -> list[str]:
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

    page = "operations.md"

    service_monitor: bool = Field(
        default=False, alias="serviceMonitor",
        description="create the metrics Service + ServiceMonitor (the CRD must exist)")
    prometheus_rule: bool = Field(default=False, alias="prometheusRule",
                                  description="create the PrometheusRule (the CRD must exist)")
    dashboard: bool = Field(default=False, description="create the dashboard ConfigMap")
    p99_margin_pct: Percent = Field(
        default=10.0, alias="p99MarginPct",
        description="the p99 latency alert fires above the receipt's p99 x (1 + margin / 100)")
    labels: Labels = Field(
        default_factory=dict,
        description="extra labels on the ServiceMonitor and PrometheusRule, for the "
                    "Prometheus's selectors (kube-prometheus-stack selects `release: <helm "
                    "release>` by default)")
    scrape_interval: ScrapeInterval = Field(default="30s", alias="scrapeInterval",
                                            description="the ServiceMonitor's scrape interval")
    kv_cache_usage_threshold: number(gt=0, le=1) = Field(
        default=0.9, alias="kvCacheUsageThreshold",
        description="KV-cache usage above which the \"nearly full\" alert fires")
    waiting_requests_threshold: Count = Field(
        default=0, alias="waitingRequestsThreshold",
        description="waiting requests above which a still-growing queue alerts")
    dashboard_namespace: Optional[DnsLabel] = Field(
        default=None, alias="dashboardNamespace",
        description="where the dashboard ConfigMap goes (Grafana's sidecar watches its own "
                    "namespace unless told otherwise)",
        json_schema_extra=unset("the stack's namespace"))
    node_rate_usd_per_hour: Optional[number(0.01, 100_000)] = Field(
        default=None, alias="nodeRateUsdPerHour",
        description="what one serving node costs per hour, USD: adds the dashboard panel "
                    "\"USD per million generated tokens\" (`rate / 3600 * 1e6 / sum by (pod) "
                    "(rate(vllm:generation_tokens_total))`, idle pods show nothing)",
        json_schema_extra=unset("unset: no panel, no invented number"))
    dcgm_exported_labels: bool = Field(
        default=False, alias="dcgmExportedLabels",
        description="`true` when dcgm-exporter series carry the GPU's pod as `exported_pod` / "
                    "`exported_namespace` (scraped without honorLabels)")


class NetworkConfig(_Section):
    """Who may reach the serving port, and where pods may connect (k3:network).

    Ingress to the serving pods is denied except the port from these sources; egress is
    DNS only (plus the Hub for the prefetch Job, and for serving pods in node-local mode,
    whose init container fetches missing files)."""

    page = "operations.md"

    allow_from_namespaces: list[DnsLabel] = Field(
        default_factory=list, alias="allowFromNamespaces",
        description="every pod in these namespaces may call the API (an ingress controller, a "
                    "gateway)")
    allow_from_pod_labels: Labels = Field(
        default_factory=dict, alias="allowFromPodLabels",
        description="pods with all of these labels in the stack's namespace may call the API")
    scraper_namespace: Optional[DnsLabel] = Field(
        default="monitoring", alias="scraperNamespace",
        description="the metrics scraper's namespace; `null` for no scraper access")
    scraper_pod_labels: Labels = Field(
        default_factory=dict, alias="scraperPodLabels",
        description="narrow the scraper to pods with these labels (empty: the whole namespace)")
    dns_namespace: DnsLabel = Field(default="kube-system", alias="dnsNamespace",
                                    description="the cluster DNS's namespace")
    dns_cidrs: list[DnsCidr] = Field(
        default_factory=list, alias="dnsCidrs",
        description="extra DNS addresses (NodeLocal DNSCache: 169.254.20.10/32), port 53 "
                    "only: the one key that may name a link-local address")
    hub_cidrs: list[Cidr] = Field(
        default_factory=lambda: ["0.0.0.0/0", "::/0"], min_length=1, alias="hubCidrs",
        description="where the Hub (or your `HF_ENDPOINT` mirror / proxy) is reachable: its "
                    "CDN has no fixed addresses, so the default is any address on the HTTPS "
                    "port")
    hub_ports: list[Port] = Field(default_factory=lambda: [443], min_length=1, alias="hubPorts",
                                  description="TCP ports for the Hub")
    cluster_cidrs: list[Cidr] = Field(
        default_factory=lambda: ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                 "100.64.0.0/10", "fc00::/7"], alias="clusterCidrs",
        description="addresses inside the cluster and its network (pods, services, nodes, the "
                    "VPC), cut out of every internet egress rule (Hub, engine build). The "
                    "default is every private range; list yours if the cluster uses public "
                    "addresses inside")


# The maintained endpoint picker (llm-d-router, where the Gateway API Inference Extension's
# EPP moved), by digest. The shipped digest is an all-zero placeholder: renders work,
# `pulumi up` refuses it (docs/gateway.md shows how to read the tag's digest).
EPP_IMAGE = "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0@sha256:" + "0" * 64


class GatewayConfig(_Section):
    """The opt-in inference gateway (k3:gateway; k3infra/gateway, docs/gateway.md): an
    InferencePool over the serving pods, its endpoint picker, a Gateway + HTTPRoute on
    the implementation named here, and that implementation's API-key policy."""

    page = "gateway.md"

    enabled: bool = Field(default=False, description="render the gateway")
    class_name: Optional[DnsSubdomain] = Field(
        default=None, alias="className",
        description="the GatewayClass of an installed implementation: Envoy Gateway's "
                    "quickstart `eg`, kgateway `kgateway`, Istio `istio`, GKE `gke-l7-rilb` "
                    "(internal) / `gke-l7-regional-external-managed`",
        json_schema_extra=unset("unset (required when enabled)"))
    implementation: Literal["envoy-gateway", "kgateway", "istio", "gke"] = Field(
        default="envoy-gateway",
        description="which implementation the class belongs to: decides the key policy "
                    "k3infra renders and where its proxy pods run (the NetworkPolicy's peers)")
    port: Port = Field(default=80,
                       description="the Gateway's listener: HTTP on this port, or HTTPS with "
                                   "`tlsSecret`")
    tls_secret: Optional[DnsLabel] = Field(
        default=None, alias="tlsSecret",
        description="a `kubernetes.io/tls` Secret in the stack's namespace: the listener is "
                    "then HTTPS")
    proxy_namespace: Optional[DnsLabel] = Field(
        default=None, alias="proxyNamespace",
        description="where the implementation runs the Gateway's proxy pods",
        json_schema_extra=unset("the implementation's ([gateway](gateway.md))"))
    proxy_pod_labels: Optional[Labels] = Field(
        default=None, alias="proxyPodLabels",
        description="their labels (all must match; at least one)",
        json_schema_extra=unset("the implementation's"))
    proxy_cidrs: list[Cidr] = Field(
        default_factory=list, alias="proxyCidrs",
        description="`gke`: the proxy-only subnet's CIDRs (required there): GKE's proxies are "
                    "not pods")
    epp_image: DigestImage = Field(
        default=EPP_IMAGE, alias="eppImage",
        description="the endpoint picker by digest; the shipped placeholder is refused by "
                    "`pulumi up`")
    api_server_cidrs: list[Cidr] = Field(
        default_factory=list, alias="apiServerCidrs",
        description="the API server's endpoint addresses: the endpoint picker watches the "
                    "InferencePool and the pods, and this is its only egress beside DNS and "
                    "the pods' metrics port; empty is refused by `pulumi up`")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailOpen", alias="failureMode",
        description="when the picker does not answer: `FailOpen` routes to any ready pod of "
                    "the pool (still behind both key checks), `FailClose` answers 5xx")

    @field_validator("proxy_pod_labels")
    @classmethod
    def _proxy_labels(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        if v is not None and not v:
            raise ValueError("must name at least one label (unset: the implementation's default)")
        return v


class RolloutConfig(_Section):
    """How a change that replaces serving pods reaches them (k3:rollout): one canary
    replica first, benchmarked alone against the stack's receipt, the rest only if it
    passes (k3infra/serving/rollout.py, docs/receipts.md)."""

    page = "receipts.md"

    gate: Optional[bool] = Field(
        default=None,
        description="gate every change of the serving pods' template (a new receipt, engine, "
                    "flag, runtime) on a benchmark of one canary replica against the stack's "
                    "receipt: `true` with one replica benchmarks it after the roll (no spare "
                    "replica to hold the old one) and fails loudly; `false` rolls ungated",
        json_schema_extra=unset("on with 2 or more replicas of one node each, off otherwise"))


class AutoscalingConfig(_Section):
    """Scaling the serving StatefulSet on queue depth (k3:autoscaling): a KEDA
    ScaledObject on vllm:num_requests_waiting (k3infra/operations/autoscaling.py). One
    replica is one 8-GPU node: `max` is what you may pay for."""

    page = "gateway.md"

    enabled: bool = Field(default=False, description="render the ScaledObject")
    # At least 2 is checked in parse.py (with the other autoscaling rules).
    min: Replicas = Field(
        default=2,
        description="at least 2: the PodDisruptionBudget lets a drain take one replica, and "
                    "one must keep serving")
    max: Optional[Replicas] = Field(
        default=None,
        description="the most replicas = 8-GPU nodes the autoscaler may run",
        json_schema_extra=unset("unset (required when enabled)"))
    prometheus_url: Optional[HttpUrl] = Field(
        default=None, alias="prometheusUrl",
        description="the Prometheus that scrapes the serving pods (KEDA's prometheus trigger "
                    "queries it)",
        json_schema_extra=unset("unset (required when enabled)"))
    waiting_per_replica: integer(1, 100_000) = Field(
        default=4, alias="waitingPerReplica",
        description="target waiting requests per replica: desired = ceil(sum(waiting) / this)")
    polling_interval_seconds: integer(5, 600) = Field(default=30, alias="pollingIntervalSeconds",
                                                      description="KEDA's polling interval")
    scale_down_stabilization_seconds: Optional[integer(0, 3600)] = Field(
        default=None, alias="scaleDownStabilizationSeconds",
        description="how long a lower queue must hold before a replica goes",
        json_schema_extra=unset("derived: min(startup budget, the HPA's 3600 s maximum)"))


class HostConfig(_Section):
    """One Docker host instead of a cluster (k3:host; k3infra/host). The Docker daemon is
    Pulumi's own `docker:host` setting (ssh://user@host or the local socket)."""

    page = "host.md"

    weights_root: AbsPath = Field(
        default="/mnt/k3-weights", alias="weightsRoot",
        description="the weights tree and lock on the host's local NVMe: a directory owned by "
                    "uid 1000, bind-mounted at `/weights`")
    free_gb: Optional[GB] = Field(
        default=None, alias="freeGB",
        description="free space on weightsRoot's filesystem in decimal GB (`df -B1000000000`); "
                    "checked against the lock total (or the receipt's size) before anything is "
                    "created, with both figures in the error",
        json_schema_extra=unset("unset: checked only by the prefetch"))
    publish_address: IpAddress = Field(
        default="127.0.0.1", alias="publishAddress",
        description="the host address the API port is published on; 0.0.0.0 / :: only with "
                    "`publishAllInterfaces`")
    publish_all_interfaces: bool = Field(
        default=False, alias="publishAllInterfaces",
        description="the explicit choice to publish on every interface")
    network_mode: Literal["bridge", "host"] = Field(
        default="bridge", alias="networkMode",
        description="`bridge`: ports published as above; `host` (no NAT): the proxy listens on "
                    "every interface, which needs `publishAllInterfaces` too")
    restart: Literal["unless-stopped", "always", "on-failure"] = Field(
        default="unless-stopped", description="the containers' Docker restart policy")

    @field_validator("weights_root")
    @classmethod
    def _abs_root(cls, v: str) -> str:
        if not v.startswith("/") or ".." in v.split("/") or v.rstrip("/") == "":
            raise ValueError("must be an absolute path below / without '..'")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _all_interfaces_chosen(self) -> "HostConfig":
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

    page = "multinode.md"

    nodes_per_replica: integer(1, 64) = Field(
        default=2, alias="nodesPerReplica",
        description="`2` only: the receipt's flags fix one TP8+EP world of 8 GPUs and a "
                    "multi-node replica keeps them; 3 trays (12 GPUs) or 4 (16 x B200) would "
                    "need TP16 or pipeline parallelism, an engine-path change nothing here "
                    "renders or has measured")
    gpus_per_node: integer(1, 64) = Field(
        default=4, alias="gpusPerNode",
        description="`4` only (NVL72 trays); 8-GPU nodes hold a replica: `single-node`")
    domain_label: DomainLabel = Field(
        default="nvidia.com/gpu.clique", alias="domainLabel",
        description="the node label that names a node's NVLink domain (its values: "
                    "`<cluster UUID>.<clique id>`)")


class StackConfig(_Section):
    """All `k3:*` keys. Field aliases are the config key names."""

    # A plain value: it decides every pin the stack runs and is judged against (resolved
    # before the rest is parsed, k3infra.config.parse.chosen_receipt).
    receipt: Optional[ReceiptName] = Field(
        default=None,
        description="the receipt the stack runs and is judged against: a shipped receipt's id "
                    "(`k3infra receipt list`) or a `.yaml` file inside the Pulumi project "
                    "(`receipts/mine.yaml`); its sha256 is recorded on the workloads and in "
                    "the `receiptSha256` stack output. A change replaces the serving pods where the "
                    "engine, its flags or env change ([receipts](receipts.md))",
        json_schema_extra=unset("`kimi-k3-8xb300-2026-07-29`, the measured receipt"))

    weights_revision: HubCommit = Field(
        alias="weightsRevision",
        description="the commit of `moonshotai/Kimi-K3` on the Hub that every copy of the "
                    "weights is pinned to")
    # parse_stack_config fills the receipt's GPU in, from the receipt given.
    gpu_product: Optional[LabelValue] = Field(
        default=None, alias="gpuProduct",
        description="the serving nodes' GPU feature discovery product label "
                    "(`nvidia.com/gpu.product`); it must fit the model (HBM check): "
                    "`NVIDIA-B200` is refused, and 4-GPU `NVIDIA-GB300` nodes are refused unless "
                    "`k3:topology` is `multi-node`",
        json_schema_extra=unset("the receipt's GPU product"))
    gpu_memory_gib: Optional[number(gt=0, le=16384)] = Field(
        default=None, alias="gpuMemoryGib",
        description="per-GPU memory as CUDA reports it, GiB, only for products the receipt "
                    "does not list")
    engine_image: Optional[DigestImage] = Field(
        default=None, alias="engineImage",
        description="the engine image by digest; given, `k3:engine.build` defaults to "
                    "`prebuilt`; unset, to `in-cluster` (which needs `k3:engine.registry`); "
                    "required with `prebuilt`, the `upstream` profile and a Docker host; "
                    "refused together with an explicit build mode")
    replicas: Replicas = Field(
        default=1,
        description="serving replicas; one replica is one 8-GPU node (two 4-GPU trays with "
                    "`multi-node`)")
    topology: Literal["single-node", "multi-node"] = Field(
        default="single-node",
        description="`single-node`: one replica = one 8-GPU node (the receipt); `multi-node`: "
                    "one replica across `k3:multiNode`'s nodes of one NVLink domain, NOT the "
                    "measured configuration")
    multi_node: MultiNodeConfig = Field(
        default_factory=MultiNodeConfig, alias="multiNode",
        description="`multi-node` only: the nodes of one replica and the NVLink domain label")
    profile: Literal["measured", "upstream", "custom"] = Field(
        default="measured",
        description="`measured` (the receipt), `upstream` (released vLLM, not measured), "
                    "`custom` (engine-path changes, not measured)")
    api_key: Annotated[Secret, Accepted(API_KEY.accepted)] = Field(
        alias="apiKey",
        description="the vLLM API key; reaches pods only through the Secret "
                    "`<instance>-api-key` (`kimi-k3-api-key`)")
    hf_token: Optional[Secret] = Field(
        default=None, alias="hfToken",
        description="a Hub token whose account accepted the licence, when the repo is gated")
    accept_model_license: bool = Field(
        default=False, alias="acceptModelLicense",
        description="`true` once you read the Kimi K3 License (Sections 2-4); `pulumi up` "
                    "refuses until then")
    namespace: Optional[DnsLabel] = Field(
        default=None,
        description="the Kubernetes namespace; instances may share one that exists "
                    "([component](component.md#the-namespace-who-owns-it))",
        json_schema_extra=unset("the instance name (`kimi-k3` in the stack program), so two "
                                "instances never share a namespace by default"))
    create_namespace: Optional[bool] = Field(
        default=None, alias="createNamespace",
        description="`true`: the instance creates the namespace with Pod Security `restricted` "
                    "labels and deletes it on destroy; `false`: it deploys into a namespace "
                    "that exists and never touches it (a plain value: it decides which "
                    "resources exist)",
        json_schema_extra=unset("`true` when `k3:namespace` is the instance name; otherwise "
                                "none (required)"))
    served_model_name: ServedModelName = Field(
        default="kimi-k3", alias="servedModelName",
        description="the model name clients send (`--served-model-name`)")
    surface: SurfaceConfig = Field(default_factory=SurfaceConfig,
                                   description="allow-listed serving-surface settings")
    custom: CustomConfig = Field(default_factory=CustomConfig,
                                 description="engine-path changes, `profile: custom` only")
    serving: ServingConfig = Field(
        default_factory=ServingConfig,
        description="pod sizing, storage read rate, shutdown, updates, the proxy")
    cold_start: ColdStartConfig = Field(
        default_factory=ColdStartConfig, alias="coldStart",
        description="each start phase's rate or allowance, the tail factor, compile cache, "
                    "image pre-pull, download stall watchdog")
    weights: WeightsConfig = Field(default_factory=WeightsConfig,
                                   description="weights storage and prefetch")
    engine: EngineConfig = Field(default_factory=EngineConfig,
                                 description="how the engine image is obtained")
    node_pool: NodePoolConfig = Field(
        default_factory=NodePoolConfig, alias="nodePool",
        description="the B300 node pool: a provider and its section (aws, oci, nebius, "
                    "coreweave, existing)")
    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig,
                                       description="the in-cluster benchmark Job")
    accuracy: AccuracyConfig = Field(default_factory=AccuracyConfig,
                                     description="the lm-eval smoke test Job")
    monitoring: MonitoringConfig = Field(
        default_factory=MonitoringConfig,
        description="ServiceMonitor, PrometheusRule, dashboard (all off)")
    network: NetworkConfig = Field(default_factory=NetworkConfig,
                                   description="who may reach the API, egress")
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig,
        description="the inference gateway (InferencePool, endpoint picker, Gateway, "
                    "HTTPRoute, key policy)")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="the benchmark gate a change of the serving pods passes before it reaches "
                    "every replica")
    autoscaling: AutoscalingConfig = Field(
        default_factory=AutoscalingConfig,
        description="KEDA on `vllm:num_requests_waiting`, `min`..`max` 8-GPU nodes")
    host: Optional[HostConfig] = Field(
        default=None,
        description="one Docker host instead of a cluster (weights root, free space, "
                    "published address)")

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


# The secret keys: those of type Secret (wrapped before validation, so no message prints
# them; Pulumi secrets in the plugin schema).
SECRET_KEYS = tuple(f.alias or n for n, f in StackConfig.model_fields.items()
                    if Secret in (f.annotation, *getattr(f.annotation, "__args__", ())))
