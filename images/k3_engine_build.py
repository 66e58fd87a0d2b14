#!/usr/bin/env python3
"""The checked steps of images/Dockerfile, one subcommand each (standard library only).

Every step that decides what gets built refuses instead of guessing:
  resolve         once, by the operator: the receipt's short commit -> the full SHA to pin
  fetch           clone vLLM at the pinned full SHA (k3:engine.commit), check out
  check-arch      TORCH_CUDA_ARCH_LIST must run on the receipt's compute capability
  check-version   the pristine checkout's setuptools_scm version must be the receipt's
  exclude         disable an in-tree extension named in the receipt (FlashKDA)
  wheel-record    the wheel: one file, the receipt's version, no excluded artifact; SHA-256
  verify-labels   the label build args must equal the wheel record
  smoke           the installed engine imports with the receipt's version, without FlashKDA

Exit status 0 on success, 1 when a check fails, 2 on bad arguments; the reason is one
line on stderr starting with `k3-engine:`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

SHORT_SHA = re.compile(r"^[0-9a-f]{7,40}$")
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
RECORD = "engine-wheel.json"
RECORD_ENV = "engine-wheel.env"


class CheckFailed(Exception):
    """A check refused the build."""


class BadArgument(Exception):
    """A required build argument is missing or malformed."""


# --- extensions the receipt may exclude ------------------------------------------------
#
# vLLM builds each optional CUDA extension from a cmake/external_projects/<name>.cmake
# file included by CMakeLists.txt; when no requested architecture fits, that file
# declares an empty target instead (`add_custom_target(<target>)`), and setup.py and the
# install step cope with the empty target. Excluding an extension replaces the file with
# exactly that empty branch, so the rest of the build behaves as on an unsupported GPU.
# The checks fail if the file, its include or its target are not where this expects
# them: then the switch moved at this commit and the recipe needs a human look.
EXCLUSIONS = {
    "flashkda": {
        "name": "FlashKDA",
        "cmake": "cmake/external_projects/flashkda.cmake",
        "target": "_flashkda_C",
        "module": "vllm._flashkda_C",
    },
}


def exclusion(name: str) -> dict:
    known = EXCLUSIONS.get(name.strip().lower())
    if known is None:
        raise BadArgument(f"ENGINE_EXCLUDE names {name!r}: no known exclusion "
                          f"(known: {', '.join(e['name'] for e in EXCLUSIONS.values())})")
    return known


def exclusions(names: str) -> list[dict]:
    return [exclusion(n) for n in names.split(",") if n.strip()]


def stub_cmake(excl: dict) -> str:
    return (f"# {excl['name']} excluded by k3infra (images/k3_engine_build.py exclude): the\n"
            f"# receipt's engine was built without it. Same branch vLLM takes when no\n"
            f"# architecture fits: an empty target, nothing compiled or installed.\n"
            f"message(STATUS \"{excl['name']} excluded by k3infra: {excl['target']} is empty\")\n"
            f"add_custom_target({excl['target']})\n")


# --- fetch ------------------------------------------------------------------------------

def git(repo: Path, *args: str, capture: bool = False) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], check=False, text=True,
                          stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise CheckFailed(f"git {' '.join(args)} failed: {last}")
    return (proc.stdout or "").strip()


def resolve(repo: Path, short: str) -> str | None:
    """Full SHA of the one commit whose SHA starts with `short`, or None if no object
    has that prefix. An ambiguous prefix is an error (git refuses, so do we)."""
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet",
                           f"{short}^{{commit}}"], text=True, capture_output=True)
    if proc.returncode != 0:
        if "ambiguous" in proc.stderr:
            raise CheckFailed(f"commit prefix {short} is ambiguous in {repo}")
        return None
    return proc.stdout.strip()


def _check_source_args(a: argparse.Namespace) -> None:
    if not (a.repo_url or "").strip():
        raise BadArgument("ENGINE_REPO is empty: the engine's Git URL (from the receipt)")
    if not (a.pr or "").isdigit():
        raise BadArgument(f"ENGINE_PR={a.pr!r}: the pull request number (from the receipt)")


def _fetch_history(dest: Path, a: argparse.Namespace) -> None:
    """Blobless: full commit history and tags (setuptools_scm counts commits since the
    last tag to form the version), file contents only for the checkout."""
    dest.mkdir(parents=True, exist_ok=True)
    git(dest, "init", "--quiet")
    git(dest, "remote", "add", "origin", a.repo_url)
    git(dest, "fetch", "--quiet", "--filter=blob:none", "--tags", "origin",
        f"+refs/pull/{a.pr}/head:refs/remotes/origin/pr-{a.pr}")


def _has_commit(repo: Path, sha: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{sha}^{{commit}}"],
                          capture_output=True).returncode == 0


def cmd_resolve(a: argparse.Namespace) -> None:
    """The one step that reads a prefix: the operator runs it once, checks the commit it
    prints (author, date, subject, on the pull request page) and pins the full SHA as
    k3:engine.commit. Builds never resolve: the pull request ref is its author's to move,
    and a prefix of 8 hex digits is within reach of a made-up colliding commit."""
    if not SHORT_SHA.match(a.commit or ""):
        raise BadArgument(f"--commit {a.commit!r}: 7 to 40 lowercase hex characters")
    _check_source_args(a)
    dest = Path(a.dest)
    _fetch_history(dest, a)
    full = resolve(dest, a.commit)
    where = f"pull request {a.pr}"
    if full is None:
        git(dest, "fetch", "--quiet", "--filter=blob:none", "--tags", "origin",
            "+refs/heads/*:refs/remotes/origin/*")
        full, where = resolve(dest, a.commit), "a branch"
    if full is None:
        raise CheckFailed(f"no commit starting with {a.commit} in pull request {a.pr} or any "
                          f"branch of {a.repo_url}")
    if not (FULL_SHA.match(full) and full.startswith(a.commit)):
        raise CheckFailed(f"resolved {a.commit} to {full!r}, which does not start with it")
    about = git(dest, "show", "-s", "--format=%an <%ae> %aI %s", full, capture=True)
    print(f"{full}\tfound in {where}: {about}")


def cmd_fetch(a: argparse.Namespace) -> None:
    if not FULL_SHA.match(a.commit or ""):
        raise BadArgument(f"ENGINE_COMMIT={a.commit!r}: the full 40-hex commit (k3:engine.commit; "
                          "`k3_engine_build.py resolve` turns the receipt's short SHA into it "
                          "once, docs/engine.md)")
    if not SHORT_SHA.match(a.expect_prefix or ""):
        raise BadArgument(f"ENGINE_COMMIT_PREFIX={a.expect_prefix!r}: the receipt's short commit")
    if not a.commit.startswith(a.expect_prefix):
        raise CheckFailed(f"ENGINE_COMMIT {a.commit} does not start with the receipt's "
                          f"{a.expect_prefix}: not the measured engine")
    _check_source_args(a)
    dest = Path(a.dest)
    _fetch_history(dest, a)
    if not _has_commit(dest, a.commit):
        # Left the pull request (force-push, merge): ask for the exact object.
        proc = subprocess.run(["git", "-C", str(dest), "fetch", "--quiet", "--filter=blob:none",
                               "origin", a.commit], capture_output=True, text=True)
        if proc.returncode != 0 or not _has_commit(dest, a.commit):
            raise CheckFailed(f"commit {a.commit} is not in pull request {a.pr} of {a.repo_url} "
                              "and the remote does not serve it")
    git(dest, "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", a.commit)
    head = git(dest, "rev-parse", "HEAD", capture=True)
    if head != a.commit:
        raise CheckFailed(f"checked out {head}, expected {a.commit}")
    if a.record:
        Path(a.record).write_text(a.commit + "\n")
    print(f"k3-engine: {a.repo_url} pull/{a.pr}: {a.commit}")


# --- architecture -----------------------------------------------------------------------

def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def nvcc_release(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], check=True, text=True, capture_output=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    if not m:
        raise CheckFailed(f"cannot read the CUDA release from `{nvcc} --version`")
    return m.group(1)


def arch_covers(arch_list: str, cuda_version: str, capability: str) -> bool:
    """Does a TORCH_CUDA_ARCH_LIST produce code that runs on `capability`?

    CUDA >= 13: an entry of the same major and a minor not above it (sm_100 SASS runs on
    10.3; vLLM builds its arch-specific kernels for the 10.0f family). CUDA 12.x has no
    family targets for Blackwell, so the exact capability must be listed.
    """
    entries = [e for e in re.split(r"[;\s]+", arch_list.strip()) if e]
    major, minor = (int(x) for x in capability.split("."))
    for entry in entries:
        m = re.match(r"^(\d+)\.(\d+)(a|f)?(\+PTX)?$", entry)
        if not m:
            raise BadArgument(f"TORCH_CUDA_ARCH_LIST entry {entry!r} is not N.N[a][+PTX]")
        e_major, e_minor, suffix = int(m.group(1)), int(m.group(2)), m.group(3)
        if _version_tuple(cuda_version) >= (13,):
            if e_major == major and e_minor <= minor and suffix != "a":
                return True
            if e_major == major and e_minor == minor:
                return True
        elif (e_major, e_minor) == (major, minor):
            return True
    return False


def cmd_check_arch(a: argparse.Namespace) -> None:
    for name, value in (("ENGINE_CUDA_ARCH", a.capability), ("TORCH_CUDA_ARCH_LIST", a.arch_list),
                        ("CUDA_VERSION", a.cuda_version)):
        if not (value or "").strip():
            raise BadArgument(f"{name} is empty (from k3infra.engine.plan.build_args)")
    if not re.match(r"^\d+\.\d+$", a.capability):
        raise BadArgument(f"ENGINE_CUDA_ARCH={a.capability!r}: <major>.<minor>")
    if a.nvcc:
        release = nvcc_release(a.nvcc)
        if _version_tuple(release)[:2] != _version_tuple(a.cuda_version)[:2]:
            raise CheckFailed(f"nvcc is CUDA {release}, the recipe pins {a.cuda_version}")
    if not arch_covers(a.arch_list, a.cuda_version, a.capability):
        raise CheckFailed(f"TORCH_CUDA_ARCH_LIST={a.arch_list!r} does not run on compute "
                          f"capability {a.capability} with CUDA {a.cuda_version}")
    print(f"k3-engine: TORCH_CUDA_ARCH_LIST={a.arch_list} covers {a.capability} "
          f"(CUDA {a.cuda_version})")


# --- version ----------------------------------------------------------------------------

def scm_version(src: Path, python: str) -> str:
    """The version setup.py derives (setuptools_scm.get_version, as vLLM calls it)."""
    proc = subprocess.run([python, "-c", "from setuptools_scm import get_version; "
                           "print(get_version())"], cwd=src, text=True, capture_output=True)
    if proc.returncode != 0:
        raise CheckFailed(f"setuptools_scm failed in {src}: {proc.stderr.strip()[-300:]}")
    return proc.stdout.strip().splitlines()[-1]


def main_cuda_version(src: Path) -> str | None:
    """VLLM_MAIN_CUDA_VERSION's default in vllm/envs.py: a wheel built with any other
    CUDA gets a `.cuXYZ` local suffix, and its version is no longer the receipt's."""
    envs = src / "vllm" / "envs.py"
    if not envs.is_file():
        return None
    m = re.search(r'"VLLM_MAIN_CUDA_VERSION"\s*:\s*lambda\s*:\s*\(?\s*os\.getenv\('
                  r'"VLLM_MAIN_CUDA_VERSION",\s*""\)\.lower\(\)\s*or\s*"([0-9.]+)"', envs.read_text())
    return m.group(1) if m else None


def cmd_check_version(a: argparse.Namespace) -> None:
    if not (a.expect or "").strip():
        raise BadArgument("ENGINE_VERSION is empty (the receipt's vLLM version string)")
    src = Path(a.src)
    # Git abbreviates the `+g<sha>` node to a length that grows with the object count, so
    # a blobless clone can print fewer digits than the full clone the receipt's build
    # had. Use the receipt's length; the digits themselves still come from HEAD.
    node = re.search(r"\+g([0-9a-f]{4,40})", a.expect)
    if node:
        git(src, "config", "core.abbrev", str(len(node.group(1))))
    found = scm_version(src, a.python)
    if found != a.expect:
        raise CheckFailed(f"the checkout's version is {found}, the receipt's is {a.expect} "
                          "(incomplete history or tags, or a modified tree)")
    main = main_cuda_version(src)
    if main is None:
        print("k3-engine: VLLM_MAIN_CUDA_VERSION default not found in vllm/envs.py; the "
              "wheel-record step still checks the final version", file=sys.stderr)
    elif _version_tuple(main)[:2] != _version_tuple(a.cuda_version)[:2]:
        raise CheckFailed(f"vLLM's main CUDA at this commit is {main}, the recipe's is "
                          f"{a.cuda_version}: the wheel version would gain a CUDA suffix and "
                          f"differ from {a.expect}")
    print(f"k3-engine: version {found} (main CUDA {main or 'unknown'})")


# --- exclude ----------------------------------------------------------------------------

def cmd_exclude(a: argparse.Namespace) -> None:
    src = Path(a.src)
    lists = (src / "CMakeLists.txt").read_text()
    for excl in exclusions(a.names):
        cmake = src / excl["cmake"]
        if not cmake.is_file():
            raise CheckFailed(f"{excl['name']}: {excl['cmake']} not found at this commit: the "
                              "exclusion switch moved, the recipe needs updating")
        if not re.search(r"include\(\s*(\$\{CMAKE_CURRENT_LIST_DIR\}/)?"
                         + re.escape(excl["cmake"]) + r"\s*\)", lists):
            raise CheckFailed(f"{excl['name']}: CMakeLists.txt does not include {excl['cmake']}")
        if excl["target"] not in cmake.read_text():
            raise CheckFailed(f"{excl['name']}: {excl['cmake']} does not define {excl['target']}")
        cmake.write_text(stub_cmake(excl))
        print(f"k3-engine: excluded {excl['name']} ({excl['cmake']} -> empty {excl['target']})")


# --- wheel ------------------------------------------------------------------------------

def wheel_version(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        meta = [n for n in z.namelist() if re.match(r"^[^/]+\.dist-info/METADATA$", n)]
        if len(meta) != 1:
            raise CheckFailed(f"{wheel.name}: expected one dist-info/METADATA, found {len(meta)}")
        for line in z.read(meta[0]).decode().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    raise CheckFailed(f"{wheel.name}: METADATA has no Version")


def excluded_members(wheel: Path, excls: list[dict]) -> list[str]:
    names = zipfile.ZipFile(wheel).namelist()
    hits = []
    for excl in excls:
        stem = excl["module"].replace(".", "/")
        hits += [n for n in names if n.startswith(stem) and n.endswith(".so")]
    return hits


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cmd_wheel_record(a: argparse.Namespace) -> None:
    if not FULL_SHA.match(a.commit or ""):
        raise BadArgument(f"engine commit {a.commit!r} is not a resolved 40-hex SHA")
    wheels = sorted(Path(a.dist).glob("vllm-*.whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"expected one vllm wheel in {a.dist}, found {[w.name for w in wheels]}")
    wheel = wheels[0]
    version = wheel_version(wheel)
    if version != a.expect_version:
        raise CheckFailed(f"{wheel.name} has version {version}, the receipt's is {a.expect_version}")
    excls = exclusions(a.exclude)
    hits = excluded_members(wheel, excls)
    if hits:
        raise CheckFailed(f"{wheel.name} contains excluded extensions: {hits}")
    if not any(re.match(r"^vllm/_C\w*\..*so$", n) for n in zipfile.ZipFile(wheel).namelist()):
        raise CheckFailed(f"{wheel.name} has no compiled vllm/_C extension: not a CUDA build")
    record = {"wheel": wheel.name, "sha256": sha256_file(wheel), "version": version,
              "engine_commit": a.commit, "excluded": [e["name"] for e in excls],
              "cuda_version": a.cuda_version, "torch_cuda_arch_list": a.arch_list}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    # Shell-readable copy for the build Job, which has no JSON parser.
    (out / RECORD_ENV).write_text(
        f"WHEEL_FILE={record['wheel']}\nWHEEL_SHA256={record['sha256']}\n"
        f"ENGINE_COMMIT_FULL={record['engine_commit']}\nENGINE_VERSION={record['version']}\n")
    print(f"k3-engine: {wheel.name} sha256 {record['sha256']}")


def load_record(path: str) -> dict:
    record = json.loads(Path(path).read_text())
    if not SHA256.match(record.get("sha256", "")):
        raise CheckFailed(f"{path}: no wheel sha256")
    return record


def cmd_verify_labels(a: argparse.Namespace) -> None:
    record = load_record(a.record)
    if not a.wheel_sha256 or not a.engine_commit_full:
        raise BadArgument("WHEEL_SHA256 and ENGINE_COMMIT_FULL are required for the runtime "
                          "target: build the wheel-export target first and pass its "
                          f"{RECORD_ENV} values (docs/engine.md)")
    for arg, key in ((a.wheel_sha256, "sha256"), (a.engine_commit_full, "engine_commit")):
        if arg != record[key]:
            raise CheckFailed(f"label value {arg} differs from the wheel record's {key} "
                              f"{record[key]}: the wheel was rebuilt since the record was read")
    print(f"k3-engine: labels match the wheel record ({record['sha256']})")


# --- smoke ------------------------------------------------------------------------------

def cmd_smoke(a: argparse.Namespace) -> None:
    import importlib.metadata
    import importlib.util

    import vllm  # noqa: F401  (the import itself is part of the check)

    found = {"vllm.__version__": vllm.__version__,
             "distribution": importlib.metadata.version("vllm")}
    for what, version in found.items():
        if version != a.expect_version:
            raise CheckFailed(f"{what} is {version}, the receipt's is {a.expect_version}")
    record = load_record(a.record)
    if record["version"] != a.expect_version:
        raise CheckFailed(f"wheel record version {record['version']} != {a.expect_version}")
    if importlib.util.find_spec("vllm._C") is None:
        raise CheckFailed("vllm._C is not installed: not a CUDA build")
    # The benchmark Job runs `vllm bench serve --dataset-name custom` in this image, which
    # reads its dataset with pandas (vLLM's `bench` extra): the node e2e's Job failed on an
    # image without it ("Please install vllm[bench]"). The runtime lock must carry it.
    if importlib.util.find_spec("pandas") is None:
        raise CheckFailed("pandas is not installed: the benchmark Job's `vllm bench serve` "
                          "needs it; compile runtime.lock with the bench requirement "
                          "(docs/engine.md)")
    # The weights prefetch reads k3:weights.store (S3, GCS, Azure) with obstore, in this
    # image: without it a stack with a store fails in its prefetch Job.
    if importlib.util.find_spec("obstore") is None:
        raise CheckFailed("obstore is not installed: the weights prefetch reads k3:weights.store "
                          "with it; compile runtime.lock with the store requirement (docs/engine.md)")
    for excl in exclusions(a.exclude):
        if importlib.util.find_spec(excl["module"]) is not None:
            raise CheckFailed(f"{excl['module']} is installed, but the receipt excludes "
                              f"{excl['name']}")
    result = {"vllm": vllm.__version__, "wheel_sha256": record["sha256"],
              "engine_commit": record["engine_commit"],
              "excluded_absent": [e["module"] for e in exclusions(a.exclude)]}
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"k3-engine: smoke ok: vllm {vllm.__version__}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="k3_engine_build.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("resolve")
    r.add_argument("--repo-url", default="")
    r.add_argument("--pr", default="")
    r.add_argument("--commit", default="")
    r.add_argument("--dest", required=True)
    r.set_defaults(func=cmd_resolve)

    f = sub.add_parser("fetch")
    f.add_argument("--repo-url", default="")
    f.add_argument("--pr", default="")
    f.add_argument("--commit", default="")
    f.add_argument("--expect-prefix", default="")
    f.add_argument("--dest", required=True)
    f.add_argument("--record")
    f.set_defaults(func=cmd_fetch)

    c = sub.add_parser("check-arch")
    c.add_argument("--capability", default="")
    c.add_argument("--arch-list", default="")
    c.add_argument("--cuda-version", default="")
    c.add_argument("--nvcc")
    c.set_defaults(func=cmd_check_arch)

    v = sub.add_parser("check-version")
    v.add_argument("--src", required=True)
    v.add_argument("--expect", default="")
    v.add_argument("--cuda-version", required=True)
    v.add_argument("--python", default=sys.executable)
    v.set_defaults(func=cmd_check_version)

    e = sub.add_parser("exclude")
    e.add_argument("--src", required=True)
    e.add_argument("--names", default="")
    e.set_defaults(func=cmd_exclude)

    w = sub.add_parser("wheel-record")
    w.add_argument("--dist", required=True)
    w.add_argument("--expect-version", required=True)
    w.add_argument("--commit", required=True)
    w.add_argument("--exclude", default="")
    w.add_argument("--cuda-version", default="")
    w.add_argument("--arch-list", default="")
    w.add_argument("--out", required=True)
    w.set_defaults(func=cmd_wheel_record)

    lab = sub.add_parser("verify-labels")
    lab.add_argument("--record", required=True)
    lab.add_argument("--wheel-sha256", default="")
    lab.add_argument("--engine-commit-full", default="")
    lab.set_defaults(func=cmd_verify_labels)

    s = sub.add_parser("smoke")
    s.add_argument("--expect-version", required=True)
    s.add_argument("--exclude", default="")
    s.add_argument("--record", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_smoke)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except BadArgument as exc:
        print(f"k3-engine: {exc}", file=sys.stderr)
        return 2
    except CheckFailed as exc:
        print(f"k3-engine: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GIT_TERMINAL_PROMPT", "0")
    sys.exit(main())
