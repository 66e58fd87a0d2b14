"""The runtime as pods run it (a top-level package `k3weights` from a ConfigMap, standard
library + huggingface_hub only), the `k3infra weights` CLI around it, and the lock held
against the receipt."""
from __future__ import annotations

import ast
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hub_loopback import LoopbackHub, environment, make_repo

from k3infra.weights import RUNTIME_FILES, runtime_paths, tree, verify
from k3infra.weights.lockcheck import compare_with_receipt
from k3infra.weights.tree import FileEntry

PKG_DIR = Path(tree.__file__).parent
ROOT = PKG_DIR.parent.parent
REV = "0123456789abcdef0123456789abcdef01234567"
ALLOWED_THIRD_PARTY = {"huggingface_hub"}
# obstore, by store.py alone: only pods that read an object store (k3:weights.store) need it
# (the engine images' locks carry it).
ALLOWED_BY_FILE = {"store.py": {"obstore"}}


@pytest.mark.parametrize("name", RUNTIME_FILES)
def test_runtime_imports_only_stdlib_huggingface_hub_and_each_other(name):
    module = ast.parse((PKG_DIR / name).read_text())
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            tops = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:          # relative: another runtime module
                # another shipped module; `..podcommon` is the operator-side fallback
                # of a module shipped beside it (k3infra/podcommon.py)
                assert (node.module or "").split(".")[0] in {"", *[f[:-3] for f in runtime_paths()]}
                continue
            tops = [node.module.split(".")[0]]
        else:
            continue
        for top in tops:
            assert top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY \
                or top in ALLOWED_BY_FILE.get(name, ()), \
                f"{name} imports {top}: pods only have the standard library and huggingface_hub"


def test_package_init_stays_import_light():
    code = ("import sys, k3infra.weights, k3infra.weights.verify, k3infra.weights.tree; "
            "print(sorted(m for m in ('pulumi', 'pydantic', 'rich', 'yaml', 'huggingface_hub', 'obstore') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def runtime_package(tmp_path: Path) -> Path:
    pkg = tmp_path / "runtime" / "k3weights"
    pkg.mkdir(parents=True)
    for name, path in runtime_paths().items():
        shutil.copy(path, pkg / name)
    return pkg.parent


def test_runtime_runs_as_another_top_level_package(tmp_path):
    """Exactly the shipped files, renamed as in the ConfigMap, with k3infra unimportable."""
    pythonpath = runtime_package(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "k3infra.py").write_text("raise ImportError('k3infra is not in the engine image')\n")
    files = make_repo(shards=2, shard_size=50_000)
    lock = tree.make_lock("o/m", REV, [FileEntry(p, len(d), hashlib.sha256(d).hexdigest())
                                       for p, d in files.items()])
    lock_file = tmp_path / "lock.json"
    lock_file.write_text(tree.lock_to_json(lock))
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{pythonpath}"}

    def k3weights(*args):
        return subprocess.run([sys.executable, "-m", "k3weights", *args], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=120)

    with LoopbackHub("o/m", files, commit=REV) as hub:
        env.update(environment(hub, str(tmp_path / "home")))
        env["PYTHONPATH"] = f"{blocker}{os.pathsep}{pythonpath}"
        made = k3weights("lock", "--hub", "o/m", "--revision", REV, "--out", str(tmp_path / "hub.json"))
        assert made.returncode == 0, made.stderr
        assert (tmp_path / "hub.json").read_text() == lock_file.read_text()
        dest = tmp_path / "weights" / "tree"
        res = k3weights("prefetch", "--lock", str(lock_file), "--dest", str(dest), "--workers", "2",
                        "--max-download-workers", "4")
        assert res.returncode == 0, res.stderr
        assert "prefetch OK" in res.stdout
    gate = k3weights("verify", str(dest), "--lock", str(lock_file), "--require-marker")
    assert gate.returncode == 0, gate.stderr
    assert f"hashed {len(files)} files" in gate.stdout      # never trusts stamps
    gate = k3weights("gate", str(dest), "--lock", str(lock_file), "--expect-digest",
                     lock.tree_digest, "--repo", "o/m", "--revision", REV, "--workers", "2")
    assert gate.returncode == 0, gate.stderr
    assert f"gate (warm) OK: {len(files)} files" in gate.stdout
    (dest / "config.json").write_text("{}")
    gate = k3weights("verify", str(dest), "--lock", str(lock_file), "--require-marker")
    assert gate.returncode == 1 and "config.json: truncated" in gate.stderr


# ---- the k3infra CLI --------------------------------------------------------------------

def k3infra(*args, env=None, timeout=120):
    code = "import sys; from k3infra.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.fixture
def local_tree(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    for i in range(3):
        (root / f"model-{i}.safetensors").write_bytes(os.urandom(100_000))
    (root / "config.json").write_text("{}\n")
    return root


def test_cli_lock_and_verify(local_tree, tmp_path):
    lock_file = tmp_path / "lock.json"
    made = k3infra("weights", "lock", str(local_tree), "--revision", REV, "--out", str(lock_file))
    assert made.returncode == 0, made.stderr
    assert "not the measured tree" in made.stdout            # a generated tree is not Kimi K3
    lock, _ = tree.load_lock(str(lock_file))
    from k3infra.receipt import load_receipt
    assert lock.repo == load_receipt().model.repo            # default repo: the receipt's
    ok = k3infra("weights", "verify", str(local_tree), "--lock", str(lock_file), "--workers", "2")
    assert ok.returncode == 0, ok.stderr
    (local_tree / "model-1.safetensors").unlink()
    (local_tree / "extra.bin").write_text("x")
    bad = k3infra("weights", "verify", str(local_tree), "--lock", str(lock_file), "--full")
    assert bad.returncode == 1
    assert "model-1.safetensors: missing" in bad.stderr and "extra.bin: extra file" in bad.stderr


def test_cli_bad_input_is_exit_2_with_one_clear_line(local_tree, tmp_path):
    res = k3infra("weights", "lock", str(local_tree), "--out", str(tmp_path / "l.json"))
    assert res.returncode == 2 and "--revision" in res.stderr
    res = k3infra("weights", "verify", str(local_tree), "--lock", str(tmp_path / "absent.json"))
    assert res.returncode == 2 and "cannot read" in res.stderr
    res = k3infra("weights", "lock", "--hub", "o/m", "--out", str(tmp_path / "l.json"))
    assert res.returncode == 2 and "--revision" in res.stderr


def test_cli_verify_start_up_loads_nothing_heavy(local_tree, tmp_path):
    lock_file = tmp_path / "lock.json"
    lock_file.write_text(tree.lock_to_json(verify.lock_from_dir(str(local_tree), "o/m", REV)))
    code = "import sys; from k3infra.cli import main; sys.exit(main(sys.argv[1:]))"
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", code, "weights", "verify",
                          str(local_tree), "--lock", str(lock_file)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines()
                if line.startswith("import time:")}
    assert "k3infra.weights.verify" in imported
    heavy = ("pulumi", "pydantic", "rich", "yaml", "huggingface_hub", "k3infra.receipt",
             "k3infra.config", "concurrent.futures.process")
    assert not [m for m in imported if m.startswith(heavy)]
    # Issue 18: what the verify path does not need costs every pod's gate ~25 ms of start-up.
    unneeded = {"dataclasses", "inspect", "typing", "concurrent.futures", "logging", "datetime"}
    assert not unneeded & imported


def test_cli_prefetch_against_the_loopback_hub(tmp_path):
    files = make_repo(shards=2, shard_size=40_000)
    lock = tree.make_lock("o/m", REV, [FileEntry(p, len(d), hashlib.sha256(d).hexdigest())
                                       for p, d in files.items()])
    lock_file = tmp_path / "lock.json"
    lock_file.write_text(tree.lock_to_json(lock))
    with LoopbackHub("o/m", files, commit=REV) as hub:
        env = environment(hub, str(tmp_path / "home"))
        dest = tmp_path / "dest"
        res = k3infra("weights", "prefetch", "--lock", str(lock_file), "--dest", str(dest), env=env)
        assert res.returncode == 0, res.stderr
        env["K3_WEIGHTS_FREE_BYTES"] = "0"
        res = k3infra("weights", "prefetch", "--lock", str(lock_file), "--dest", str(tmp_path / "d2"),
                      env=env)
        assert res.returncode == 1 and "not enough free space" in res.stderr
        env["K3_WEIGHTS_FREE_BYTES"] = "lots"
        res = k3infra("weights", "prefetch", "--lock", str(lock_file), "--dest", str(tmp_path / "d3"),
                      env=env)
        assert res.returncode == 2 and "K3_WEIGHTS_FREE_BYTES" in res.stderr
        made = k3infra("weights", "lock", "--hub", "o/m", "--revision", REV, "--out",
                       str(tmp_path / "hub.json"), env=env)
        assert made.returncode == 0, made.stderr
        assert (tmp_path / "hub.json").read_text() == lock_file.read_text()
        unknown = k3infra("weights", "lock", "--hub", "o/m", "--revision", "f" * 40, "--out",
                          str(tmp_path / "x.json"), env=env)
        assert unknown.returncode == 1 and "RevisionNotFound" in unknown.stderr
        assert "Traceback" not in unknown.stderr and not (tmp_path / "x.json").exists()
    res = k3infra("weights", "verify", str(dest), "--lock", str(lock_file), "--require-marker")
    assert res.returncode == 0, res.stderr


# ---- the lock against the receipt ---------------------------------------------------------

def test_lock_of_another_tree_is_not_the_measured_tree(receipt, local_tree, tmp_path):
    lock = verify.lock_from_dir(str(local_tree), receipt.model.repo, REV)
    verdict = compare_with_receipt(lock, receipt.model.tree_digest)
    assert isinstance(verdict, str) and verdict.startswith("not the measured tree")
    assert receipt.model.tree_digest in verdict and lock.tree_digest in verdict
    assert compare_with_receipt(lock, lock.tree_digest) is True

