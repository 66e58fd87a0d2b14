"""resolve_engine(receipt, cfg) -> EnginePlan, table-driven, no Pulumi: profiles, modes,
labels, build args from the receipt, and every refusal naming its key."""
from __future__ import annotations

import pytest

from k3infra.config import ConfigError, parse_stack_config
from k3infra.receipt import load_receipt
from k3infra.engine.plan import (NOT_MEASURED, RECIPE_CUDA_VERSION, UPSTREAM_MIN_VERSION,
                                 arch_list, build_args, build_parallelism, default_tag,
                                 resolve_engine)

from conftest import GOOD_REVISION

IMAGE = f"registry.example.com/k3/vllm@sha256:{'12' * 32}"
REPO = "registry.example.com/k3/vllm"


def cfg(**keys):
    return parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "k", **keys}, receipt=load_receipt())


def in_cluster(**engine):
    return cfg(engine={"build": "in-cluster", "registry": REPO, "registrySecret": "push", **engine})


def test_build_args_come_from_the_receipt(receipt):
    args = resolve_engine(receipt, in_cluster()).build_args
    e = receipt.engine
    assert args["ENGINE_REPO"] == e.repo
    assert args["ENGINE_COMMIT"] == e.commit
    assert args["ENGINE_PR"] == str(e.pull_request)
    assert args["ENGINE_VERSION"] == e.version
    assert args["ENGINE_EXCLUDE"] == ",".join(e.build_exclusions)
    assert args["ENGINE_CUDA_ARCH"] == e.cuda_arch
    assert args["TORCH_CUDA_ARCH_LIST"] == arch_list(RECIPE_CUDA_VERSION, e.cuda_arch)


def test_build_args_follow_a_different_receipt(receipt):
    """Nothing about the engine is hard-coded: another receipt, other args."""
    other = receipt.model_copy(update={"engine": receipt.engine.model_copy(
        update={"commit": "0123abcd", "version": "0.99.0", "pull_request": 1,
                "build_exclusions": []})})
    args = build_args(other, in_cluster())
    assert (args["ENGINE_COMMIT"], args["ENGINE_VERSION"], args["ENGINE_PR"],
            args["ENGINE_EXCLUDE"]) == ("0123abcd", "0.99.0", "1", "")


@pytest.mark.parametrize("cuda, cc, expected", [
    ("13.0.2", "10.3", "10.0"),        # family base; vLLM compiles 10.0f kernels from it
    ("13.1.0", "10.0", "10.0"),
    ("12.9.1", "10.3", "10.0;10.3"),   # no family targets: 10.3 must be named
    ("12.9.1", "10.0", "10.0"),
])
def test_arch_list(cuda, cc, expected):
    assert arch_list(cuda, cc) == expected


def test_arch_list_refuses_a_cuda_too_old_for_blackwell_ultra():
    with pytest.raises(ValueError, match="12.9 or newer"):
        arch_list("12.8.1", "10.3")


@pytest.mark.parametrize("cpu, mem, expected", [
    (32, 128, (24, 2)),      # memory-bound: (128 - 8) // 5
    (16, 128, (16, 2)),      # core-bound
    (96, 512, (96, 2)),
    (4, 16, (1, 1)),         # one thread fits; NVCC_THREADS never exceeds MAX_JOBS
])
def test_build_parallelism(cpu, mem, expected):
    assert build_parallelism(cpu, mem) == expected


def test_build_parallelism_refuses_more_jobs_than_memory_holds():
    with pytest.raises(ConfigError) as err:
        build_parallelism(64, 64, max_jobs=40)
    assert err.value.key == "k3:engine.maxJobs" and "at most 11" in str(err.value)


def test_build_args_use_the_build_node_size(receipt):
    args = build_args(receipt, in_cluster(buildCpu=16, buildMemoryGi=64, nvccThreads=4))
    assert (args["MAX_JOBS"], args["NVCC_THREADS"]) == ("11", "4")


def test_measured_prebuilt(receipt):
    p = resolve_engine(receipt, cfg(engineImage=IMAGE))
    assert (p.mode, p.profile, p.measured) == ("prebuilt", "measured", True)
    assert p.image == IMAGE and p.image_digest == f"sha256:{'12' * 32}"
    assert p.engine_commit == receipt.engine.commit and p.build_args == {}
    assert p.label.startswith("measured:") and NOT_MEASURED not in p.label


def test_in_cluster_plan(receipt):
    p = resolve_engine(receipt, in_cluster())
    assert p.mode == "in-cluster" and p.builds and p.image is None
    assert p.tagged_ref == f"{REPO}:{default_tag(receipt)}"
    assert p.cache_ref is None            # no registry cache unless its own repository
    assert resolve_engine(receipt, in_cluster(
        cacheRegistry=f"{REPO}-cache", cacheRegistrySecret="cache")).cache_ref == f"{REPO}-cache:buildcache"
    assert receipt.engine.commit in p.tag


def test_custom_tag(receipt):
    assert resolve_engine(receipt, in_cluster(tag="k3-2026")).tagged_ref == f"{REPO}:k3-2026"


def test_upstream_is_labelled_and_carries_no_engine_commit(receipt):
    p = resolve_engine(receipt, cfg(profile="upstream", engineImage=IMAGE,
                                    engine={"upstreamVersion": UPSTREAM_MIN_VERSION}))
    assert p.measured is False and p.engine_commit is None
    assert NOT_MEASURED in p.label and UPSTREAM_MIN_VERSION in p.label
    assert p.engine_version == UPSTREAM_MIN_VERSION


def test_upstream_without_a_declared_version_states_the_minimum(receipt):
    p = resolve_engine(receipt, cfg(profile="upstream", engineImage=IMAGE))
    assert p.engine_version is None
    assert f">= {UPSTREAM_MIN_VERSION}" in p.label and NOT_MEASURED in p.label


def test_custom_profile_is_labelled_not_measured(receipt):
    p = resolve_engine(receipt, cfg(profile="custom", engineImage=IMAGE))
    assert p.measured is False and "not the measured configuration" in p.label


@pytest.mark.parametrize("keys, key", [
    ({"engine": {"build": "in-cluster", "registrySecret": "push"}}, "k3:engine.registry"),
    ({"engine": {"build": "in-cluster", "registry": REPO}}, "k3:engine.registrySecret"),
    ({"engine": {"build": "local"}}, "k3:engine.registry"),
    ({"engineImage": IMAGE, "engine": {"build": "local", "registry": REPO}}, "k3:engineImage"),
    ({"engine": {"build": "in-cluster", "registry": REPO, "registrySecret": "push",
                 "context": "git"}}, "k3:engine.gitUrl"),
    ({"engine": {"build": "in-cluster", "registry": REPO, "registrySecret": "push",
                 "context": "git", "gitUrl": "https://git.example.com/x.git"}},
     "k3:engine.gitRevision"),
    ({"engine": {"build": "local", "registry": REPO, "sccacheSecret": "cache"}},
     "k3:engine.sccacheSecret"),
    ({"engineImage": IMAGE, "engine": {"upstreamVersion": "0.33.0"}}, "k3:engine.upstreamVersion"),
    ({"engine": {"build": "local", "registry": REPO, "wheelSha256": "a" * 64}},
     "k3:engine.wheelSha256"),
    # A recipe of your own is the custom profile, and only where this machine's files go.
    ({"engine": {"build": "local", "registry": REPO, "recipeDir": "recipe"}},
     "k3:engine.recipeDir"),
    ({"profile": "custom", "engineImage": IMAGE, "engine": {"recipeDir": "recipe"}},
     "k3:engine.recipeDir"),
    ({"profile": "custom", "engine": {"build": "in-cluster", "registry": REPO,
                                      "registrySecret": "push", "recipeDir": "recipe",
                                      "context": "git", "gitUrl": "https://git.example.com/x.git",
                                      "gitRevision": "a" * 40}}, "k3:engine.recipeDir"),
    ({"engine": {"build": "local", "registry": REPO, "plainHttpRegistries": ["registry.lan:5000"]}},
     "k3:engine.plainHttpRegistries"),
    ({"profile": "upstream", "engineImage": IMAGE, "engine": {"upstreamVersion": "0.32.9"}},
     "k3:engine.upstreamVersion"),
    ({"profile": "upstream", "engineImage": IMAGE, "engine": {"upstreamVersion": "0.33.0rc1"}},
     "k3:engine.upstreamVersion"),
    ({"profile": "upstream", "engineImage": IMAGE, "engine": {"upstreamVersion": "latest"}},
     "k3:engine.upstreamVersion"),
])
def test_refusals_name_the_key(receipt, keys, key):
    with pytest.raises(ConfigError) as err:
        resolve_engine(receipt, cfg(**keys))
    assert err.value.key == key


@pytest.mark.parametrize("engine, key", [
    ({"registry": "registry.example.com/k3/vllm:tag"}, "k3:engine.registry"),
    ({"registry": "Registry.example.com/K3"}, "k3:engine.registry"),
    ({"gitRevision": "main"}, "k3:engine.gitRevision"),
    ({"buildkitImage": "moby/buildkit:master-rootless"}, "k3:engine.buildkitImage"),
    ({"buildkitImage": "moby/buildkit:latest"}, "k3:engine.buildkitImage"),
    ({"buildkitImage": "moby/buildkit:v0.23.2-rootless"}, "k3:engine.buildkitImage"),
    ({"reporterImage": "python"}, "k3:engine.reporterImage"),
    ({"registrySecret": "Push_Secret"}, "k3:engine.registrySecret"),
    ({"wheelSha256": "ABC"}, "k3:engine.wheelSha256"),
    ({"buildMemoryGi": 8}, "k3:engine.buildMemoryGi"),
    ({"nvccThreads": 16}, "k3:engine.nvccThreads"),
    ({"buildCpu": 0}, "k3:engine.buildCpu"),
    ({"recipeDir": "../x\n"}, "k3:engine.recipeDir"),
    ({"recipeDir": "my recipe"}, "k3:engine.recipeDir"),
    ({"plainHttpRegistries": ["http://registry.lan:5000"]}, "k3:engine.plainHttpRegistries"),
    ({"plainHttpRegistries": ["registry.lan:5000/k3"]}, "k3:engine.plainHttpRegistries"),
    ({"plainHttpRegistries": ["Registry.lan"]}, "k3:engine.plainHttpRegistries"),
])
def test_engine_keys_are_validated_by_the_config(engine, key):
    with pytest.raises(ConfigError) as err:
        cfg(engineImage=IMAGE, engine=engine)
    assert err.value.key == key


def test_engine_gates_flag_placeholder_build_images_only_for_in_cluster():
    from k3infra.engine.plan import engine_gates

    keys = [g.key for g in engine_gates(load_receipt(), in_cluster())]
    assert keys == ["k3:engine.commit", "k3:engine.baseImages.cudaDevel",
                    "k3:engine.baseImages.uv", "k3:engine.baseImages.rust",
                    "k3:engine.apiServerCidrs", "k3:engine.buildkitImage",
                    "k3:engine.reporterImage"]
    full = receipt_commit() + "0" * (40 - len(receipt_commit()))
    pinned = in_cluster(buildkitImage=f"moby/buildkit:v0.23.2-rootless@sha256:{'3' * 64}",
                        reporterImage=f"python:3.12.11-slim-bookworm@sha256:{'4' * 64}",
                        commit=full, apiServerCidrs=["10.0.0.10/32"],
                        baseImages={"cudaDevel": f"nvidia/cuda:13.0.2-devel-ubuntu22.04@sha256:{'5' * 64}",
                                    "uv": f"ghcr.io/astral-sh/uv:0.8.22@sha256:{'6' * 64}",
                                    "rust": f"rust:1.90.0-slim-bookworm@sha256:{'7' * 64}"})
    assert engine_gates(load_receipt(), pinned) == []
    assert engine_gates(load_receipt(), cfg(engineImage=IMAGE)) == []


def receipt_commit() -> str:
    from k3infra.receipt import load_receipt

    return load_receipt().engine.commit


@pytest.mark.parametrize("commit, ok", [
    (None, True),
    ("f68f4fdd" + "0" * 32, True),
    ("f68f4fde" + "0" * 32, False),      # another commit: not the measured engine
    ("0" * 40, False),
])
def test_the_pinned_commit_must_start_with_the_receipts(receipt, commit, ok):
    """Issue 21: the full commit is recorded once and must carry the receipt's prefix."""
    assert receipt.engine.commit == "f68f4fdd"
    if ok:
        p = resolve_engine(receipt, in_cluster(commit=commit))
        assert p.engine_commit == (commit or receipt.engine.commit)
        assert p.build_args["ENGINE_COMMIT"] == (commit or receipt.engine.commit)
        assert p.build_args["ENGINE_COMMIT_PREFIX"] == receipt.engine.commit
    else:
        with pytest.raises(ConfigError) as err:
            resolve_engine(receipt, in_cluster(commit=commit))
        assert err.value.key == "k3:engine.commit"


@pytest.mark.parametrize("commit", ["f68f4fdd", "F68F4FDD" + "0" * 32, "main"])
def test_the_pinned_commit_is_a_full_sha(commit):
    with pytest.raises(ConfigError) as err:
        in_cluster(commit=commit)
    assert err.value.key == "k3:engine.commit"


def test_a_custom_recipe_and_a_plain_http_registry_are_accepted_together(receipt):
    c = cfg(profile="custom", engine={"build": "in-cluster", "registry": REPO,
                                      "registrySecret": "push", "recipeDir": "recipes/tiny",
                                      "buildCpu": 1, "plainHttpRegistries": ["10.0.0.5:5000"]})
    p = resolve_engine(receipt, c)
    assert p.mode == "in-cluster" and not p.measured
    assert (p.build_args["MAX_JOBS"], p.build_args["NVCC_THREADS"]) == ("1", "1")


def test_an_engine_that_is_no_cuda_build_needs_a_recipe_of_its_own(receipt):
    """A receipt whose engine.cuda_arch names no compute capability (a CPU engine): the
    shipped recipe is refused in one line naming the key; a recipe of your own gets the
    build args without TORCH_CUDA_ARCH_LIST."""
    cpu = receipt.model_copy(update={"engine": receipt.engine.model_copy(
        update={"cuda_arch": "none (CPU build)"})})
    engine = {"build": "in-cluster", "registry": REPO, "registrySecret": "push"}
    with pytest.raises(ConfigError) as err:
        resolve_engine(cpu, cfg(profile="custom", engine=engine))
    assert err.value.key == "k3:engine.recipeDir"
    assert "engine.cuda_arch 'none (CPU build)' names no CUDA compute capability" in str(err.value)
    args = resolve_engine(cpu, cfg(profile="custom", engine={**engine, "recipeDir": "r"})).build_args
    assert "TORCH_CUDA_ARCH_LIST" not in args and args["ENGINE_CUDA_ARCH"] == "none (CPU build)"
