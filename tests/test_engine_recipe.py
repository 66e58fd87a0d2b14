"""The checked steps of images/Dockerfile (images/k3_engine_build.py), run for real
against small local Git repositories, source trees and wheels built here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "images" / "k3_engine_build.py"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def step(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env or GIT_ENV, cwd=cwd)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=GIT_ENV).stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> dict:
    """A bare 'vLLM' remote: main with a tag, a pull request ref whose head is the
    pinned commit, and a commit only on a branch."""
    work = tmp_path_factory.mktemp("work")
    git(work, "init", "-q", "-b", "main")
    (work / "pyproject.toml").write_text("[project]\nname = 'vllm'\ndynamic = ['version']\n")
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "root")
    git(work, "tag", "v0.1.0")
    for i in range(2):
        (work / f"f{i}").write_text(str(i))
        git(work, "add", ".")
        git(work, "commit", "-q", "-m", f"c{i}")
    pr_head = git(work, "rev-parse", "HEAD")
    git(work, "checkout", "-q", "-b", "side")
    (work / "side").write_text("s")
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "side")
    side = git(work, "rev-parse", "HEAD")
    bare = tmp_path_factory.mktemp("remote") / "vllm.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, env=GIT_ENV)
    git(bare, "update-ref", "refs/pull/7/head", pr_head)
    git(bare, "config", "uploadpack.allowFilter", "true")
    return {"url": f"file://{bare}", "pr_head": pr_head, "side": side}


def fetch(upstream: dict, commit: str, dest: Path, prefix: str | None = None,
          *extra: str) -> subprocess.CompletedProcess:
    return step("fetch", "--repo-url", upstream["url"], "--pr", "7", "--commit", commit,
                "--expect-prefix", prefix if prefix is not None else commit[:8],
                "--dest", str(dest), *extra)


def test_fetch_checks_out_the_pinned_full_commit(upstream, tmp_path):
    full = upstream["pr_head"]
    r = fetch(upstream, full, tmp_path / "src", None, "--record", str(tmp_path / "commit"))
    assert r.returncode == 0, r.stderr
    assert git(tmp_path / "src", "rev-parse", "HEAD") == full
    assert (tmp_path / "commit").read_text().strip() == full
    # full history and tags: the version number can be derived
    assert git(tmp_path / "src", "describe", "--tags", "--long").startswith("v0.1.0-2-g")


def test_fetch_gets_a_pinned_commit_that_left_the_pull_request(upstream, tmp_path):
    r = fetch(upstream, upstream["side"], tmp_path / "src")
    assert r.returncode == 0, r.stderr
    assert git(tmp_path / "src", "rev-parse", "HEAD") == upstream["side"]


@pytest.mark.parametrize("commit", ["f68f4fdd", "f68f4fdde", "abcdef1"])
def test_fetch_never_resolves_a_prefix(upstream, commit, tmp_path):
    """Issue 21: a build picked its source by an 8-hex prefix in a ref its author moves."""
    r = fetch(upstream, commit, tmp_path / "src", commit)
    assert r.returncode == 2 and "full 40-hex commit" in r.stderr
    assert not (tmp_path / "src").exists()


def test_fetch_refuses_a_full_commit_that_is_not_the_receipts(upstream, tmp_path):
    """A commit whose SHA does not start with the receipt's prefix is another engine,
    even when it is the pull request's head now."""
    r = fetch(upstream, upstream["pr_head"], tmp_path / "src", upstream["side"][:8])
    assert r.returncode == 1 and "does not start with the receipt's" in r.stderr


def test_fetch_refuses_a_commit_the_remote_does_not_have(upstream, tmp_path):
    absent = "0" * 40
    r = fetch(upstream, absent, tmp_path / "src", "00000000")
    assert r.returncode == 1 and f"commit {absent} is not in pull request 7" in r.stderr


def test_resolve_turns_the_prefix_into_the_full_commit_once(upstream, tmp_path):
    short = upstream["pr_head"][:8]
    r = step("resolve", "--repo-url", upstream["url"], "--pr", "7", "--commit", short,
             "--dest", str(tmp_path / "resolve"))
    assert r.returncode == 0, r.stderr
    full, about = r.stdout.split("\t", 1)
    assert full == upstream["pr_head"] and "found in pull request 7" in about and "t <t@" in about


def test_resolve_falls_back_to_branches_and_says_so(upstream, tmp_path):
    r = step("resolve", "--repo-url", upstream["url"], "--pr", "7",
             "--commit", upstream["side"][:10], "--dest", str(tmp_path / "resolve"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(upstream["side"]) and "found in a branch" in r.stdout


def test_resolve_refuses_a_prefix_no_commit_has(upstream, tmp_path):
    absent = "0123456" if not upstream["pr_head"].startswith("0123456") else "7654321"
    r = step("resolve", "--repo-url", upstream["url"], "--pr", "7", "--commit", absent,
             "--dest", str(tmp_path / "resolve"))
    assert r.returncode == 1
    assert f"no commit starting with {absent}" in r.stderr


@pytest.mark.parametrize("commit", ["", "f68f4f", "F68F4FDD", "f68f4fdz", "main"])
def test_resolve_refuses_a_missing_short_or_non_hex_commit(commit, tmp_path):
    r = step("resolve", "--repo-url", "file:///nonexistent", "--pr", "7", "--commit", commit,
             "--dest", str(tmp_path / "src"))
    assert r.returncode == 2


def test_fetch_refuses_missing_repo_or_pr(tmp_path):
    full = "abcdef12" * 5
    assert step("fetch", "--pr", "7", "--commit", full, "--expect-prefix", "abcdef12",
                "--dest", str(tmp_path)).returncode == 2
    assert step("fetch", "--repo-url", "file:///x", "--commit", full, "--expect-prefix",
                "abcdef12", "--dest", str(tmp_path)).returncode == 2


@pytest.mark.parametrize("cuda, arch_list, ok", [
    ("13.0.2", "10.0", True),          # the recipe: the 10.0 family runs on 10.3
    ("13.0.2", "10.3", True),
    ("13.0.2", "10.0a", False),        # arch-specific 10.0a does not run on 10.3
    ("13.0.2", "9.0;12.0", False),
    ("12.9.1", "10.0", False),         # 12.9 has no family target: must name 10.3
    ("12.9.1", "10.0;10.3", True),
    ("12.9.1", "10.3a", True),
])
def test_check_arch(cuda, arch_list, ok):
    r = step("check-arch", "--capability", "10.3", "--arch-list", arch_list, "--cuda-version", cuda)
    assert (r.returncode == 0) is ok, r.stderr


def test_check_arch_refuses_empty_args():
    r = step("check-arch", "--capability", "", "--arch-list", "10.0", "--cuda-version", "13.0.2")
    assert r.returncode == 2 and "ENGINE_CUDA_ARCH" in r.stderr


def test_check_arch_compares_nvcc_with_the_pin(tmp_path):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.9, V12.9.86'\n")
    nvcc.chmod(0o755)
    r = step("check-arch", "--capability", "10.3", "--arch-list", "10.0",
             "--cuda-version", "13.0.2", "--nvcc", str(nvcc))
    assert r.returncode == 1 and "nvcc is CUDA 12.9" in r.stderr


def vllm_tree(root: Path, main_cuda: str = "13.0") -> Path:
    """A git checkout shaped like vLLM where it matters: envs.py's main CUDA,
    CMakeLists.txt including the FlashKDA external project."""
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "envs.py").write_text(
        'import os\nenvironment_variables = {\n'
        '    "VLLM_MAIN_CUDA_VERSION": lambda: (\n'
        f'        os.getenv("VLLM_MAIN_CUDA_VERSION", "").lower() or "{main_cuda}"\n    ),\n}}\n')
    (root / "cmake" / "external_projects").mkdir(parents=True)
    (root / "cmake" / "external_projects" / "flashkda.cmake").write_text(
        "FetchContent_MakeAvailable(flashkda)\ndefine_extension_target(_flashkda_C)\n")
    (root / "CMakeLists.txt").write_text(
        "project(vllm_extensions)\ninclude(cmake/external_projects/flashkda.cmake)\n")
    (root / "pyproject.toml").write_text("[project]\nname='vllm'\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "root")
    git(root, "tag", "v0.23.0")
    (root / "x").write_text("x")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "next")
    return root


def test_check_version_accepts_the_pristine_checkouts_version(tmp_path):
    src = vllm_tree(tmp_path / "vllm")
    sha = git(src, "rev-parse", "--short=9", "HEAD")
    expect = f"0.23.1.dev1+g{sha}"
    r = step("check-version", "--src", str(src), "--expect", expect, "--cuda-version", "13.0.2")
    assert r.returncode == 0, r.stderr


def test_check_version_refuses_another_version(tmp_path):
    src = vllm_tree(tmp_path / "vllm")
    r = step("check-version", "--src", str(src), "--expect", "0.23.1rc1.dev1475+gf68f4fdde",
             "--cuda-version", "13.0.2")
    assert r.returncode == 1 and "the checkout's version is 0.23.1.dev1+g" in r.stderr


def test_check_version_refuses_a_cuda_that_would_suffix_the_version(tmp_path):
    src = vllm_tree(tmp_path / "vllm", main_cuda="12.9")
    sha = git(src, "rev-parse", "--short=9", "HEAD")
    r = step("check-version", "--src", str(src), "--expect", f"0.23.1.dev1+g{sha}",
             "--cuda-version", "13.0.2")
    assert r.returncode == 1 and "main CUDA at this commit is 12.9" in r.stderr


def test_exclude_flashkda_leaves_an_empty_target(tmp_path):
    src = vllm_tree(tmp_path / "vllm")
    r = step("exclude", "--src", str(src), "--names", "FlashKDA")
    assert r.returncode == 0, r.stderr
    text = (src / "cmake" / "external_projects" / "flashkda.cmake").read_text()
    assert "add_custom_target(_flashkda_C)" in text
    assert "FetchContent" not in text and "define_extension_target" not in text


def test_exclude_refuses_when_the_switch_moved(tmp_path):
    src = vllm_tree(tmp_path / "vllm")
    (src / "cmake" / "external_projects" / "flashkda.cmake").unlink()
    r = step("exclude", "--src", str(src), "--names", "FlashKDA")
    assert r.returncode == 1 and "flashkda.cmake not found" in r.stderr
    src2 = vllm_tree(tmp_path / "vllm2")
    (src2 / "CMakeLists.txt").write_text("project(vllm_extensions)\n")
    r = step("exclude", "--src", str(src2), "--names", "FlashKDA")
    assert r.returncode == 1 and "does not include" in r.stderr


def test_exclude_refuses_an_unknown_extension(tmp_path):
    src = vllm_tree(tmp_path / "vllm")
    r = step("exclude", "--src", str(src), "--names", "FlashKDA,FlashMLA")
    assert r.returncode == 2 and "no known exclusion" in r.stderr


VERSION = "0.23.1rc1.dev1475+gf68f4fdde"
COMMIT = "f68f4fdd" + "1" * 32


def wheel(dist: Path, version: str = VERSION, members: tuple = ("vllm/_C.abi3.so",)) -> Path:
    dist.mkdir(parents=True, exist_ok=True)
    path = dist / f"vllm-{version}-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"vllm-{version}.dist-info/METADATA", f"Name: vllm\nVersion: {version}\n")
        z.writestr("vllm/__init__.py", "")
        for m in members:
            z.writestr(m, b"\x7fELF")
    return path


def test_wheel_record_writes_sha256_and_version(tmp_path):
    path = wheel(tmp_path / "dist")
    r = step("wheel-record", "--dist", str(tmp_path / "dist"), "--expect-version", VERSION,
             "--commit", COMMIT, "--exclude", "FlashKDA", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "out" / "engine-wheel.json").read_text())
    import hashlib
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["version"] == VERSION and record["engine_commit"] == COMMIT
    env = (tmp_path / "out" / "engine-wheel.env").read_text()
    assert f"WHEEL_SHA256={record['sha256']}\n" in env
    assert f"ENGINE_COMMIT_FULL={COMMIT}\n" in env


@pytest.mark.parametrize("kwargs, message", [
    ({"version": "0.23.1rc1.dev1475+gf68f4fdde.cu130"}, "the receipt's is"),
    ({"members": ("vllm/_C.abi3.so", "vllm/_flashkda_C.abi3.so")}, "excluded extensions"),
    ({"members": ("vllm/_moe_C.abi3.so",)}, "no compiled vllm/_C"),
])
def test_wheel_record_refuses(kwargs, message, tmp_path):
    wheel(tmp_path / "dist", **kwargs)
    r = step("wheel-record", "--dist", str(tmp_path / "dist"), "--expect-version", VERSION,
             "--commit", COMMIT, "--exclude", "FlashKDA", "--out", str(tmp_path / "out"))
    assert r.returncode == 1 and message in r.stderr


def test_wheel_record_refuses_two_wheels_or_a_short_commit(tmp_path):
    wheel(tmp_path / "dist")
    wheel(tmp_path / "dist", version="0.1.0")
    r = step("wheel-record", "--dist", str(tmp_path / "dist"), "--expect-version", VERSION,
             "--commit", COMMIT, "--out", str(tmp_path / "out"))
    assert r.returncode == 1 and "expected one vllm wheel" in r.stderr
    r = step("wheel-record", "--dist", str(tmp_path / "dist"), "--expect-version", VERSION,
             "--commit", "f68f4fdd", "--out", str(tmp_path / "out"))
    assert r.returncode == 2


def record_file(tmp_path: Path, sha: str = "ab" * 32) -> Path:
    p = tmp_path / "engine-wheel.json"
    p.write_text(json.dumps({"sha256": sha, "engine_commit": COMMIT, "version": VERSION,
                             "wheel": "vllm.whl"}))
    return p


def test_verify_labels(tmp_path):
    rec = record_file(tmp_path)
    ok = step("verify-labels", "--record", str(rec), "--wheel-sha256", "ab" * 32,
              "--engine-commit-full", COMMIT)
    assert ok.returncode == 0, ok.stderr
    stale = step("verify-labels", "--record", str(rec), "--wheel-sha256", "cd" * 32,
                 "--engine-commit-full", COMMIT)
    assert stale.returncode == 1 and "rebuilt" in stale.stderr
    missing = step("verify-labels", "--record", str(rec))
    assert missing.returncode == 2 and "wheel-export target first" in missing.stderr


def fake_vllm(site: Path, version: str = VERSION, extra: tuple = (),
              pandas: bool = True, obstore: bool = True) -> Path:
    pkg = site / "vllm"
    pkg.mkdir(parents=True)
    for name, wanted in (("pandas", pandas),      # the benchmark Job's `vllm bench serve`
                         ("obstore", obstore)):   # the weights prefetch from a store
        if wanted:
            (site / name).mkdir()
            (site / name / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (pkg / "_C.abi3.so").write_bytes(b"")
    for name in extra:
        (pkg / name).write_bytes(b"")
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return site


def smoke(site: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**GIT_ENV, "PYTHONPATH": str(site)}
    return step("smoke", "--expect-version", VERSION, "--exclude", "FlashKDA",
                "--record", str(record_file(tmp_path)), "--out", str(tmp_path / "smoke.json"),
                env=env, cwd=tmp_path)


def test_smoke_imports_the_engine_and_checks_version_and_exclusion(tmp_path):
    r = smoke(fake_vllm(tmp_path / "site"), tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "smoke.json").read_text())
    assert out["vllm"] == VERSION and out["excluded_absent"] == ["vllm._flashkda_C"]


def test_smoke_refuses_another_version(tmp_path):
    r = smoke(fake_vllm(tmp_path / "site", version="0.33.0"), tmp_path)
    assert r.returncode == 1 and "the receipt's is" in r.stderr


def test_smoke_refuses_an_image_without_pandas(tmp_path):
    r = smoke(fake_vllm(tmp_path / "site", pandas=False), tmp_path)
    assert r.returncode == 1 and "pandas is not installed" in r.stderr


def test_smoke_refuses_an_image_without_obstore(tmp_path):
    site = fake_vllm(tmp_path / "site", obstore=False)
    # -S: without site-packages, so this venv's own obstore is not found either.
    r = subprocess.run([sys.executable, "-S", str(SCRIPT), "smoke", "--expect-version", VERSION,
                        "--exclude", "FlashKDA", "--record", str(record_file(tmp_path)),
                        "--out", str(tmp_path / "smoke.json")], capture_output=True, text=True,
                       env={**GIT_ENV, "PYTHONPATH": str(site)}, cwd=tmp_path)
    assert r.returncode == 1 and "obstore is not installed" in r.stderr, r.stderr


def test_smoke_refuses_an_installed_flashkda(tmp_path):
    r = smoke(fake_vllm(tmp_path / "site", extra=("_flashkda_C.abi3.so",)), tmp_path)
    assert r.returncode == 1 and "vllm._flashkda_C is installed" in r.stderr
