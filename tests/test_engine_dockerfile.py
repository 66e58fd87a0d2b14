"""images/Dockerfile, read with BuildKit's own parser (the `dockerfile` package): its
pins, its checked steps and their order, and that receipt values arrive only as
build args (k3infra.engine.plan.build_args)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import dockerfile
import pytest

from k3infra.config import parse_stack_config
from k3infra.receipt import load_receipt
from k3infra.engine import component as ec
from k3infra.engine.plan import (DOCKERFILE_NODE_CPU, DOCKERFILE_NODE_MEMORY_GI,
                                 RECIPE_CUDA_VERSION, build_args, build_parallelism)

from conftest import GOOD_REVISION, ROOT

DOCKERFILE = ROOT / "images" / "Dockerfile"
TEXT = DOCKERFILE.read_text()
CMDS = dockerfile.parse_file(str(DOCKERFILE))


def stages() -> dict[str, list]:
    """stage name -> its instructions (after FROM)."""
    out, name = {}, None
    for c in CMDS:
        if c.cmd == "FROM":
            name = c.value[2] if len(c.value) == 3 else c.value[0]
            out[name] = [c]
        elif name:
            out[name].append(c)
    return out


def global_args() -> dict[str, str | None]:
    out = {}
    for c in CMDS:
        if c.cmd == "FROM":
            break
        if c.cmd == "ARG":
            k, _, v = c.value[0].partition("=")
            out[k] = v if _ else None
    return out


def stage_args(stage: str) -> dict[str, str | None]:
    out = {}
    for c in stages()[stage]:
        if c.cmd == "ARG":
            for item in c.value:
                k, eq, v = item.partition("=")
                out[k] = v if eq else None
    return out


def runs(stage: str) -> list[str]:
    return [" ".join(c.value) for c in stages()[stage] if c.cmd == "RUN"]


def expand(value: str, args: dict) -> str:
    while "${" in value:
        value = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value)
    return value


def plan_args():
    return build_args(__import__("k3infra.receipt", fromlist=["load_receipt"]).load_receipt(),
                      parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "k",
                                          "engineImage": f"r.example.com/v@sha256:{'1' * 64}"}, receipt=load_receipt()))


def test_stages_and_their_order():
    assert list(stages()) == ["uv", "rust", "toolchain", "source", "build", "wheel-export",
                              "runtime-base", "smoke", "runtime"]


def test_base_images_are_exact_tags_never_floating():
    g = global_args()
    bases = [expand(c.value[0], g) for c in CMDS
             if c.cmd == "FROM" and c.value[0] not in stages() and c.value[0] != "scratch"]
    assert bases == ["ghcr.io/astral-sh/uv:0.8.22", "rust:1.90.0-slim-bookworm",
                     f"nvidia/cuda:{RECIPE_CUDA_VERSION}-devel-ubuntu22.04",
                     f"nvidia/cuda:{RECIPE_CUDA_VERSION}-devel-ubuntu22.04"]
    for ref in bases:
        tag = ref.rsplit(":", 1)[1]
        assert re.match(r"^\d+\.\d+\.\d+(-[a-z0-9.]+)*$", tag), ref   # major.minor.patch
        assert "latest" not in ref


def test_the_plan_passes_every_base_image_by_digest_of_the_dockerfiles_tag():
    """Issue 21: base images by digest. The Dockerfile names the tags; the plan's build
    args (k3:engine.baseImages) pin those same tags by digest."""
    g = global_args()
    args = plan_args()
    for arg in ("BUILD_BASE_IMAGE", "RUNTIME_BASE_IMAGE", "UV_IMAGE", "RUST_IMAGE"):
        tag, _, digest = args[arg].partition("@")
        assert tag == expand(g[arg], g), arg
        assert re.match(r"^sha256:[0-9a-f]{64}$", digest), arg


def test_no_curl_pipe_shell_no_mixed_index_strategy_and_every_install_hash_locked():
    code = "\n".join(line for line in TEXT.splitlines() if not line.startswith("#"))
    assert "curl" not in code and "sh.rustup.rs" not in code and "| sh" not in code
    assert "unsafe-best-match" not in TEXT and "UV_INDEX_STRATEGY" not in TEXT
    installs = [r for st in stages() for r in runs(st) if "pip install" in r]
    for run in installs:
        for part in run.split("&&"):
            if "uv pip install" not in part:
                continue
            locked = "--require-hashes" in part and ".lock" in part
            offline = "--offline --no-index" in part
            wheel = "--no-deps /tmp/dist/vllm-" in part
            assert locked or offline or wheel, part
    (req,) = [r for r in runs("build") if "requirements/build.txt" in r]
    assert "--offline --no-index -r requirements/build.txt" in req


def test_cuda_pin_matches_the_plan_and_python_is_exact():
    g = global_args()
    assert g["CUDA_VERSION"] == RECIPE_CUDA_VERSION
    assert re.match(r"^\d+\.\d+\.\d+$", g["PYTHON_VERSION"])


def test_receipt_values_are_build_args_without_defaults(receipt):
    """No receipt literal in the file: each engine pin is an ARG with no default."""
    e = receipt.engine
    for literal in (e.commit, e.version, str(e.pull_request), e.repo, e.repo.split("//", 1)[1],
                    receipt.hardware.compute_capability):
        assert literal not in TEXT, literal
    for stage in ("source", "build", "runtime"):
        for name, default in stage_args(stage).items():
            if name.startswith("ENGINE_") or name in ("TORCH_CUDA_ARCH_LIST", "WHEEL_SHA256"):
                assert default is None, f"{stage}: ARG {name} has a default"


def test_every_plan_build_arg_is_declared_and_used():
    declared = set(global_args())
    for stage in stages():
        declared |= set(stage_args(stage))
    for name in plan_args():
        assert name in declared, name
        assert f"${{{name}}}" in TEXT, f"{name} declared but never used"


def test_parallelism_defaults_fit_the_stated_build_node():
    args = stage_args("build")
    jobs, threads = build_parallelism(DOCKERFILE_NODE_CPU, DOCKERFILE_NODE_MEMORY_GI)
    assert (args["MAX_JOBS"], args["NVCC_THREADS"]) == (str(jobs), str(threads))
    assert f"{DOCKERFILE_NODE_CPU}-vCPU / {DOCKERFILE_NODE_MEMORY_GI} GiB" in TEXT


def test_source_stage_fetches_the_pinned_commit_and_checks_the_prefix():
    (fetch,) = runs("source")
    assert "k3_engine_build.py fetch" in fetch
    for arg in ("--repo-url \"${ENGINE_REPO}\"", "--pr \"${ENGINE_PR}\"",
                "--commit \"${ENGINE_COMMIT}\"", "--expect-prefix \"${ENGINE_COMMIT_PREFIX}\""):
        assert arg in fetch


def test_build_stage_steps_in_order():
    steps = runs("build")

    def index(marker: str) -> int:
        return next(i for i, s in enumerate(steps) if marker in s)

    order = [index("k3_engine_build.py check-arch"), index("requirements/build.txt"),
             index("k3_engine_build.py check-version"), index("k3_engine_build.py exclude"),
             index("setup.py bdist_wheel"), index("k3_engine_build.py wheel-record")]
    assert order == sorted(order)
    build = steps[index("setup.py bdist_wheel")]
    for env in ('MAX_JOBS="${MAX_JOBS}"', 'NVCC_THREADS="${NVCC_THREADS}"',
                'TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}"',
                'SETUPTOOLS_SCM_PRETEND_VERSION="${ENGINE_VERSION}"', "VLLM_TARGET_DEVICE=cuda"):
        assert env in build
    assert '--names "${ENGINE_EXCLUDE}"' in steps[index("k3_engine_build.py exclude")]
    assert "--nvcc /usr/local/cuda/bin/nvcc" in steps[index("k3_engine_build.py check-arch")]


def test_sccache_is_optional_pinned_and_secret_fed():
    args = stage_args("build")
    assert args["USE_SCCACHE"] == "0"
    assert re.match(r"^\d+\.\d+\.\d+$", args["SCCACHE_VERSION"])
    build = next(c for c in stages()["build"] if c.cmd == "RUN" and "bdist_wheel" in " ".join(c.value))
    assert "--mount=type=secret,id=sccache,required=false" in build.flags


def test_smoke_stage_checks_the_installed_engine_and_gates_the_runtime():
    (smoke,) = runs("smoke")
    assert "k3_engine_build.py smoke" in smoke
    assert '--expect-version "${ENGINE_VERSION}"' in smoke
    assert '--exclude "${ENGINE_EXCLUDE}"' in smoke
    runtime = stages()["runtime"]
    assert any(c.cmd == "COPY" and "--from=smoke" in c.flags for c in runtime)


def test_runtime_labels_entrypoint_and_record():
    runtime = stages()["runtime"]
    (label,) = [c for c in runtime if c.cmd == "LABEL"]
    labels = {k: v.strip('"') for k, v in zip(label.value[::2], label.value[1::2])}
    assert labels["dev.k3infra.engine.commit"] == "${ENGINE_COMMIT_FULL}"
    assert labels["org.opencontainers.image.revision"] == "${ENGINE_COMMIT_FULL}"
    assert labels["dev.k3infra.engine.vllm-version"] == "${ENGINE_VERSION}"
    assert labels["dev.k3infra.engine.wheel-sha256"] == "${WHEEL_SHA256}"
    assert labels["dev.k3infra.engine.excluded"] == "${ENGINE_EXCLUDE}"
    (verify,) = runs("runtime")
    assert "verify-labels" in verify and '--wheel-sha256 "${WHEEL_SHA256}"' in verify
    (entry,) = [c for c in runtime if c.cmd == "ENTRYPOINT"]
    assert entry.json and list(entry.value) == ["vllm", "serve"]
    (user,) = [c for c in runtime if c.cmd == "USER"]
    assert not user.value[0].startswith("0")
    base = " ".join(" ".join(c.value) for c in stages()["runtime-base"])
    assert "/usr/share/k3-engine/" in base          # engine-wheel.json: sha256 + version


def test_wheel_export_stage_carries_the_wheel_and_its_record():
    copies = [c for c in stages()["wheel-export"] if c.cmd == "COPY"]
    assert [c.value for c in copies] == [("/dist/", "/"), ("/k3-engine/", "/")]


def test_the_configmap_context_holds_every_file_the_dockerfile_copies():
    copied = {v for c in CMDS if c.cmd == "COPY" and not any(
        f.startswith("--from") for f in c.flags) for v in c.value[:-1]}
    assert copied <= set(ec.RECIPE_FILES)
    shipped = set(ec.RECIPE_FILES) - set(ec.LOCK_FILES)     # locks: compiled per commit
    assert shipped <= {p.name for p in (ROOT / "images").iterdir()}


def test_hadolint_passes():
    hadolint = Path(sys.executable).parent / "hadolint"
    r = subprocess.run([str(hadolint), "--config", str(ROOT / "images" / ".hadolint.yaml"),
                        "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", ["build.sh"])
def test_build_job_script_passes_shellcheck(name):
    shellcheck = Path(sys.executable).parent / "shellcheck"
    script = ROOT / "k3infra" / "engine" / "pod" / name
    r = subprocess.run([str(shellcheck), "-s", "sh", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
