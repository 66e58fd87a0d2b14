"""The weights containers as pods run them: the rendered ConfigMap written out with its
volume items, each container's literal command and env (paths moved under tmp), the
bootstrap checking the runtime against the digests in the pod spec, and the real
huggingface_hub client against the loopback Hub. The serving container's command is run
with a stub `vllm` on PATH that records that it started: running it again is what a
liveness or OOM restart of the container does. Nothing half-done is left behind: no
engine start on a missing, unverified, altered or foreign tree."""
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
from k3infra.weights import tree, verify

from conftest import GOOD_REVISION, container, manifest, render, runtime_configmap

PIN = f"weightsRevision={GOOD_REVISION}"
REPO = "moonshotai/Kimi-K3"


def materialize(r, tmp: Path) -> Path:
    """The runtime ConfigMap as the pod's volume shows it, under tmp/runtime."""
    cm = runtime_configmap(r)
    sts = manifest(r, "StatefulSet")
    vol = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "weights-runtime")
    runtime = tmp / "runtime"
    for item in vol["configMap"]["items"]:
        path = runtime / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cm["data"][item["key"]])
    return runtime


def under(tmp: Path, path: str) -> str:
    return str(tmp / path.lstrip("/"))


class Pod:
    """One container of a rendered pod, runnable here."""

    def __init__(self, c: dict, tmp: Path, runtime: Path, hub_env: dict):
        self.c, self.tmp = c, tmp
        env = {**hub_env}
        for e in c["env"]:
            if "value" in e:
                env[e["name"]] = e["value"]
        for key in ("K3_TREE", "K3_LOCK", "K3_GATE_STATE"):
            if key in env:
                env[key] = under(tmp, env[key])
        if "K3_GATE_LOCK" in env:
            env["K3_GATE_LOCK"] = env["K3_GATE_LOCK"].replace(w.RUNTIME_DIR, str(runtime)) \
                if env["K3_GATE_LOCK"].startswith(w.RUNTIME_DIR) else under(tmp, env["K3_GATE_LOCK"])
        env["K3_RUNTIME_DIR"] = str(runtime)
        env["K3_RUNTIME_COPY_DIR"] = str(tmp / "pod-tmp")
        env["K3_HASH_WORKERS"] = "2"
        env["HOME"] = str(tmp / "home")
        # `python3` is the engine image's interpreter, which has huggingface_hub: here, ours;
        # `vllm` is a stub that records each start.
        bindir = tmp / "bin"
        bindir.mkdir(exist_ok=True)
        (bindir / "vllm").write_text(f'#!/bin/sh\necho "$@" >> {tmp / "vllm-starts"}\n')
        (bindir / "vllm").chmod(0o755)
        env["PATH"] = os.pathsep.join([str(bindir), str(Path(sys.executable).parent),
                                       os.environ["PATH"]])
        env.pop("PYTHONPATH", None)
        for d in ("pod-tmp", "home"):
            (tmp / d).mkdir(exist_ok=True)
        if "K3_GATE_STATE" in env:
            Path(env["K3_GATE_STATE"]).mkdir(parents=True, exist_ok=True)
        self.env = env

    def start(self) -> subprocess.CompletedProcess:
        """The container's command + args, as the kubelet starts (and restarts) it."""
        return subprocess.run([*self.c["command"], *self.c.get("args", [])], env=self.env,
                              capture_output=True, text=True, timeout=120, cwd=self.tmp)

    @property
    def tree(self) -> Path:
        return Path(self.env["K3_TREE"])


def vllm_starts(tmp: Path) -> int:
    f = tmp / "vllm-starts"
    return len(f.read_text().splitlines()) if f.exists() else 0


@pytest.fixture
def repo_files():
    return make_repo(shards=2, shard_size=64 * 1024)


def digest_of(files: dict[str, bytes]) -> str:
    return tree.make_lock(REPO, GOOD_REVISION, [
        tree.FileEntry(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]).tree_digest


def setup(tmp_path, files, hub, *overrides):
    """The Job's container and the serving container of a render; the loopback repo
    stands in for the receipt's tree, so both expect its digest."""
    r = render("existing", PIN, *overrides)
    runtime = materialize(r, tmp_path)
    job = next(m for m in r.manifests() if m["kind"] == "Job"
               and m["metadata"]["name"].startswith("kimi-k3-weights-prefetch"))
    hub_env = environment(hub, str(tmp_path / "hf-home"))
    job_pod = Pod(job["spec"]["template"]["spec"]["containers"][0], tmp_path, runtime, hub_env)
    serving = Pod(container(r), tmp_path, runtime, {})
    for pod in (job_pod, serving):
        pod.env["K3_EXPECT_TREE_DIGEST"] = digest_of(files)
    return runtime, job_pod, serving


def flip_a_byte(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))


def shards(pod: Pod) -> list[Path]:
    return sorted(p for p in pod.tree.iterdir() if p.suffix == ".safetensors")


@pytest.mark.parametrize("mode", ["shared", "node-local"])
def test_engine_starts_only_after_the_job_and_never_after_tampering(tmp_path, repo_files, mode):
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        runtime, job, serving = setup(tmp_path, repo_files, hub, f"weights.mode={mode}")
        early = serving.start()
        assert early.returncode != 0 and "prefetch has not completed" in early.stderr
        assert vllm_starts(tmp_path) == 0 and hub.hits == []     # the pod never fetches
        done = job.start()
        assert done.returncode == 0, done.stderr
    marker = json.loads((job.tree / ".k3-verified.json").read_text())
    assert marker["revision"] == GOOD_REVISION
    first = serving.start()                                      # the Hub is gone: offline
    assert first.returncode == 0, first.stderr
    assert "gate (warm) OK" in first.stdout and vllm_starts(tmp_path) == 1
    flip_a_byte(shards(serving)[0])
    restart = serving.start()                   # the container restarts (liveness, OOM)
    assert restart.returncode != 0 and "vLLM does not start" in restart.stderr
    assert shards(serving)[0].name in restart.stderr
    assert vllm_starts(tmp_path) == 1


def test_stamps_mode_restart_rehashes_nothing_unless_a_file_changed(tmp_path, repo_files):
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        _runtime, job, serving = setup(tmp_path, repo_files, hub, "weights.gateMode=stamps")
        assert job.start().returncode == 0
    first = serving.start()
    assert first.returncode == 0, first.stderr
    assert f"hashed {len(repo_files)} files" in first.stdout       # pod creation: full
    again = serving.start()
    assert again.returncode == 0 and f"{len(repo_files)} unchanged by stamp" in again.stdout
    # A writer of the volume rewrites a shard and plants a stamp file beside the tree.
    shard = shards(serving)[1]
    flip_a_byte(shard)
    lock = tree.load_lock(job.env["K3_LOCK"])[0]
    (serving.tree / tree.STATE_NAME).write_text(json.dumps({"format": "k3-verify-state/1", "files": {
        e.path: [*tree.stamp_of(os.lstat(serving.tree / e.path)), e.sha256] for e in lock.files}}))
    bad = serving.start()
    assert bad.returncode != 0 and shard.name in bad.stderr
    assert vllm_starts(tmp_path) == 2


def test_a_replaced_lock_tree_and_marker_do_not_start_the_engine(tmp_path, repo_files):
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        _runtime, job, serving = setup(tmp_path, repo_files, hub)
        assert job.start().returncode == 0
    flip_a_byte(shards(serving)[0])
    theirs = verify.lock_from_dir(str(serving.tree), REPO, GOOD_REVISION, workers=2)
    Path(job.env["K3_LOCK"]).write_text(tree.lock_to_json(theirs))
    verify.write_marker(str(serving.tree), theirs, "0" * 64)
    res = serving.start()
    assert res.returncode != 0 and "not the pinned tree" in res.stderr
    assert vllm_starts(tmp_path) == 0


def test_an_edited_runtime_configmap_is_refused_before_it_runs(tmp_path, repo_files):
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        runtime, job, serving = setup(tmp_path, repo_files, hub)
        assert job.start().returncode == 0
    gate_py = runtime / "k3weights" / "gate.py"
    gate_py.write_text(gate_py.read_text() + "\nrun_gate = lambda *a, **k: None\n")
    res = serving.start()
    assert res.returncode != 0 and "changed outside Pulumi" in res.stderr
    assert "k3weights/gate.py" in res.stderr and vllm_starts(tmp_path) == 0


def test_a_foreign_tree_is_refused_before_any_shard_is_fetched(tmp_path, repo_files):
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        _runtime, job, _serving = setup(tmp_path, repo_files, hub)
        job.env["K3_EXPECT_TREE_DIGEST"] = "sha256:" + "ab" * 32      # the receipt's tree
        res = job.start()
        assert res.returncode != 0 and "not the measured tree" in res.stderr
        assert not job.tree.exists()                                   # nothing downloaded
        assert not [h for h in hub.hits if h.path.endswith(".safetensors")]


def test_an_unusable_weights_root_fails_with_the_reason(tmp_path, repo_files):
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        _runtime, job, _serving = setup(tmp_path, repo_files, hub, "weights.mode=node-local")
        root = Path(job.env["K3_LOCK"]).parent
        root.parent.mkdir(parents=True)
        root.write_text("")            # not a directory: mkdir fails even for root
        res = job.start()
    assert res.returncode != 0
    assert "is not writable by uid" in res.stderr and "docs/weights.md" in res.stderr


def runtime_copies(tmp: Path) -> list[str]:
    return sorted(p.name for p in (tmp / "pod-tmp").iterdir() if p.name.startswith("k3-runtime-"))


def test_restarts_leave_no_runtime_copy_behind_and_touch_nothing_foreign(tmp_path, repo_files):
    """Issue 27: every start left a /tmp/k3-runtime-* directory in the container's /tmp
    (an emptyDir, kept across restarts). The gate's copy goes when the gate ends; the
    prefetch's (its script runs from it) when the next start finds nobody holds it.
    Another writer of /tmp cannot make a start delete anything of its choosing."""
    with LoopbackHub(REPO, repo_files, commit=GOOD_REVISION) as hub:
        _runtime, job, serving = setup(tmp_path, repo_files, hub)
        pod_tmp = tmp_path / "pod-tmp"
        victim = tmp_path / "victim"
        victim.mkdir()
        (victim / "keep").write_text("x")
        (pod_tmp / "k3-runtime-planted").symlink_to(victim)           # a symlink
        (pod_tmp / "k3-runtime-nolock").mkdir()                       # no lock: not ours
        foreign = pod_tmp / "k3-runtime-foreign"
        if os.geteuid() == 0:                                         # another uid's
            foreign.mkdir()
            (foreign / ".lock").write_text("")
            os.chown(foreign, 4242, 4242)
        planted = runtime_copies(tmp_path)
        for _ in range(3):                                 # the Job's container restarts
            assert job.start().returncode == 0
        left = [n for n in runtime_copies(tmp_path) if n not in planted]
        assert len(left) == 1                              # the last run's, released
    for _ in range(3):
        res = serving.start()
        assert res.returncode == 0, res.stderr
    assert vllm_starts(tmp_path) == 3
    assert runtime_copies(tmp_path) == planted             # the prefetch's copy removed too
    assert (victim / "keep").read_text() == "x"
    if os.geteuid() == 0:
        assert (foreign / ".lock").exists()
    copy = next(p for p in pod_tmp.iterdir() if p.name == "k3-runtime-nolock")
    assert copy.is_dir()


def test_a_copy_in_use_is_never_removed(tmp_path):
    """The copy a running program uses (its flock, inherited across exec) survives
    another start in the same /tmp; once that program is gone, the next start removes it."""
    src, pod_tmp = tmp_path / "runtime", tmp_path / "pod-tmp"
    src.mkdir()
    pod_tmp.mkdir()
    (src / "hold.sh").write_text('echo started; read line\n')          # runs until stdin closes
    (src / "done.sh").write_text("exit 0\n")
    pins = {n: hashlib.sha256((src / n).read_bytes()).hexdigest() for n in ("hold.sh", "done.sh")}
    env = {"PATH": os.environ["PATH"], "K3_RUNTIME_DIR": str(src),
           "K3_RUNTIME_SHA256": json.dumps(pins), "K3_RUNTIME_COPY_DIR": str(pod_tmp)}
    boot = [sys.executable, "-c", w.bootstrap_source(), "sh"]
    holder = subprocess.Popen([*boot, "hold.sh"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "started"
        live = [p.name for p in pod_tmp.iterdir()]
        assert len(live) == 1
        assert subprocess.run([*boot, "done.sh"], env=env, timeout=30).returncode == 0
        assert live[0] in [p.name for p in pod_tmp.iterdir()]       # in use: kept
    finally:
        holder.communicate(input="\n", timeout=30)
    assert subprocess.run([*boot, "done.sh"], env=env, timeout=30).returncode == 0
    left = [p.name for p in pod_tmp.iterdir()]
    assert live[0] not in left and len(left) == 1                   # only the last start's
