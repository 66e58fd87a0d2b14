"""The pod scripts as pods run them: the rendered ConfigMap written out with its volume
items, the rendered container env (paths moved under tmp), `sh` as the entrypoint, and
the real huggingface_hub client against the loopback Hub. Nothing half-done is left
behind: no serving start on a missing, unverified or foreign tree."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_loopback import LoopbackHub, environment, make_repo

from k3infra.weights import manifests as w
from k3infra.weights import tree

from conftest import GOOD_REVISION, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
REPO = "moonshotai/Kimi-K3"


def materialize(r, tmp: Path) -> Path:
    """The runtime ConfigMap as the pod's volume shows it, under tmp/runtime."""
    cm = manifest(r, "ConfigMap", "kimi-k3-weights-runtime")
    sts = manifest(r, "StatefulSet")
    vol = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "weights-runtime")
    runtime = tmp / "runtime"
    for item in vol["configMap"]["items"]:
        path = runtime / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cm["data"][item["key"]])
    return runtime


def pod_env(container: dict, tmp: Path, runtime: Path, hub_env: dict) -> dict:
    """The container's literal env with its paths moved under tmp."""
    env = {**hub_env}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
    for key in ("K3_TREE", "K3_LOCK"):
        env[key] = str(tmp / env[key].lstrip("/"))
    env["K3_RUNTIME_DIR"] = env["PYTHONPATH"] = str(runtime)
    env["K3_HASH_WORKERS"] = "2"
    env["HOME"] = str(tmp / "home")
    # `python3` is the engine image's interpreter, which has huggingface_hub: here, ours.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return env


def run(script: str, env: dict, runtime: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(runtime / script)], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def repo_files():
    return make_repo(shards=2, shard_size=64 * 1024)


def digest_of(files: dict[str, bytes]) -> str:
    return tree.make_lock(REPO, GOOD_REVISION, [
        tree.FileEntry(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]).tree_digest


def setup(tmp_path, mode: str, files, hub):
    r = render("existing", PIN, f"weights.mode={mode}")
    runtime = materialize(r, tmp_path)
    job = manifest(r, "Job", "kimi-k3-weights-prefetch")["spec"]["template"]["spec"]["containers"][0]
    gate = manifest(r, "StatefulSet")["spec"]["template"]["spec"]["initContainers"][0]
    hub_env = environment(hub, str(tmp_path / "hf-home"))
    job_env, gate_env = (pod_env(c, tmp_path, runtime, hub_env) for c in (job, gate))
    # The loopback repo stands in for the receipt's tree: expect its digest.
    for env in (job_env, gate_env):
        env["K3_EXPECT_TREE_DIGEST"] = digest_of(files)
    return runtime, job_env, gate_env


def test_shared_gate_refuses_before_the_job_then_serves_a_verified_tree(tmp_path, repo_files):
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        runtime, job_env, gate_env = setup(tmp_path, "shared", repo_files, hub)
        early = run("gate.sh", gate_env, runtime)
        assert early.returncode != 0 and "has not completed" in early.stderr
        job = run("prefetch.sh", job_env, runtime)
        assert job.returncode == 0, job.stderr
    marker = json.loads((Path(job_env["K3_TREE"]) / ".k3-verified.json").read_text())
    assert marker["revision"] == GOOD_REVISION
    gate = run("gate.sh", gate_env, runtime)                  # the Hub is gone: offline
    assert gate.returncode == 0, gate.stderr
    assert "weights verified" in gate.stdout
    shard = sorted(p for p in Path(job_env["K3_TREE"]).iterdir() if p.suffix == ".safetensors")[0]
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    bad = run("gate.sh", gate_env, runtime)
    assert bad.returncode != 0 and "refusing to serve" in bad.stderr
    assert shard.name in bad.stderr


def test_a_foreign_tree_is_refused_before_any_shard_is_fetched(tmp_path, repo_files):
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        runtime, job_env, gate_env = setup(tmp_path, "shared", repo_files, hub)
        job_env["K3_EXPECT_TREE_DIGEST"] = "sha256:" + "ab" * 32      # the receipt's tree
        job = run("prefetch.sh", job_env, runtime)
        assert job.returncode != 0 and "not the measured tree" in job.stderr
        assert not Path(job_env["K3_TREE"]).exists()                   # nothing downloaded
        assert not [h for h in hub.hits if h.path.endswith(".safetensors")]
    gate_env["K3_EXPECT_TREE_DIGEST"] = "sha256:" + "ab" * 32
    gate = run("gate.sh", gate_env, runtime)
    assert gate.returncode != 0 and "not the measured tree" in gate.stderr


def test_node_local_gate_fetches_what_its_node_is_missing(tmp_path, repo_files):
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        runtime, _job_env, gate_env = setup(tmp_path, "node-local", repo_files, hub)
        gate = run("gate.sh", gate_env, runtime)
        assert gate.returncode == 0, gate.stderr
        assert "fetching what is missing" in gate.stderr and "weights verified" in gate.stdout
    for name in repo_files:
        assert (Path(gate_env["K3_TREE"]) / name).read_bytes() == repo_files[name]


def test_an_unusable_weights_root_fails_with_the_reason(tmp_path, repo_files):
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        runtime, job_env, _gate_env = setup(tmp_path, "node-local", repo_files, hub)
        root = Path(job_env["K3_LOCK"]).parent
        root.parent.mkdir(parents=True)
        root.write_text("")            # not a directory: mkdir fails even for root
        job = run("prefetch.sh", job_env, runtime)
    assert job.returncode != 0
    assert "is not writable by uid" in job.stderr and "docs/weights.md" in job.stderr
