"""Which engine a stack runs and how its image is obtained: (receipt, config) -> EnginePlan.

Pure: no Pulumi, no I/O. Every engine pin (repository, commit, pull request, version,
excluded extension, compute capability) is read from the receipt and reaches the
Dockerfile only as a build argument built here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from packaging.version import InvalidVersion, Version

from k3infra.config import ConfigError, StackConfig
from k3infra.gates import Gate, is_placeholder
from k3infra.receipt import NOTHING_MEASURED, Receipt, image_repository

# First vLLM release that supports Kimi K3 natively and accepts every receipt flag
# (shared/K3_FACTS.md, "Engine facts"). It is a different engine from the receipt's:
# the `upstream` profile is labelled as such everywhere it shows.
UPSTREAM_MIN_VERSION = "0.33.0"
NOT_MEASURED = "not the measured engine"

# The recipe's CUDA toolkit; images/Dockerfile `ARG CUDA_VERSION` (a test keeps them
# equal). Why 13.0 and not 12.9: docs/engine.md, "CUDA and the architecture list".
RECIPE_CUDA_VERSION = "13.0.2"

# Sizing of nvcc parallelism. vLLM's setup.py divides MAX_JOBS by NVCC_THREADS to get
# the number of parallel compiles, so MAX_JOBS is the number of nvcc threads alive at
# once. One thread compiling the heaviest CUTLASS/Marlin units for one architecture
# peaks at several GiB; 5 GiB per thread plus 8 GiB for the rest of the pod (BuildKit,
# the linker, pip) keeps a build below its memory limit. OOM kills are the most common
# failure of vLLM source builds, so these err on the safe side.
NVCC_THREAD_GIB = 5
BUILD_RESERVE_GIB = 8
DEFAULT_NVCC_THREADS = 2

# The build node the Dockerfile's MAX_JOBS / NVCC_THREADS defaults are sized for
# (build_parallelism(DOCKERFILE_NODE_CPU, DOCKERFILE_NODE_MEMORY_GI); a test checks).
DOCKERFILE_NODE_CPU = 32
DOCKERFILE_NODE_MEMORY_GI = 128

MODES = ("prebuilt", "in-cluster", "local")


@dataclass(frozen=True)
class EnginePlan:
    """The engine a stack runs. `image` is set for prebuilt; build modes get theirs from
    the build (a digest Output), `build_args` are what the Dockerfile receives."""

    mode: str
    profile: str
    measured: bool
    label: str
    engine_version: Optional[str]
    engine_commit: Optional[str]
    image: Optional[str] = None
    repository: Optional[str] = None
    tag: Optional[str] = None
    wheel_sha256: Optional[str] = None
    build_args: dict[str, str] = field(default_factory=dict)
    cache_repository: Optional[str] = None

    @property
    def builds(self) -> bool:
        return self.mode != "prebuilt"

    def pins(self) -> dict[str, str]:
        """Annotations that describe the engine a pod runs (an upstream image carries no
        receipt commit); the serving builders put them on the StatefulSet and its pods."""
        pins = {"k3infra.dev/engine": self.label}
        if self.engine_commit:
            pins["k3infra.dev/engine-commit"] = self.engine_commit
        if self.engine_version:
            pins["k3infra.dev/engine-version"] = self.engine_version
        return pins

    @property
    def image_digest(self) -> Optional[str]:
        return self.image.rsplit("@", 1)[1] if self.image else None

    @property
    def tagged_ref(self) -> Optional[str]:
        return f"{self.repository}:{self.tag}" if self.repository and self.tag else None

    @property
    def cache_ref(self) -> Optional[str]:
        """Registry build cache (BuildKit `type=registry`, mode=max) in its own repository
        (k3:engine.cacheRegistry), never the serving image's; None: no registry cache."""
        return f"{self.cache_repository}:buildcache" if self.cache_repository else None


def arch_list(cuda_version: str, compute_capability: str) -> str:
    """TORCH_CUDA_ARCH_LIST that builds a vLLM wheel running on `compute_capability`.

    CUDA >= 13: the family's base (`10.0`). vLLM's CMake compiles arch-specific kernels
    for the family target `10.0f` when `10.0` is listed (sm_100f runs on every 10.x,
    sm_103 included) and generic kernels as sm_100, which runs on 10.3 by CUDA's
    minor-version binary compatibility. `10.0f` itself cannot go in the list: PyTorch's
    CMake accepts only `N.N[a]`. CUDA 12.9 has no family targets: it must name 10.3.
    """
    cuda = Version(cuda_version)
    major, _, minor = compute_capability.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ValueError(f"compute capability {compute_capability!r} is not <major>.<minor>")
    if cuda >= Version("13.0"):
        return f"{major}.0"
    if cuda >= Version("12.9"):
        return compute_capability if minor == "0" else f"{major}.0;{compute_capability}"
    raise ValueError(f"CUDA {cuda_version} cannot target compute capability "
                     f"{compute_capability}: 12.9 or newer is needed")


def build_parallelism(cpu: int, memory_gi: int, nvcc_threads: Optional[int] = None,
                      max_jobs: Optional[int] = None) -> tuple[int, int]:
    """(MAX_JOBS, NVCC_THREADS) for a build node: as many nvcc threads as cores, but no
    more than the memory holds. An explicit max_jobs that would not fit is refused."""
    budget = (memory_gi - BUILD_RESERVE_GIB) // NVCC_THREAD_GIB
    if budget < 1:
        raise ConfigError("k3:engine.buildMemoryGi", memory_gi,
                          f"needs at least {BUILD_RESERVE_GIB + NVCC_THREAD_GIB} GiB "
                          f"({NVCC_THREAD_GIB} GiB per nvcc thread + {BUILD_RESERVE_GIB} GiB)")
    if max_jobs is not None and max_jobs > budget:
        raise ConfigError("k3:engine.maxJobs", max_jobs,
                          f"at most {budget} with buildMemoryGi {memory_gi}: each nvcc thread "
                          f"needs about {NVCC_THREAD_GIB} GiB and OOM-killed builds fail late")
    jobs = max_jobs if max_jobs is not None else max(1, min(cpu, budget))
    threads = min(nvcc_threads or DEFAULT_NVCC_THREADS, jobs)
    return jobs, threads


def default_tag(receipt: Receipt, cuda_version: str = RECIPE_CUDA_VERSION) -> str:
    cu = "".join(cuda_version.split(".")[:2])
    return f"vllm-{receipt.engine.commit}-cu{cu}"


def build_args(receipt: Receipt, cfg: StackConfig) -> dict[str, str]:
    """The Dockerfile's build arguments, all from the receipt and the build node size."""
    e = receipt.engine
    if e.commit is None:
        raise ConfigError("k3:receipt", receipt.id, f"its engine is the released image {e.image}: "
                          "nothing to build (k3:engine.build prebuilt, k3:engineImage by digest)")
    jobs, threads = build_parallelism(cfg.engine.build_cpu, cfg.engine.build_memory_gi,
                                      cfg.engine.nvcc_threads, cfg.engine.max_jobs)
    try:
        arch = {"TORCH_CUDA_ARCH_LIST": arch_list(RECIPE_CUDA_VERSION, e.cuda_arch)}
    except ValueError:
        # A receipt whose engine is no CUDA build (the e2e's CPU receipt): the shipped
        # recipe compiles CUDA kernels and cannot build it; a recipe of your own may.
        if cfg.engine.recipe_dir is None:
            raise ConfigError("k3:engine.recipeDir", None,
                              f"is required to build the engine of receipt {receipt.id}: its "
                              f"engine.cuda_arch {e.cuda_arch!r} names no CUDA compute "
                              "capability, which the shipped recipe compiles for (a recipe of "
                              "your own, profile custom, or k3:engine.build = prebuilt)") from None
        arch = {}
    return {
        "ENGINE_REPO": e.repo,
        # The pinned full SHA; until it is set (a render) the receipt's prefix, which
        # the recipe's fetch step refuses and `pulumi up` gates (engine_gates).
        "ENGINE_COMMIT": cfg.engine.commit or e.commit,
        "ENGINE_COMMIT_PREFIX": e.commit,
        "ENGINE_PR": str(e.pull_request),
        "ENGINE_VERSION": e.version,
        "ENGINE_EXCLUDE": ",".join(e.build_exclusions),
        "ENGINE_CUDA_ARCH": e.cuda_arch,
        **arch,
        "MAX_JOBS": str(jobs),
        "NVCC_THREADS": str(threads),
        "USE_SCCACHE": "1" if cfg.engine.sccache_secret else "0",
        # Base images by digest (k3:engine.baseImages).
        "BUILD_BASE_IMAGE": cfg.engine.base_images.cuda_devel,
        "RUNTIME_BASE_IMAGE": cfg.engine.base_images.cuda_devel,
        "UV_IMAGE": cfg.engine.base_images.uv,
        "RUST_IMAGE": cfg.engine.base_images.rust,
    }


def upstream_version(cfg: StackConfig) -> Optional[str]:
    """The declared release of an upstream image (None: not declared; the label then
    states only the minimum). A digest cannot tell its version, so this is the user's
    statement, checked against the minimum that runs Kimi K3."""
    v = cfg.engine.upstream_version
    accepted = (f"a released vLLM version >= {UPSTREAM_MIN_VERSION} (the version of "
                f"k3:engineImage; earlier releases do not run Kimi K3)")
    if v is None:
        return None
    try:
        parsed = Version(v)
    except InvalidVersion:
        raise ConfigError("k3:engine.upstreamVersion", v, accepted) from None
    if parsed.is_prerelease or parsed.is_devrelease or parsed < Version(UPSTREAM_MIN_VERSION):
        raise ConfigError("k3:engine.upstreamVersion", v, accepted)
    return v


def build_namespace(cfg: StackConfig) -> str:
    """Where an in-cluster build runs: its own namespace, because rootless BuildKit needs
    Pod Security `privileged` and the serving namespace enforces `restricted`."""
    ns = cfg.engine.build_namespace or f"{cfg.namespace}-build"
    if ns == cfg.namespace:
        raise ConfigError("k3:engine.buildNamespace", ns,
                          "must differ from k3:namespace: the build needs Pod Security "
                          "`privileged`, the serving namespace stays `restricted`")
    if len(ns) > 63:
        raise ConfigError("k3:engine.buildNamespace", ns, "at most 63 characters: set it "
                          "explicitly when k3:namespace is long")
    return ns


def _check_released(receipt: Receipt, cfg: StackConfig) -> None:
    """A receipt whose engine is a released image: the stack pins that image by digest
    (k3:engineImage, prebuilt); nothing is built."""
    e = receipt.engine
    how = (f"its engine is the released image {e.image}, run by digest: "
           f"{e.image}@sha256:<digest> (`k3infra pins --stack <stack> --write` resolves "
           "the tag)")
    if cfg.engine.build != "prebuilt" or cfg.engine_image is None:
        raise ConfigError("k3:engineImage", cfg.engine_image,
                          f"is required with receipt {receipt.id} and k3:engine.build prebuilt: "
                          f"{how}; nothing is built")
    if cfg.profile != "custom" and image_repository(cfg.engine_image) != e.image_repository:
        raise ConfigError("k3:engineImage", cfg.engine_image,
                          f"must be of the receipt's repository {e.image_repository} "
                          f"(receipt {receipt.id}: {how}); another image needs k3:profile custom")
    if cfg.engine.commit is not None:
        raise ConfigError("k3:engine.commit", cfg.engine.commit,
                          f"is not accepted with receipt {receipt.id}: {how}")
    measured = e.image.rpartition("@")[2] if "@" in e.image else None
    if measured and cfg.profile == "measured" and cfg.engine_image.rpartition("@")[2] != measured:
        raise ConfigError("k3:engineImage", cfg.engine_image,
                          f"must be the image receipt {receipt.id} measured, {e.image}: another "
                          "digest is another engine (k3:profile custom, or a receipt of it)")


def _check(receipt: Receipt, cfg: StackConfig) -> None:
    """Engine keys that only make sense together; refused before anything is created."""
    eng = cfg.engine
    if receipt.engine.image is not None and cfg.profile != "upstream":
        _check_released(receipt, cfg)
    if eng.build != "prebuilt" and cfg.engine_image is not None:
        raise ConfigError("k3:engineImage", cfg.engine_image,
                          f"is only used with k3:engine.build = prebuilt; with {eng.build} the "
                          "image is the build's output (remove one of the two)")
    if eng.build != "prebuilt" and eng.registry is None:
        raise ConfigError("k3:engine.registry", None,
                          f"is required with k3:engine.build = {eng.build}: the repository the "
                          "build pushes to, such as registry.example.com/k3/vllm")
    if eng.build == "in-cluster" and eng.registry_secret is None:
        raise ConfigError("k3:engine.registrySecret", None,
                          "is required with k3:engine.build = in-cluster: an existing "
                          "kubernetes.io/dockerconfigjson Secret that may push to k3:engine.registry")
    if eng.build == "in-cluster" and eng.context == "git":
        if eng.git_url is None:
            raise ConfigError("k3:engine.gitUrl", None, "is required with k3:engine.context = git")
        if eng.git_revision is None:
            raise ConfigError("k3:engine.gitRevision", None,
                              "is required with k3:engine.context = git: a 40-hex commit")
    if eng.build == "in-cluster":
        build_namespace(cfg)
    if eng.recipe_dir is not None:
        if cfg.profile != "custom":
            raise ConfigError("k3:engine.recipeDir", eng.recipe_dir,
                              "is only accepted with k3:profile = custom: the measured engine "
                              "is built from the shipped recipe (images/)")
        if eng.build == "prebuilt" or (eng.build == "in-cluster" and eng.context == "git"):
            raise ConfigError("k3:engine.recipeDir", eng.recipe_dir,
                              "is only used by a build from this machine's files "
                              "(k3:engine.build = local, or in-cluster with context configmap)")
    if eng.plain_http_registries and eng.build != "in-cluster":
        raise ConfigError("k3:engine.plainHttpRegistries", eng.plain_http_registries,
                          "is only used with k3:engine.build = in-cluster (BuildKit in the "
                          "build pod); a local build uses your Docker builder's settings")
    if eng.build_isolation == "runtime-class" and eng.build_runtime_class is None:
        raise ConfigError("k3:engine.buildRuntimeClass", None,
                          "is required with k3:engine.buildIsolation = runtime-class: a "
                          "sandboxed RuntimeClass (gVisor, Kata) installed in the cluster")
    if eng.build_runtime_class is not None and eng.build_isolation != "runtime-class":
        raise ConfigError("k3:engine.buildRuntimeClass", eng.build_runtime_class,
                          "is only used with k3:engine.buildIsolation = runtime-class")
    if eng.cache_registry is not None:
        if eng.cache_registry == eng.registry:
            raise ConfigError("k3:engine.cacheRegistry", eng.cache_registry,
                              "must be its own repository, not k3:engine.registry: a build "
                              "step that can write the cache must not be able to push the "
                              "serving image's repository")
        if eng.build == "in-cluster" and eng.cache_registry_secret is None:
            raise ConfigError("k3:engine.cacheRegistrySecret", None,
                              "is required with k3:engine.cacheRegistry in-cluster: a "
                              "dockerconfigjson Secret that may push only the cache repository")
    if eng.cache_registry_secret is not None and (
            eng.cache_registry is None or eng.cache_registry_secret == eng.registry_secret):
        raise ConfigError("k3:engine.cacheRegistrySecret", eng.cache_registry_secret,
                          "needs k3:engine.cacheRegistry and must differ from "
                          "k3:engine.registrySecret (separate credentials for the cache)")
    if eng.build == "local" and eng.sccache_secret is not None:
        raise ConfigError("k3:engine.sccacheSecret", eng.sccache_secret,
                          "is an in-cluster Secret: local builds use the operator's own "
                          "Docker builder cache")
    if eng.upstream_version is not None and cfg.profile != "upstream":
        raise ConfigError("k3:engine.upstreamVersion", eng.upstream_version,
                          "is only accepted with k3:profile = upstream")
    if (eng.commit is not None and receipt.engine.commit is not None
            and not eng.commit.startswith(receipt.engine.commit)):
        raise ConfigError("k3:engine.commit", eng.commit,
                          f"must start with the receipt's engine commit {receipt.engine.commit}: "
                          "any other commit is not the measured engine")
    if eng.commit is not None and cfg.profile == "upstream":
        raise ConfigError("k3:engine.commit", eng.commit,
                          "is not accepted with k3:profile = upstream (a released image)")
    if eng.wheel_sha256 is not None and eng.build != "prebuilt":
        raise ConfigError("k3:engine.wheelSha256", eng.wheel_sha256,
                          "is only accepted with k3:engine.build = prebuilt: builds record "
                          "the wheel hash themselves")


def resolve_engine(receipt: Receipt, cfg: StackConfig) -> EnginePlan:
    """The stack's engine: mode, profile, label, and the build arguments when it builds."""
    _check(receipt, cfg)
    eng = cfg.engine
    e = receipt.engine
    if cfg.profile == "upstream":
        version = upstream_version(cfg)
        release = (f"vLLM {version} release" if version else
                   f"a vLLM release >= {UPSTREAM_MIN_VERSION} (version not declared in "
                   "k3:engine.upstreamVersion)")
        return EnginePlan(
            mode="prebuilt", profile="upstream", measured=False,
            label=f"upstream: {release}, {NOT_MEASURED} (receipt {receipt.id} ran {e.version})",
            engine_version=version, engine_commit=None, image=cfg.engine_image)

    measured = cfg.profile == "measured" and not receipt.is_candidate
    # A released engine (PR 0) or one built whole says nothing of a PR or an exclusion.
    notes = ([f"PR {e.pull_request}"] if e.pull_request else []) + \
        ([f"without {', '.join(e.build_exclusions)}"] if e.build_exclusions else [])
    engine = e.describe() + (f" ({', '.join(notes)})" if notes else "")
    how = {"prebuilt": ("the released image by digest" if e.image else
                        "prebuilt image, audit its labels"),
           "in-cluster": "built in-cluster by BuildKit",
           "local": "built on the operator's machine"}[eng.build]
    if cfg.profile == "custom":
        label = f"custom: {engine} with engine-path changes, not the measured configuration; {how}"
    elif receipt.is_candidate:
        label = f"candidate ({NOTHING_MEASURED}): {engine}, receipt {receipt.id}; {how}"
    else:
        label = f"measured: {engine}, {how}"
    if eng.build == "prebuilt":
        return EnginePlan(mode="prebuilt", profile=cfg.profile, measured=measured, label=label,
                          engine_version=e.version, engine_commit=eng.commit or e.commit,
                          image=cfg.engine_image, wheel_sha256=eng.wheel_sha256)
    return EnginePlan(mode=eng.build, profile=cfg.profile, measured=measured, label=label,
                      engine_version=e.version, engine_commit=eng.commit or e.commit,
                      repository=eng.registry, tag=eng.tag or default_tag(receipt),
                      build_args=build_args(receipt, cfg), cache_repository=eng.cache_registry)


def engine_gates(receipt: Receipt, cfg: StackConfig) -> list[Gate]:
    """Placeholders an in-cluster build must not run with: warned in a render or preview,
    refused by `pulumi up` (k3infra.gates.enforce)."""
    eng = cfg.engine
    found = []
    if eng.build != "prebuilt" and eng.commit is None:
        e = receipt.engine
        found.append(Gate("k3:engine.commit",
                          f"unset: a build takes only the full 40-hex engine commit, never the "
                          f"receipt's prefix {e.commit} (resolve it once: python3 "
                          f"images/k3_engine_build.py resolve --repo-url {e.repo} --pr "
                          f"{e.pull_request} --commit {e.commit} --dest /tmp/vllm-resolve; "
                          "check the commit it prints, then set it)"))
    if eng.build != "prebuilt":
        for sub, image in (("cudaDevel", eng.base_images.cuda_devel), ("uv", eng.base_images.uv),
                           ("rust", eng.base_images.rust)):
            if is_placeholder(image):
                tag = image.split("@", 1)[0]
                found.append(Gate(f"k3:engine.baseImages.{sub}",
                                  f"{image} is a placeholder digest: set the digest of {tag} "
                                  f"(docker buildx imagetools inspect {tag})"))
    if eng.build == "in-cluster" and not eng.api_server_cidrs:
        found.append(Gate("k3:engine.apiServerCidrs",
                          "unset: the build pod may reach no cluster address but the API "
                          "server's, which its report container writes the result to; list "
                          "its endpoint addresses (kubectl get endpointslices -n default -l "
                          "kubernetes.io/service-name=kubernetes -o jsonpath="
                          "'{.items[*].endpoints[*].addresses[*]}', as /32 CIDRs)"))
    if eng.build == "in-cluster":
        for key, image in (("k3:engine.buildkitImage", eng.buildkit_image),
                           ("k3:engine.reporterImage", eng.reporter_image)):
            if is_placeholder(image):
                tag = image.split("@", 1)[0]
                found.append(Gate(key, f"{image} is a placeholder digest: set the digest of "
                                       f"{tag} (docker buildx imagetools inspect {tag})"))
    return found
