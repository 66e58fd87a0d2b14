"""The stack configuration: every `k3:*` key as a pydantic model.

Loaded from Pulumi config by the stack program, and from `stacks/Pulumi.<stack>.yaml`
plus `--config KEY=VALUE` overrides by `k3infra render`. Invalid input raises
`ConfigError` naming the key, the value and what is accepted, before any resource is
registered. No Pulumi import here: the same parser serves both paths.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from k3infra.receipt import load_receipt

NAMESPACE = "k3"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
DIGEST_IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SECRET_PLACEHOLDER = "[secret]"
# RFC 6750 bearer token (b64token): what the serving proxy compares byte for byte.
API_KEY_RE = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")
# The serving proxy (k3infra/serving/proxy.py): nginx, non-root, by digest. The shipped
# digest is an all-zero placeholder: renders work, `pulumi up` refuses it
# (docs/security.md shows how to read the real digest of the tag).
PROXY_IMAGE = "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:" + "0" * 64
SECRET_KEYS = ("apiKey", "hfToken")


class ConfigError(ValueError):
    """A `k3:*` key holds a value that is not accepted. The message names all three."""

    def __init__(self, key: str, value: Any, accepted: str):
        self.key, self.value, self.accepted = key, value, accepted
        shown = SECRET_PLACEHOLDER if isinstance(value, Secret) else repr(value)
        super().__init__(f"{key} = {shown}: {accepted}")


class Secret:
    """A config secret. Never prints its value; the component wraps it in a Pulumi
    secret Output. Offline renders hold the placeholder, never the plaintext."""

    __slots__ = ("_value",)

    def __init__(self, value: Any):
        self._value = value

    def reveal(self) -> Any:
        return self._value

    def __repr__(self) -> str:
        return SECRET_PLACEHOLDER

    __str__ = __repr__


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True,
                              arbitrary_types_allowed=True)


class SurfaceConfig(_Section):
    """Serving-surface settings from the receipt's allow-list (k3:surface)."""

    args: dict[str, Union[str, bool]] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)


class CustomConfig(_Section):
    """Engine-path changes; only accepted with `k3:profile: custom` (k3:custom)."""

    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class ServingConfig(_Section):
    """Pod sizing and the startup budget's inputs (k3:serving)."""

    # Storage read throughput the weights load sees, GB/s. 2 GB/s is a conservative
    # figure for a parallel file system or one local NVMe; a slow guess only makes the
    # startup budget more generous, a fast one kills pods still loading.
    storage_read_gbps: float = Field(default=2.0, gt=0, alias="storageReadGBps")
    # torch.compile + CUDA graph capture at TP8 after the load, seconds.
    compile_allowance_seconds: int = Field(default=1800, ge=0, alias="compileAllowanceSeconds")
    # Multiplier on the load estimate: err on the generous side.
    startup_safety_factor: float = Field(default=1.5, ge=1.0, alias="startupSafetyFactor")
    shm_size_gi: int = Field(default=64, ge=1, alias="shmSizeGi")
    cpu: int = Field(default=96, ge=8)
    memory_gi: int = Field(default=1536, ge=64, alias="memoryGi")
    cache_size_gi: int = Field(default=100, ge=1, alias="cacheSizeGi")
    cache_storage_class: Optional[str] = Field(default=None, alias="cacheStorageClass")
    termination_grace_seconds: int = Field(default=180, ge=30, alias="terminationGraceSeconds")
    # preStop drain before vLLM gets SIGTERM (which aborts requests still running):
    # unset = endpoint propagation + the receipt's slowest measured request (serving/drain).
    drain_seconds: Optional[int] = Field(default=None, ge=0, alias="drainSeconds")
    # RollingUpdate replaces pods one node at a time from the highest ordinal down;
    # pods with an ordinal below updatePartition keep the old template (a canary: set
    # it to replicas - 1, check the new pod, then lower it). OnDelete replaces a pod only
    # when you delete it.
    update_strategy: Literal["RollingUpdate", "OnDelete"] = Field(default="RollingUpdate",
                                                                  alias="updateStrategy")
    update_partition: int = Field(default=0, ge=0, alias="updatePartition")
    # The proxy's ports (the only ones on the pod's address): the API (clients), the
    # metrics (the scraper) and the health port (kubelet probes). vLLM itself listens
    # on 127.0.0.1:enginePort, unreachable from outside the pod.
    port: int = Field(default=8000, ge=1024, le=65535)
    metrics_port: int = Field(default=9090, ge=1024, le=65535, alias="metricsPort")
    health_port: int = Field(default=8081, ge=1024, le=65535, alias="healthPort")
    engine_port: int = Field(default=8001, ge=1024, le=65535, alias="enginePort")
    proxy_image: str = Field(default=PROXY_IMAGE, alias="proxyImage")

    @field_validator("proxy_image")
    @classmethod
    def _proxy_pinned(cls, v: str) -> str:
        if not DIGEST_IMAGE_RE.match(v):
            raise ValueError("must be pinned by digest: <repository>[:<tag>]@sha256:<64 hex>")
        return v

    @model_validator(mode="after")
    def _distinct_ports(self) -> "ServingConfig":
        ports = {"port": self.port, "metricsPort": self.metrics_port,
                 "healthPort": self.health_port, "enginePort": self.engine_port}
        if len(set(ports.values())) != len(ports):
            raise ValueError(f"port, metricsPort, healthPort and enginePort must differ: {ports}")
        return self


class WeightsConfig(_Section):
    """Where the weights live and how they get there (k3:weights)."""

    mode: Literal["shared", "node-local"] = "shared"
    lock_file: Optional[str] = Field(default=None, alias="lockFile")
    storage_class: Optional[str] = Field(default=None, alias="storageClass")
    size_gi: int = Field(default=1700, ge=1, alias="sizeGi")
    node_local_root: str = Field(default="/mnt/k3-weights", alias="nodeLocalRoot")
    # Expected Hub download bandwidth in GB/s: sizes the prefetch Job's timeout.
    download_gbps: float = Field(default=0.5, gt=0, alias="downloadGBps")

    @field_validator("node_local_root")
    @classmethod
    def _abs_root(cls, v: str) -> str:
        if not v.startswith("/") or ".." in v.split("/"):
            raise ValueError("must be an absolute path without '..'")
        return v


_PLACEHOLDER_DIGEST = "@sha256:" + "0" * 64


class BaseImages(_Section):
    """The engine recipe's base images (k3:engine.baseImages), each pinned by digest and
    passed to images/Dockerfile as build args. The shipped digests are all-zero
    placeholders of the Dockerfile's exact tags: `pulumi up` refuses to build with them
    (docs/engine.md shows how to read each tag's digest)."""

    cuda_devel: str = Field(default="nvidia/cuda:13.0.2-devel-ubuntu22.04" + _PLACEHOLDER_DIGEST,
                            alias="cudaDevel")
    uv: str = "ghcr.io/astral-sh/uv:0.8.22" + _PLACEHOLDER_DIGEST
    rust: str = "rust:1.90.0-slim-bookworm" + _PLACEHOLDER_DIGEST

    @field_validator("cuda_devel", "uv", "rust")
    @classmethod
    def _pinned(cls, v: str) -> str:
        if not DIGEST_IMAGE_RE.match(v):
            raise ValueError("must be pinned by digest: <repository>:<tag>@sha256:<64 hex>")
        return v


class EngineConfig(_Section):
    """How the engine image is obtained (k3:engine). docs/engine.md explains each key."""

    build: Literal["prebuilt", "in-cluster", "local"] = "prebuilt"
    # The receipt's short engine commit resolved once to its full 40-hex SHA (docs/engine.md,
    # "Pinning the engine commit"); it must start with the receipt's short SHA. Builds
    # take only this: `pulumi up` refuses to build without it.
    commit: Optional[str] = None
    base_images: BaseImages = Field(default_factory=BaseImages, alias="baseImages")
    # Repository the build pushes to, without tag or digest: registry.example.com/k3/vllm.
    registry: Optional[str] = None
    # Tag pushed next to the digest; default: derived from the receipt's engine commit.
    tag: Optional[str] = None
    # in-cluster: an existing kubernetes.io/dockerconfigjson Secret with push rights, in
    # the build namespace.
    registry_secret: Optional[str] = Field(default=None, alias="registrySecret")
    # in-cluster: the build's own namespace (default <k3:namespace>-build). Rootless
    # BuildKit needs Pod Security `privileged`; the serving namespace stays `restricted`.
    build_namespace: Optional[str] = Field(default=None, alias="buildNamespace")
    # in-cluster: where BuildKit reads images/ from. `configmap` uploads this checkout's
    # images/ (a few small files); `git` builds gitUrl at a pinned 40-hex gitRevision.
    context: Literal["configmap", "git"] = "configmap"
    git_url: Optional[str] = Field(default=None, alias="gitUrl")
    git_revision: Optional[str] = Field(default=None, alias="gitRevision")
    # The CPU build node. nvcc jobs need several GiB each: MAX_JOBS/NVCC_THREADS are
    # derived from these two unless set (k3infra.engine.plan.build_parallelism).
    build_cpu: int = Field(default=32, ge=4, alias="buildCpu")
    build_memory_gi: int = Field(default=128, ge=16, alias="buildMemoryGi")
    build_disk_gi: int = Field(default=200, ge=50, alias="buildDiskGi")
    max_jobs: Optional[int] = Field(default=None, ge=1, alias="maxJobs")
    nvcc_threads: Optional[int] = Field(default=None, ge=1, le=8, alias="nvccThreads")
    build_node_selector: dict[str, str] = Field(default_factory=dict, alias="buildNodeSelector")
    # in-cluster: what keeps the build (untrusted setup code, unconfined seccomp) away
    # from other workloads. `node-pool`: only nodes labelled and tainted
    # k3infra.dev/engine-build=true (a pool for builds alone); `runtime-class`: a
    # sandboxed RuntimeClass (gVisor, Kata) named by buildRuntimeClass.
    build_isolation: Literal["node-pool", "runtime-class"] = Field(default="node-pool",
                                                                   alias="buildIsolation")
    build_runtime_class: Optional[str] = Field(default=None, alias="buildRuntimeClass")
    # in-cluster: the API server's endpoint addresses (the report container writes the
    # result there); every other cluster address is cut out of the build's egress.
    api_server_cidrs: list[str] = Field(default_factory=list, alias="apiServerCidrs")
    # in-cluster: a registry or mirror inside your network (cluster CIDRs are otherwise
    # unreachable from the build).
    registry_cidrs: list[str] = Field(default_factory=list, alias="registryCidrs")
    # Registry build cache: its own repository and push Secret (never the serving
    # image's); unset, builds use no registry cache at all.
    cache_registry: Optional[str] = Field(default=None, alias="cacheRegistry")
    cache_registry_secret: Optional[str] = Field(default=None, alias="cacheRegistrySecret")
    build_timeout_minutes: int = Field(default=600, ge=30, alias="buildTimeoutMinutes")
    # Optional sccache: a Secret whose `env` key holds SCCACHE_* settings (bucket, keys).
    sccache_secret: Optional[str] = Field(default=None, alias="sccacheSecret")
    # in-cluster images: exact tag + digest. The shipped digests are all-zero
    # placeholders (renders work, `pulumi up` refuses them): docs/engine.md shows how to
    # read the real digest of each tag.
    buildkit_image: str = Field(default="moby/buildkit:v0.23.2-rootless@sha256:" + "0" * 64,
                                alias="buildkitImage")
    reporter_image: str = Field(default="python:3.12.11-slim-bookworm@sha256:" + "0" * 64,
                                alias="reporterImage")
    # profile upstream: the released vLLM version of k3:engineImage (>= 0.33.0).
    upstream_version: Optional[str] = Field(default=None, alias="upstreamVersion")
    # prebuilt: the image's dev.k3infra.engine.wheel-sha256 label, carried to the outputs.
    wheel_sha256: Optional[str] = Field(default=None, alias="wheelSha256")
    # Existing kubernetes.io/dockerconfigjson Secrets in the stack's namespace that pull
    # the engine image from a private registry (every pod that runs it: serving,
    # weights prefetch, benchmark).
    pull_secrets: list[str] = Field(default_factory=list, alias="pullSecrets")

    @field_validator("pull_secrets")
    @classmethod
    def _pull_secret_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not DNS_LABEL_RE.match(name) or len(name) > 63:
                raise ValueError(f"{name!r} is not a Secret name (DNS label)")
        return v

    def pull_secret_refs(self) -> dict:
        """`imagePullSecrets` for a pod spec that runs the engine image ({} when none)."""
        return {"imagePullSecrets": [{"name": n} for n in self.pull_secrets]} if self.pull_secrets else {}

    @field_validator("api_server_cidrs", "registry_cidrs")
    @classmethod
    def _engine_cidrs(cls, v: list[str]) -> list[str]:
        import ipaddress

        for cidr in v:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError:
                raise ValueError(f"{cidr!r} is not a CIDR (address/prefix with no host bits)")
        return v

    @field_validator("registry", "cache_registry")
    @classmethod
    def _repository(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"^[a-z0-9][a-z0-9._-]*(:[0-9]+)?(/[a-z0-9._-]+)+$", v):
            raise ValueError("must be a repository without tag or digest, such as "
                             "registry.example.com/k3/vllm")
        return v

    @field_validator("tag")
    @classmethod
    def _tag(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", v):
            raise ValueError("must be a Docker tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
        return v

    @field_validator("build_namespace")
    @classmethod
    def _namespace(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and (not DNS_LABEL_RE.match(v) or len(v) > 63):
            raise ValueError("must be a DNS label (lowercase letters, digits, '-')")
        return v

    @field_validator("registry_secret", "sccache_secret", "cache_registry_secret",
                     "build_runtime_class")
    @classmethod
    def _secret_name(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and (not DNS_LABEL_RE.match(v) or len(v) > 63):
            raise ValueError("must be the name of a Secret in the stack's namespace")
        return v

    @field_validator("commit")
    @classmethod
    def _full_commit(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not COMMIT_RE.match(v):
            raise ValueError("must be the full 40-hex engine commit (lowercase), resolved once "
                             "from the receipt's short SHA")
        return v

    @field_validator("git_revision")
    @classmethod
    def _git_revision(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not COMMIT_RE.match(v):
            raise ValueError("must be a 40-hex commit (lowercase): a build context is pinned")
        return v

    @field_validator("git_url")
    @classmethod
    def _git_url(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"^(https://|ssh://|git@)\S+$", v):
            raise ValueError("must be an https://, ssh:// or git@ Git URL")
        return v

    @field_validator("wheel_sha256")
    @classmethod
    def _sha256(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"^[0-9a-f]{64}$", v):
            raise ValueError("must be 64 lowercase hex characters (the wheel's SHA-256)")
        return v

    @field_validator("buildkit_image", "reporter_image")
    @classmethod
    def _pinned_image(cls, v: str) -> str:
        if not DIGEST_IMAGE_RE.match(v):
            raise ValueError("must be pinned by digest: <repository>[:<tag>]@sha256:<64 hex>")
        return v


# --- k3:nodePool: one section per provider ---------------------------------------------
# The pool's SKU (instance type / shape / platform) is fixed by each adapter in
# k3infra/nodepool/: a "B300 node pool" cannot be pointed at other hardware by config.

_AWS_AZ = r"^[a-z]{2}(-[a-z0-9]+)+-\d+[a-z]$"


class AwsSubnet(_Section):
    """One subnet of the node group, with its AZ so preflight can check capacity blocks."""

    id: str = Field(pattern=r"^subnet-[0-9a-f]{8,17}$")
    availability_zone: str = Field(pattern=_AWS_AZ, alias="availabilityZone")


class AwsCapacityBlock(_Section):
    """An EC2 Capacity Block for ML: the nodes launch into this reservation only."""

    reservation_id: str = Field(pattern=r"^cr-[0-9a-f]{8,17}$", alias="reservationId")
    availability_zone: str = Field(pattern=_AWS_AZ, alias="availabilityZone")


class AwsPoolConfig(_Section):
    """k3:nodePool.aws: a pool on an existing EKS cluster."""

    cluster_name: str = Field(min_length=1, max_length=100, alias="clusterName")
    # "managed-node-group": aws.eks.NodeGroup + launch template. "karpenter": a Karpenter
    # NodePool + EC2NodeClass (Karpenter must already run in the cluster).
    mode: Literal["managed-node-group", "karpenter"] = "managed-node-group"
    node_role_arn: Optional[str] = Field(default=None, alias="nodeRoleArn",
                                         pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
    # Karpenter's EC2NodeClass takes the node role by name.
    node_role_name: Optional[str] = Field(default=None, alias="nodeRoleName", min_length=1)
    subnets: list[AwsSubnet] = Field(min_length=1)
    # Put on every network interface of the launch template (EFA needs a group that
    # allows all traffic to and from itself); usually the cluster security group.
    security_group_ids: list[str] = Field(min_length=1, alias="securityGroupIds")
    capacity_block: Optional[AwsCapacityBlock] = Field(default=None, alias="capacityBlock")
    # EFA-only interfaces on network cards 1..N (card 0 keeps the ENA primary interface).
    # One K3 replica is one node, so serving does not need EFA; 0 leaves it out.
    efa_interfaces: int = Field(default=16, ge=0, le=31, alias="efaInterfaces")
    root_volume_gib: int = Field(default=200, ge=50, le=16384, alias="rootVolumeGiB")

    @field_validator("security_group_ids")
    @classmethod
    def _sg_ids(cls, v: list[str]) -> list[str]:
        for sg in v:
            if not re.match(r"^sg-[0-9a-f]{8,17}$", sg):
                raise ValueError(f"{sg!r} is not a security group id (sg-<hex>)")
        return v

    @model_validator(mode="after")
    def _role_for_mode(self) -> "AwsPoolConfig":
        if self.mode == "managed-node-group" and self.node_role_arn is None:
            raise ValueError("nodeRoleArn is required with mode managed-node-group")
        if self.mode == "karpenter" and self.node_role_name is None:
            raise ValueError("nodeRoleName is required with mode karpenter")
        return self


class OciPlacement(_Section):
    availability_domain: str = Field(min_length=1, alias="availabilityDomain")
    subnet_id: str = Field(pattern=r"^ocid1\.subnet\.", alias="subnetId")
    capacity_reservation_id: Optional[str] = Field(
        default=None, pattern=r"^ocid1\.capacityreservation\.", alias="capacityReservationId")


class OciPoolConfig(_Section):
    """k3:nodePool.oci: an OKE node pool on an existing cluster."""

    cluster_id: str = Field(pattern=r"^ocid1\.cluster\.", alias="clusterId")
    compartment_id: str = Field(pattern=r"^ocid1\.(compartment|tenancy)\.", alias="compartmentId")
    kubernetes_version: str = Field(pattern=r"^v\d+\.\d+\.\d+$", alias="kubernetesVersion")
    # An OKE GPU worker image for the region (ships the NVIDIA driver and container toolkit).
    image_id: str = Field(pattern=r"^ocid1\.image\.", alias="imageId")
    placements: list[OciPlacement] = Field(min_length=1)
    # RDMA between nodes needs the nodes inside one compute cluster (not needed by a
    # single-node replica; recommended for more than one node).
    compute_cluster_id: Optional[str] = Field(default=None, pattern=r"^ocid1\.computecluster\.",
                                              alias="computeClusterId")
    nsg_ids: list[str] = Field(default_factory=list, alias="nsgIds")
    boot_volume_gb: int = Field(default=200, ge=50, le=32768, alias="bootVolumeGB")
    ssh_public_key: Optional[str] = Field(default=None, alias="sshPublicKey")


class NebiusPoolConfig(_Section):
    """k3:nodePool.nebius: an MK8s node group on an existing cluster."""

    cluster_id: str = Field(pattern=r"^mk8scluster-[a-z0-9]+$", alias="clusterId")
    subnet_id: Optional[str] = Field(default=None, pattern=r"^vpcsubnet-[a-z0-9]+$",
                                     alias="subnetId")
    # Image with the NVIDIA driver preinstalled (`nebius mk8s node-group
    # get-compatibility-matrix` lists them); unset, the GPU Operator installs the driver.
    drivers_preset: Optional[str] = Field(default=None, min_length=1, alias="driversPreset")
    # Compute GPU cluster (InfiniBand fabric) the nodes join; optional for one node.
    gpu_cluster_id: Optional[str] = Field(default=None, min_length=1, alias="gpuClusterId")
    # Capacity block groups, in order of preference; empty means on-demand.
    reservation_ids: list[str] = Field(default_factory=list, alias="reservationIds")
    boot_disk_gib: int = Field(default=200, ge=64, le=16384, alias="bootDiskGiB")
    service_account_id: Optional[str] = Field(default=None, alias="serviceAccountId")


class CoreWeavePoolConfig(_Section):
    """k3:nodePool.coreweave: a CKS NodePool custom resource in the cluster."""

    # CoreWeave instance id of the 8x B300 node; check it against the CoreWeave
    # instance list for your zone before the first run.
    instance_type: str = Field(default="b300-8x", pattern=r"^[a-z0-9][a-z0-9-]*$",
                               alias="instanceType")


class ExistingPoolConfig(_Section):
    """k3:nodePool.existing: bring-your-own nodes; nothing is created."""


class NodePoolConfig(_Section):
    """The B300 node pool (k3:nodePool); `existing` creates nothing.

    `provider` picks the adapter; the section of the same name (`aws`, `oci`, `nebius`,
    `coreweave`) holds that cloud's settings and is the only one accepted."""

    provider: Literal["existing", "aws", "oci", "nebius", "coreweave"] = "existing"
    # Nodes in the pool; unset means one per serving replica (a replica is a whole node).
    node_count: Optional[int] = Field(default=None, ge=1, le=64, alias="nodeCount")
    # Local NVMe per node in decimal GB, for the node-local weights check. Known for
    # the AWS SKU; other clouds must state it to use k3:weights.mode = node-local.
    local_nvme_gb: Optional[float] = Field(default=None, gt=0, alias="localNvmeGB")
    # Head-room on top of the weights in node-local mode (engine image, compile cache).
    local_nvme_margin_pct: float = Field(default=10.0, ge=0, le=400, alias="localNvmeMarginPct")
    # auto: install the NVIDIA GPU Operator on aws/oci/nebius, never on coreweave (CKS
    # manages the GPU stack), not on existing clusters (they usually run their own).
    gpu_operator: Literal["auto", "install", "skip"] = Field(default="auto", alias="gpuOperator")
    aws: Optional[AwsPoolConfig] = None
    oci: Optional[OciPoolConfig] = None
    nebius: Optional[NebiusPoolConfig] = None
    coreweave: Optional[CoreWeavePoolConfig] = None
    existing: Optional[ExistingPoolConfig] = None

    @model_validator(mode="before")
    @classmethod
    def _coreweave_defaults(cls, data: Any) -> Any:
        # Every CoreWeave setting has a default: an empty section is implied.
        if isinstance(data, dict) and data.get("provider") == "coreweave":
            data = {"coreweave": {}, **data}
        return data

    @model_validator(mode="after")
    def _one_provider_section(self) -> "NodePoolConfig":
        sections = ("aws", "oci", "nebius", "coreweave", "existing")
        others = [s for s in sections if s != self.provider and getattr(self, s) is not None]
        if others:
            raise ValueError(f"section {others[0]!r} does not belong to provider "
                             f"{self.provider!r}; only k3:nodePool.{self.provider} is accepted")
        if self.provider in ("aws", "oci", "nebius") and getattr(self, self.provider) is None:
            raise ValueError(f"provider {self.provider!r} needs the k3:nodePool.{self.provider} "
                             "section (cluster, network and capacity settings)")
        if self.provider == "coreweave" and self.gpu_operator == "install":
            raise ValueError("gpuOperator = 'install' is refused on coreweave: CKS manages the "
                             "NVIDIA driver and device plugin; accepted: auto or skip")
        return self

    @property
    def settings(self) -> Optional[_Section]:
        """The provider's own section (None for `existing` without one)."""
        return getattr(self, self.provider)


class BenchmarkConfig(_Section):
    """The optional in-cluster benchmark Job (k3:benchmark)."""

    enabled: bool = False
    concurrencies: list[int] = Field(default_factory=lambda: list(load_receipt().workload_a.concurrencies))
    # The receipt's grid is repeated this many times (its two runs agreed within 0.4 %);
    # every run and every request gets its own prompt.
    runs: int = Field(default=2, ge=1, le=10)
    # Seeds Workload A's prompts: same seed + run id + tokenizer -> identical prompts.
    seed: int = Field(default=0, ge=0)
    # Measured requests per concurrency; None = the receipt's count (a different count
    # is no longer the receipt's workload and `bench compare` says so).
    measured_requests: Optional[int] = Field(default=None, ge=1, le=10000, alias="measuredRequests")
    # Every request generates exactly the receipt's output cap (comparable e2e latency).
    ignore_eos: bool = Field(default=True, alias="ignoreEos")
    # `bench compare` / `verify`: allowed |measured - receipt| / receipt, both directions.
    tolerance_pct: float = Field(default=10.0, ge=0, le=100, alias="tolerancePct")
    results_size_gi: int = Field(default=1, ge=1, alias="resultsSizeGi")
    results_storage_class: Optional[str] = Field(default=None, alias="resultsStorageClass")
    # The Job's deadline and how long `pulumi up` waits for it.
    timeout_minutes: int = Field(default=90, ge=10, le=1440, alias="timeoutMinutes")

    @field_validator("concurrencies")
    @classmethod
    def _positive_unique(cls, v: list[int]) -> list[int]:
        if not v or any(c < 1 for c in v) or len(set(v)) != len(v):
            raise ValueError("must be a non-empty list of distinct integers >= 1")
        return v


_LABEL_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def _check_labels(v: dict[str, str]) -> dict[str, str]:
    for key, value in v.items():
        if not _LABEL_KEY_RE.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
            raise ValueError(f"{key!r} is not a Kubernetes label key")
        if not isinstance(value, str) or not _LABEL_VALUE_RE.match(value) or len(value) > 63:
            raise ValueError(f"{key}={value!r}: not a Kubernetes label value "
                             "(a string of at most 63 letters, digits, '-', '_', '.')")
    return v


def _check_dns_labels(v: list[str]) -> list[str]:
    for name in v:
        if not DNS_LABEL_RE.match(name) or len(name) > 63:
            raise ValueError(f"{name!r} is not a namespace name (DNS label)")
    return v


class MonitoringConfig(_Section):
    """Prometheus Operator objects and the Grafana dashboard (k3:monitoring).

    The CRDs are not probed (there is no cluster at render time): set serviceMonitor /
    prometheusRule only where the Prometheus Operator's CRDs are installed."""

    service_monitor: bool = Field(default=False, alias="serviceMonitor")
    prometheus_rule: bool = Field(default=False, alias="prometheusRule")
    dashboard: bool = False
    # The p99 latency alert fires above the receipt's p99 x (1 + margin / 100).
    p99_margin_pct: float = Field(default=10.0, ge=0, alias="p99MarginPct")
    # Extra labels on the ServiceMonitor and PrometheusRule, for the Prometheus's
    # selectors (kube-prometheus-stack selects `release: <helm release>` by default).
    labels: dict[str, str] = Field(default_factory=dict)
    scrape_interval: str = Field(default="30s", pattern=r"^[1-9][0-9]*(s|m)$",
                                 alias="scrapeInterval")
    # KV-cache usage (0..1] above which the "nearly full" alert fires.
    kv_cache_usage_threshold: float = Field(default=0.9, gt=0, le=1,
                                            alias="kvCacheUsageThreshold")
    # Waiting requests above which a still-growing queue alerts.
    waiting_requests_threshold: int = Field(default=0, ge=0, alias="waitingRequestsThreshold")
    # Where the dashboard ConfigMap goes (Grafana's sidecar watches its own namespace
    # unless told otherwise); unset: the stack's namespace.
    dashboard_namespace: Optional[str] = Field(default=None, alias="dashboardNamespace")
    # dcgm-exporter series scraped without honorLabels carry the GPU's pod as
    # exported_pod / exported_namespace; set true for such a scrape.
    dcgm_exported_labels: bool = Field(default=False, alias="dcgmExportedLabels")

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_labels(v)

    @field_validator("dashboard_namespace")
    @classmethod
    def _dashboard_ns(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _check_dns_labels([v])[0]


class NetworkConfig(_Section):
    """Who may reach the serving port, and where pods may connect (k3:network).

    Ingress to the serving pods is denied except the port from these sources; egress is
    DNS only (plus the Hub for the prefetch Job, and for serving pods in node-local mode,
    whose init container fetches missing files)."""

    # Every pod in these namespaces may call the API (an ingress controller, a gateway).
    allow_from_namespaces: list[str] = Field(default_factory=list, alias="allowFromNamespaces")
    # Pods with all of these labels in the stack's namespace may call the API.
    allow_from_pod_labels: dict[str, str] = Field(default_factory=dict, alias="allowFromPodLabels")
    # The metrics scraper's namespace (null: no scraper access).
    scraper_namespace: Optional[str] = Field(default="monitoring", alias="scraperNamespace")
    # Narrow the scraper to pods with these labels (empty: the whole namespace).
    scraper_pod_labels: dict[str, str] = Field(default_factory=dict, alias="scraperPodLabels")
    # Cluster DNS: its namespace, and extra CIDRs (NodeLocal DNSCache: 169.254.20.10/32).
    dns_namespace: str = Field(default="kube-system", alias="dnsNamespace")
    dns_cidrs: list[str] = Field(default_factory=list, alias="dnsCidrs")
    # Where the Hub (or your HF_ENDPOINT mirror) is reachable: its CDN has no fixed
    # addresses, so the default is any address on the HTTPS port.
    hub_cidrs: list[str] = Field(default_factory=lambda: ["0.0.0.0/0", "::/0"], min_length=1,
                                 alias="hubCidrs")
    hub_ports: list[int] = Field(default_factory=lambda: [443], min_length=1, alias="hubPorts")
    # Addresses inside the cluster and its network (pods, services, nodes, the VPC): cut
    # out of every internet egress rule (Hub, engine build). The default is every
    # private range; list yours if the cluster uses public addresses inside.
    cluster_cidrs: list[str] = Field(
        default_factory=lambda: ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                 "100.64.0.0/10", "fc00::/7"], alias="clusterCidrs")

    @field_validator("allow_from_namespaces")
    @classmethod
    def _namespaces(cls, v: list[str]) -> list[str]:
        return _check_dns_labels(v)

    @field_validator("scraper_namespace", "dns_namespace")
    @classmethod
    def _namespace(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _check_dns_labels([v])[0]

    @field_validator("allow_from_pod_labels", "scraper_pod_labels")
    @classmethod
    def _pod_labels(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_labels(v)

    @field_validator("dns_cidrs", "hub_cidrs", "cluster_cidrs")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        import ipaddress

        for cidr in v:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError:
                raise ValueError(f"{cidr!r} is not a CIDR (address/prefix with no host bits)")
        return v

    @field_validator("hub_ports")
    @classmethod
    def _ports(cls, v: list[int]) -> list[int]:
        for port in v:
            if not 1 <= port <= 65535:
                raise ValueError(f"{port} is not a TCP port (1-65535)")
        return v


class HostConfig(_Section):
    """One Docker host instead of a cluster (k3:host; k3infra/host). The Docker daemon is
    Pulumi's own `docker:host` setting (ssh://user@host or the local socket)."""

    # Weights tree and lock on the host's local NVMe (bind-mounted at /weights).
    weights_root: str = Field(default="/mnt/k3-weights", alias="weightsRoot")
    # Free space on weightsRoot's filesystem in decimal GB (`df -B1000000000`), checked
    # against the lock before anything is pulled; unset = checked only by the prefetch.
    free_gb: Optional[float] = Field(default=None, gt=0, alias="freeGB")
    # Where the API port is published. 0.0.0.0 / :: only with publishAllInterfaces.
    publish_address: str = Field(default="127.0.0.1", alias="publishAddress")
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

    @field_validator("publish_address")
    @classmethod
    def _ip(cls, v: str) -> str:
        import ipaddress

        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError("must be an IP address of the host (default 127.0.0.1)") from None
        return v

    @model_validator(mode="after")
    def _all_interfaces_chosen(self) -> "HostConfig":
        import ipaddress

        wide = ipaddress.ip_address(self.publish_address).is_unspecified or self.network_mode == "host"
        if wide and not self.publish_all_interfaces:
            raise ValueError(f"publishAddress {self.publish_address} / networkMode "
                             f"{self.network_mode} exposes the API on every interface: set "
                             "publishAllInterfaces = true to choose that, or keep 127.0.0.1")
        return self


class StackConfig(_Section):
    """All `k3:*` keys. Field aliases are the config key names."""

    weights_revision: str = Field(alias="weightsRevision")
    gpu_product: str = Field(default_factory=lambda: load_receipt().hardware.gpu_product_label,
                             alias="gpuProduct")
    gpu_memory_gib: Optional[float] = Field(default=None, gt=0, alias="gpuMemoryGib")
    engine_image: Optional[str] = Field(default=None, alias="engineImage")
    replicas: int = Field(default=1, ge=1)
    profile: Literal["measured", "upstream", "custom"] = "measured"
    api_key: Secret = Field(alias="apiKey")
    hf_token: Optional[Secret] = Field(default=None, alias="hfToken")
    accept_model_license: bool = Field(default=False, alias="acceptModelLicense")
    namespace: str = "k3"
    served_model_name: str = Field(default="kimi-k3", alias="servedModelName")
    surface: SurfaceConfig = Field(default_factory=SurfaceConfig)
    custom: CustomConfig = Field(default_factory=CustomConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    node_pool: NodePoolConfig = Field(default_factory=NodePoolConfig, alias="nodePool")
    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    host: Optional[HostConfig] = None

    @field_validator("weights_revision")
    @classmethod
    def _pinned_revision(cls, v: str) -> str:
        if not COMMIT_RE.match(v):
            raise ValueError("must be a 40-hex Hub commit (lowercase); a branch or tag "
                             "such as 'main' is never accepted: the receipt pins bytes")
        return v

    @field_validator("engine_image")
    @classmethod
    def _digest_pinned(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not DIGEST_IMAGE_RE.match(v):
            raise ValueError("must be pinned by digest: <repository>@sha256:<64 hex>")
        return v

    @field_validator("namespace")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if not DNS_LABEL_RE.match(v) or len(v) > 63:
            raise ValueError("must be a DNS label (lowercase letters, digits, '-')")
        return v

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
        if isinstance(key, str) and key != SECRET_PLACEHOLDER and not API_KEY_RE.match(key):
            raise ValueError("must be an RFC 6750 bearer token: letters, digits and -._~+/ "
                             "with optional trailing '=' (openssl rand -hex 32 makes one)")
        return v


def _error_key(loc: tuple) -> str:
    """pydantic location -> the config key a user typed (`k3:serving.shmSizeGi`)."""
    parts = [str(p) for p in loc if not isinstance(p, int)]
    return f"{NAMESPACE}:" + ".".join(parts) if parts else NAMESPACE


def _accepted(err: dict) -> str:
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if err["type"] == "missing":
        return "is required"
    if err["type"] == "extra_forbidden":
        return "is not a known key"
    return msg


def _decode(key: str, value: Any) -> Any:
    """Config values arrive as strings; objects and lists are JSON (Pulumi's wire form)."""
    if isinstance(value, str) and value.startswith(("{", "[")):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{NAMESPACE}:{key}", value, f"is not valid JSON ({exc.msg})")
    return value


def parse_stack_config(raw: dict[str, Any], secret_keys: tuple[str, ...] = ()) -> StackConfig:
    """Validate `k3:*` keys (full `k3:name` or bare `name`) into a StackConfig.

    Unknown keys are refused (a typo must not silently fall back to a default). Values
    of secret keys are wrapped before validation so no error message can print them.
    """
    data: dict[str, Any] = {}
    for full_key, value in raw.items():
        ns, _, key = full_key.rpartition(":")
        if ns and ns != NAMESPACE:
            continue
        if key in SECRET_KEYS or full_key in secret_keys or key in secret_keys:
            value = Secret(value) if value not in (None, "") else value
        else:
            value = _decode(key, value)
        data[key] = value
    known = {f.alias or n for n, f in StackConfig.model_fields.items()}
    for key in data:
        if key not in known:
            raise ConfigError(f"{NAMESPACE}:{key}", data[key],
                              f"is not a known key; known keys: {', '.join(sorted(known))}")
    try:
        cfg = StackConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        value = None if err["type"] == "missing" else err.get("input")
        key = _error_key(err["loc"])
        if value is not None and key.split(":", 1)[1].split(".")[0] in SECRET_KEYS:
            value = Secret(value)
        raise ConfigError(key, value, _accepted(err)) from None
    _check_cross_fields(cfg)
    return cfg


def _check_cross_fields(cfg: StackConfig) -> None:
    receipt = load_receipt()
    if cfg.serving.update_partition > cfg.replicas:
        raise ConfigError("k3:serving.updatePartition", cfg.serving.update_partition,
                          f"must be at most k3:replicas ({cfg.replicas}); equal holds every pod")
    if cfg.profile != "custom" and (cfg.custom.args or cfg.custom.env):
        raise ConfigError("k3:custom", cfg.custom.model_dump(),
                          "engine-path changes need k3:profile = custom (the render is then "
                          "labelled as not the measured configuration)")
    for flag, value in cfg.surface.args.items():
        if flag in ("--host", "--port"):
            raise ConfigError(f"k3:surface.args.{flag}", value,
                              "is set by k3infra: vLLM listens on 127.0.0.1:"
                              "k3:serving.enginePort behind the authenticating proxy; the "
                              "client port is k3:serving.port")
        allowed = receipt.serve.surface_flag(flag)
        if allowed is None:
            accepted = ", ".join(a.flag for a in receipt.serve.surface.args)
            raise ConfigError(f"k3:surface.args.{flag}", value,
                              f"is not an allow-listed surface flag ({accepted}); engine-path "
                              "flags need k3:profile = custom and k3:custom.args")
        if allowed.takes_value is isinstance(value, bool):
            raise ConfigError(f"k3:surface.args.{flag}", value,
                              "takes a string value" if allowed.takes_value
                              else "is a switch: true or false")
    for name, value in cfg.surface.env.items():
        if name not in receipt.serve.surface.env:
            raise ConfigError(f"k3:surface.env.{name}", value,
                              f"is not an allow-listed surface variable "
                              f"({', '.join(receipt.serve.surface.env)})")
        if name == "VLLM_API_KEY":
            raise ConfigError(f"k3:surface.env.{name}", SECRET_PLACEHOLDER,
                              "the API key comes from the k3:apiKey secret only")
    if cfg.engine.build == "prebuilt" and cfg.engine_image is None:
        raise ConfigError("k3:engineImage", None,
                          "is required with k3:engine.build = prebuilt: "
                          "<repository>@sha256:<64 hex>")
    if cfg.profile == "upstream" and cfg.engine.build != "prebuilt":
        raise ConfigError("k3:engine.build", cfg.engine.build,
                          "the upstream profile uses a released image: prebuilt only")


# --- reading config from a stack file (offline render) --------------------------------

STACK_DIR = "stacks"                 # Pulumi.yaml's stackConfigDir: the user's own stack files
STACK_TEMPLATES = "stacks/examples"  # tracked templates, never carrying a ciphertext


def stack_file(stack: str, root: Path) -> Path:
    """The user's `stacks/Pulumi.<stack>.yaml` if it exists, else the shipped template.

    Templates carry no `secure:` value (a ciphertext is bound to one stack's key); users
    copy a template into `stacks/` and `pulumi config set --secret` writes their own."""
    own = root / STACK_DIR / f"Pulumi.{stack}.yaml"
    return own if own.is_file() else root / STACK_TEMPLATES / f"Pulumi.{stack}.yaml"


def stack_names(root: Path) -> list[str]:
    """Every stack a render can name: the shipped templates and the user's own files."""
    files = [*(root / STACK_TEMPLATES).glob("Pulumi.*.yaml"), *(root / STACK_DIR).glob("Pulumi.*.yaml")]
    return sorted({p.name[len("Pulumi."):-len(".yaml")] for p in files})


def read_stack_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """`config:` of a Pulumi stack file -> ({'k3:key': value}, secret keys).

    `secure:` ciphertexts cannot be decrypted offline: they become the placeholder."""
    import yaml

    doc = yaml.safe_load(path.read_text()) or {}
    raw: dict[str, Any] = {}
    secrets: list[str] = []
    for key, value in (doc.get("config") or {}).items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            raw[key] = SECRET_PLACEHOLDER
            secrets.append(key)
        else:
            raw[key] = value
    return raw, secrets


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """`KEY=VALUE` (KEY may be `k3:a.b.c`, a dotted path into an object)."""
    if "=" not in assignment:
        raise ConfigError("--config", assignment, "takes KEY=VALUE")
    key, value = assignment.split("=", 1)
    if ":" not in key:
        key = f"{NAMESPACE}:{key}"
    top, *path = key.split(".")
    parsed: Any = value
    if value in ("true", "false"):
        parsed = value == "true"
    elif value.startswith(("[", "{")):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(key, value, "is not valid JSON")
    if not path:
        raw[top] = parsed
        return
    obj = raw.get(top)
    obj = json.loads(obj) if isinstance(obj, str) else dict(obj or {})
    cursor = obj
    for part in path[:-1]:
        cursor = cursor.setdefault(part, {})
        if not isinstance(cursor, dict):
            raise ConfigError(key, value, f"{part} is not an object")
    cursor[path[-1]] = parsed
    raw[top] = obj


def to_pulumi_config(raw: dict[str, Any]) -> dict[str, str]:
    """Pulumi's wire form: every value a string, objects and lists JSON-encoded."""
    out = {}
    for key, value in raw.items():
        if isinstance(value, (dict, list)):
            out[key] = json.dumps(value)
        elif isinstance(value, bool):
            out[key] = "true" if value else "false"
        else:
            out[key] = str(value)
    return out
