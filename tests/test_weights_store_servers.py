"""The weights' object store against real servers on loopback (tests/store_servers.py):
an S3 server (versitygw), Google Cloud Storage (fake-gcs-server) and Azure Blob Storage
(Azurite), each started once for this module and stopped whatever happens.

`k3infra weights mirror` from the loopback Hub (tests/hub_loopback.py, the real
huggingface_hub client) into S3 and Azure, a second run uploading nothing, a tampered and
a missing object reported file by file and repaired; the same judgement over GCS (whose
emulator takes no obstore upload: the objects are seeded); the prefetch from each store
(the lock from beside the tree, every file hashed while written), a tampered object
refused naming the file, a killed prefetch resumed, a stalled transfer restarted."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import obstore
import pytest

from hub_loopback import LoopbackHub, environment, make_repo
from store_servers import SERVERS, StoreServer
from k3infra.weights import prefetch, runtime_paths, store, tree, verify
from k3infra.weights.mirror import SHA_ATTRIBUTE, mirror
from k3infra.weights.tree import FileEntry

REPO = "moonshotai/loopback-k3"
ROOT = Path(__file__).resolve().parent.parent
SHARD = "model-00002-of-00004.safetensors"


def lock_of(files: dict, revision: str) -> tree.Lock:
    return tree.make_lock(REPO, revision, [FileEntry(p, len(d), hashlib.sha256(d).hexdigest())
                                           for p, d in files.items()])


def _server(scheme: str, tmp_path_factory):
    try:
        server = SERVERS[scheme](tmp_path_factory.mktemp(f"store-{scheme}"))
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    with server:
        yield server


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from _server("s3", tmp_path_factory)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    yield from _server("gs", tmp_path_factory)


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    yield from _server("az", tmp_path_factory)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    # The CDN on the Hub's host at another port: the mirror follows the Hub's redirect in
    # plain HTTP only to the host HF_ENDPOINT names with http:// (httpclient.py).
    with LoopbackHub(REPO, make_repo(), cdn_host="127.0.0.1") as h:
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield h


def client(server: StoreServer, monkeypatch, prefix: str):
    """The store as a pod would see it: its environment, then the runtime's own opening."""
    for name, value in server.client_env().items():
        monkeypatch.setenv(name, value)
    url = store.parse_store_url(server.url(prefix), aws=False)
    return url, store.open_store(url, server.options())


def run_mirror(lock, server, prefix, monkeypatch, **kw):
    url, handle = client(server, monkeypatch, prefix)
    lines: list[str] = []
    report = mirror(lock, url, options=server.options(), emit=lines.append, **kw)
    report.lines = lines
    return url, handle, report


def run_prefetch(lock, server, prefix, dest, monkeypatch, **kw):
    client(server, monkeypatch, prefix)
    lines: list[str] = []
    report = prefetch.prefetch(lock, "0" * 64, str(dest), emit=lines.append, interval=0.2,
                               sources=[server.url(prefix)], **kw)
    report.lines = lines
    return report


@pytest.mark.parametrize("scheme", ["s3", "az"])
def test_mirror_from_the_hub_then_a_second_run_uploads_nothing(scheme, hub, tmp_path, monkeypatch,
                                                                request):
    server = request.getfixturevalue({"s3": "s3", "az": "azure"}[scheme])
    lock = lock_of(hub.files, hub.commit)
    prefix = f"first-{scheme}"
    url, handle, first = run_mirror(lock, server, prefix, monkeypatch)
    assert first.ok, first.problems
    assert (first.uploaded_files, first.kept_files, first.lock_written) == (len(lock.files), 0, True)
    assert any(h.method == "GET" for h in hub.hits)   # the bytes came from the Hub
    # Every object at its key with the k3sha256 metadata, the lock beside the tree.
    for entry in lock.files:
        got = obstore.get(handle, url.tree_key(REPO, hub.commit, entry.path))
        assert (got.attributes[SHA_ATTRIBUTE], bytes(got.bytes())) == (entry.sha256,
                                                                       hub.files[entry.path])
    assert bytes(obstore.get(handle, url.lock_key(REPO, hub.commit)).bytes()).decode() == \
        tree.lock_to_json(lock)
    gets = len(hub.hits)
    _, _, second = run_mirror(lock, server, prefix, monkeypatch)
    assert second.ok and (second.uploaded_files, second.kept_files, second.read_back,
                          second.lock_written) == (0, len(lock.files), 0, False)
    assert len(hub.hits) == gets                 # the Hub was not asked for a single file
    assert second.summary() == (f"mirror {url}: 9 files, 1.1 MB; uploaded 0 files / 0.0 MB, kept "
                                "9 already matching the lock (0 read and hashed); 0 did not match "
                                "the lock")


def _tamper(server: StoreServer, handle, key: str) -> None:
    """Change bytes of an object behind the mirror's back, keeping its size and metadata."""
    if server.scheme == "s3":
        with open(server.object_file(f"{key}"), "r+b") as fh:       # the posix backend's file
            fh.seek(1000)
            byte = fh.read(1)
            fh.seek(1000)
            fh.write(bytes([byte[0] ^ 0xFF]))
        return
    got = obstore.get(handle, key)
    data = bytearray(got.bytes())
    data[1000] ^= 0xFF
    obstore.put(handle, key, bytes(data), attributes={SHA_ATTRIBUTE: got.attributes[SHA_ATTRIBUTE]})


@pytest.mark.parametrize("scheme", ["s3", "az"])
def test_a_tampered_and_a_missing_object_are_reported_file_by_file_and_repaired(
        scheme, hub, tmp_path, monkeypatch, request):
    server = request.getfixturevalue({"s3": "s3", "az": "azure"}[scheme])
    lock = lock_of(hub.files, hub.commit)
    prefix = f"tamper-{scheme}"
    url, handle, first = run_mirror(lock, server, prefix, monkeypatch)
    assert first.ok
    tampered, missing = SHARD, "config.json"
    key = url.tree_key(REPO, hub.commit, tampered)
    _tamper(server, handle, (f"{prefix}/{key}" if scheme == "s3" else key))
    obstore.delete(handle, url.tree_key(REPO, hub.commit, missing))
    # Size and metadata still claim the lock's file: only reading it shows the change.
    _, _, trusting = run_mirror(lock, server, prefix, monkeypatch, dry_run=True)
    assert [str(p) for p in trusting.problems] == [f"{missing}: missing"]
    _, _, checked = run_mirror(lock, server, prefix, monkeypatch, dry_run=True, check=True)
    wrong = hashlib.sha256(bytes(obstore.get(handle, key).bytes())).hexdigest()
    assert [str(p) for p in checked.problems] == [
        f"{missing}: missing",
        f"{tampered}: wrong hash: sha256 {wrong}, the lock says {lock.by_path[tampered].sha256}"]
    assert checked.uploaded_files == 0 and checked.read_back == len(lock.files) - 1
    _, _, repaired = run_mirror(lock, server, prefix, monkeypatch, check=True)
    assert repaired.ok and repaired.uploaded_files == 2, repaired.problems
    assert f"mirror: {tampered}: wrong hash: sha256 {wrong}, the lock says " \
           f"{lock.by_path[tampered].sha256}; uploading it" in repaired.lines
    _, _, clean = run_mirror(lock, server, prefix, monkeypatch, check=True, dry_run=True)
    assert clean.ok and clean.read_back == len(lock.files)


def test_the_mirror_command_names_each_file_and_exits_1(s3, hub, tmp_path):
    """The CLI as an operator runs it: a local tree with its lock, then --dry-run over a
    store missing one object (exit 1, the file on stderr)."""
    lock = lock_of(hub.files, hub.commit)
    src = tmp_path / "tree"
    for path, data in hub.files.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_bytes(data)
    (tmp_path / "lock.json").write_text(tree.lock_to_json(lock))
    env = {**environment(hub, str(tmp_path / "hf")), **s3.env}
    cmd = [str(ROOT / ".venv/bin/k3infra"), "weights", "mirror", "--to", s3.url("cli"),
           "--endpoint", s3.endpoint, "--allow-http", "--lock", str(tmp_path / "lock.json")]
    done = subprocess.run([*cmd, str(src)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "uploaded 9 files / 1.1 MB, kept 0" in done.stdout
    (s3.root / "weights" / "cli" / "moonshotai--loopback-k3" / hub.commit / "README.md").unlink()
    done = subprocess.run([*cmd, "--dry-run"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"k3infra weights: mirror: {s3.url('cli')} does not match the lock {lock.tree_digest} in 1 file(s)",
        "  README.md: missing"]
    # A local file that is not the lock's is never uploaded.
    (src / "README.md").write_bytes(b"# GENERATED test repo\n")   # same size, other bytes
    done = subprocess.run([*cmd, str(src)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "  README.md: wrong hash" in done.stderr and "not uploaded" in done.stderr
    # A bucket the provider would refuse, before anything is sent.
    done = subprocess.run([*cmd[:4], "s3://Bad_Bucket/x", *cmd[5:], str(src)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "bucket 'Bad_Bucket' must be lowercase letters" in done.stderr


def test_the_mirror_command_refuses_a_hub_file_past_its_locked_size(s3, hub, tmp_path):
    """An endless shard from the Hub: one line naming the file, what came and what the
    lock says; nothing uploaded, nothing left in staging, no lock written."""
    lock = lock_of(hub.files, hub.commit)
    (tmp_path / "lock.json").write_text(tree.lock_to_json(lock))
    shard = hub.files[SHARD]
    hub.files[SHARD] = shard + b"more bytes than the lock lists"
    staging = tmp_path / "staging"
    staging.mkdir()
    env = {**environment(hub, str(tmp_path / "hf")), **s3.env}
    done = subprocess.run([sys.executable, "-c", "import sys; from k3infra.cli import main; "
                           "sys.exit(main())", "weights", "mirror", "--to", s3.url("past"), "--endpoint", s3.endpoint, "--allow-http", "--lock",
                           str(tmp_path / "lock.json"), "--staging", str(staging), "--timeout", "60"],
                          env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()[1:]
    assert line.startswith(f"  {SHARD}: not taken from the Hub: {REPO}@{hub.commit}: {hub.cdn}/cdn/")
    assert line.endswith(f": declares a file of {len(shard) + 30} bytes, more than the {len(shard)} "
                         f"accepted; the lock says {len(shard)} bytes, sha256 "
                         f"{lock.by_path[SHARD].sha256}")
    assert list(staging.iterdir()) == []
    assert "uploaded 8 files" in done.stdout and "lock written" not in done.stdout


def test_gcs_objects_are_judged_by_their_bytes(gcs, hub, monkeypatch):
    """fake-gcs-server takes no obstore upload, so the tree is seeded through its JSON API
    (no k3sha256 metadata): every object is read and hashed, a tampered and a missing one
    are reported."""
    lock = lock_of(hub.files, hub.commit)
    url = store.parse_store_url(gcs.url("seeded"))
    for path, data in hub.files.items():
        if path != "config.json":
            bad = path == SHARD
            gcs.seed(f"seeded/{url.tree_key(REPO, hub.commit, path)}",
                     data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:] if bad else data)
    _, _, report = run_mirror(lock, gcs, "seeded", monkeypatch, dry_run=True)
    assert report.read_back == len(lock.files) - 1
    assert [p.path for p in report.problems] == ["config.json", SHARD]
    assert str(report.problems[0]) == "config.json: missing"
    assert str(report.problems[1]).startswith(f"{SHARD}: wrong hash: sha256 ")


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_prefetch_from_each_store_takes_the_lock_beside_the_tree(scheme, hub, tmp_path, monkeypatch,
                                                                 request):
    server = request.getfixturevalue({"s3": "s3", "gs": "gcs", "az": "azure"}[scheme])
    lock = lock_of(hub.files, hub.commit)
    prefix = f"pull-{scheme}"
    url = store.parse_store_url(server.url(prefix), aws=False)
    if scheme == "gs":
        for path, data in hub.files.items():
            gcs_key = f"{prefix}/{url.tree_key(REPO, hub.commit, path)}"
            server.seed(gcs_key, data)
        server.seed(f"{prefix}/{url.lock_key(REPO, hub.commit)}", tree.lock_to_json(lock).encode())
    else:
        assert run_mirror(lock, server, prefix, monkeypatch)[2].ok
    client(server, monkeypatch, prefix)
    from k3infra.weights.sources import lock_from_sources

    got = lock_from_sources([server.url(prefix)], REPO, hub.commit)
    assert tree.lock_to_json(got) == tree.lock_to_json(lock)
    hits = len(hub.hits)
    dest = tmp_path / "dest"
    report = run_prefetch(lock, server, prefix, dest, monkeypatch)
    assert report.ok, report.problems
    assert len(hub.hits) == hits                      # not a byte from the Hub
    assert verify.verify_tree(str(dest), lock).ok
    assert verify.marker_problem(str(dest), lock) is None
    assert report.downloaded_files == len(lock.files)
    assert report.hashed_bytes == lock.total_bytes    # hashed while written, once
    assert f"the store {server.url(prefix)}: 9 files / 1.1 MB" in report.summary()


def test_a_tampered_object_is_refused_by_the_prefetch_naming_the_file(s3, hub, tmp_path, monkeypatch):
    lock = lock_of(hub.files, hub.commit)
    url, _, first = run_mirror(lock, s3, "refused", monkeypatch)
    assert first.ok
    _tamper(s3, None, f"refused/{url.tree_key(REPO, hub.commit, SHARD)}")
    report = run_prefetch(lock, s3, "refused", tmp_path / "dest", monkeypatch)
    assert not report.ok and report.marker is None
    assert [p.path for p in report.problems] == [SHARD]
    assert str(report.problems[0]).startswith(f"{SHARD}: wrong hash: sha256 ")
    assert str(report.problems[0]).endswith(f"the lock says {lock.by_path[SHARD].sha256} after 3 "
                                            "download(s); deleted")
    assert not (tmp_path / "dest").exists()


def _runtime_package(tmp_path: Path) -> Path:
    pkg = tmp_path / "runtime" / "k3weights"
    pkg.mkdir(parents=True)
    for name, path in runtime_paths().items():
        shutil.copy(path, pkg / name)
    return pkg.parent


def test_a_killed_prefetch_resumes_from_the_store(s3, tmp_path, monkeypatch):
    """SIGKILL mid-file, then a new process: the finished files are kept (re-hashed), the
    partial file continues where it stopped (fewer bytes the second time)."""
    files = {"config.json": b"{}\n", "model-00001-of-00001.safetensors": os.urandom(48 << 20)}
    big = "model-00001-of-00001.safetensors"
    lock = tree.make_lock(REPO, "c" * 40, [FileEntry(p, len(d), hashlib.sha256(d).hexdigest())
                                           for p, d in files.items()])
    url = store.parse_store_url(s3.url("resume"), aws=False)
    for path, data in files.items():
        target = s3.object_file(f"resume/{url.tree_key(REPO, lock.revision, path)}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (tmp_path / "lock.json").write_text(tree.lock_to_json(lock))
    env = {**os.environ, **s3.client_env(), "PYTHONPATH": str(_runtime_package(tmp_path)),
           # one small part at a time: slow enough to be killed mid-file
           "K3_STORE_PART_BYTES": str(256 << 10), "K3_STORE_PARTS_PER_FILE": "1"}
    dest = tmp_path / "dest"
    cmd = [sys.executable, "-m", "k3weights", "prefetch", "--lock", str(tmp_path / "lock.json"),
           "--dest", str(dest), "--sources", s3.url("resume")]
    partial = Path(prefetch.partial_path(prefetch.staging_path(str(dest)), lock.by_path[big]))
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (partial.exists() and partial.stat().st_size >= 8 << 20):
        time.sleep(0.005)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    have = partial.stat().st_size
    assert 0 < have < len(files[big]) and not dest.exists()
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert verify.verify_tree(str(dest), lock).ok
    line = next(x for x in second.stdout.splitlines() if x.startswith("prefetch OK"))
    assert f"the store {s3.url('resume')}: " in line
    # This run wrote only what the killed one had not (MB as the report rounds them).
    assert f"{(len(files[big]) + 3 - have) / 1e6:.1f} MB" in line, (have, line)


def test_a_stalled_store_transfer_is_restarted_from_where_it_stopped(s3, tmp_path, monkeypatch):
    """The server stops answering mid-file (SIGSTOP): the stall watchdog abandons the
    transfer and starts it again from the partial file's size; the server comes back."""
    data = os.urandom(24 << 20)
    path = "model-00001-of-00001.safetensors"
    lock = tree.make_lock(REPO, "d" * 40, [FileEntry(path, len(data), hashlib.sha256(data).hexdigest())])
    url = store.parse_store_url(s3.url("stall"), aws=False)
    target = s3.object_file(f"stall/{url.tree_key(REPO, lock.revision, path)}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    monkeypatch.setenv("K3_STORE_PART_BYTES", str(256 << 10))
    monkeypatch.setenv("K3_STORE_PARTS_PER_FILE", "1")
    dest = tmp_path / "dest"
    partial = Path(prefetch.partial_path(prefetch.staging_path(str(dest)), lock.by_path[path]))
    stopped = {"at": None}

    def freeze(line: str) -> None:
        lines.append(line)

    lines: list[str] = []
    import threading

    def stall_then_resume() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (partial.exists() and partial.stat().st_size >= 4 << 20):
            time.sleep(0.002)
        os.kill(s3.proc.pid, signal.SIGSTOP)
        stopped["at"] = partial.stat().st_size
        while time.monotonic() < deadline and not any("no progress" in x for x in lines):
            time.sleep(0.05)
        os.kill(s3.proc.pid, signal.SIGCONT)

    client(s3, monkeypatch, "stall")
    helper = threading.Thread(target=stall_then_resume)
    helper.start()
    try:
        report = prefetch.prefetch(lock, "0" * 64, str(dest), emit=freeze, interval=0.1,
                                   stall_seconds=1.0, sources=[s3.url("stall")])
    finally:
        helper.join()
        os.kill(s3.proc.pid, signal.SIGCONT)
    assert report.ok, report.problems
    assert any(f"{path}: no progress for 1 s at" in x and "restarting the transfer" in x
               for x in lines), lines
    assert verify.verify_tree(str(dest), lock).ok


def test_the_rendered_job_fills_from_the_store_and_the_gate_holds_the_same_digest(s3, tmp_path,
                                                                                 monkeypatch):
    """The prefetch Job's container as a pod runs it (the rendered command and env, the
    runtime ConfigMap's files, the Secret's keys): the lock from beside the tree, held to
    the pinned digest by check-lock.sh, then the tree; the serving gate passes on it.
    A lock in the store for another tree is refused before a single object is read."""
    from conftest import GOOD_REVISION
    from test_weights_pod_scripts import Pod, materialize, render, vllm_starts, container

    files = make_repo(shards=2, shard_size=64 * 1024)
    lock = tree.make_lock("moonshotai/Kimi-K3", GOOD_REVISION,
                          [FileEntry(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()])
    src = tmp_path / "src"
    for path, data in files.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_bytes(data)
    url = store.parse_store_url(s3.url("pods"), aws=False)
    client(s3, monkeypatch, "pods")
    assert mirror(lock, url, options=s3.options(), source_dir=str(src), emit=None).ok
    keys = json.dumps({"url": s3.url("pods"), "endpoint": s3.endpoint, "allowHttp": True,
                       "region": "us-east-1", "credentialsSecret": "k3-store-keys"})
    r = render("existing", f"weightsRevision={GOOD_REVISION}", f"weights.store={keys}")
    runtime = materialize(r, tmp_path)
    job = next(m for m in r.manifests() if m["kind"] == "Job"
               and m["metadata"]["name"] == "kimi-k3-weights-prefetch")
    secret_env = dict(s3.env)          # what the Secret's secretKeyRefs put in the pod
    pod = Pod(job["spec"]["template"]["spec"]["containers"][0], tmp_path, runtime, secret_env)
    serving = Pod(container(r), tmp_path, runtime, {})
    assert pod.env["K3_WEIGHTS_SOURCES"] == s3.url("pods")
    # Another pinned digest: the store's lock is refused before a shard is fetched.
    pod.env["K3_EXPECT_TREE_DIGEST"] = "sha256:" + "0" * 64
    refused = pod.start()
    assert refused.returncode != 0 and "not the measured tree" in refused.stderr, refused.stderr
    assert f"lock: moonshotai/Kimi-K3@{GOOD_REVISION} from the store {s3.url('pods')}" in refused.stdout
    assert not pod.tree.exists() and not Path(prefetch.staging_path(str(pod.tree))).exists()
    for p in (pod, serving):
        p.env["K3_EXPECT_TREE_DIGEST"] = lock.tree_digest
    done = pod.start()
    assert done.returncode == 0, done.stderr
    assert f"the store {s3.url('pods')}: {len(files)} files" in done.stdout   # the lock kept, then the tree
    first = serving.start()
    assert first.returncode == 0 and "gate (warm) OK" in first.stdout, first.stderr
    assert vllm_starts(tmp_path) == 1


def test_the_mirror_takes_the_store_revision_and_lock_from_the_stack(s3, tmp_path):
    """`mirror --stack NAME`: exactly what the stack's prefetch will read (its store, its
    pinned revision and lock, the receipt's repo); flags that would disagree are refused."""
    from conftest import GOOD_REVISION

    files = make_repo(shards=2, shard_size=64 * 1024)
    lock = tree.make_lock("moonshotai/Kimi-K3", GOOD_REVISION,
                          [FileEntry(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()])
    src = tmp_path / "src"
    for path, data in files.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_bytes(data)
    (tmp_path / "lock.json").write_text(tree.lock_to_json(lock))
    keys = json.dumps({"url": s3.url("stack"), "endpoint": s3.endpoint, "allowHttp": True,
                       "region": "us-east-1", "credentialsSecret": "k3-store-keys"})
    cmd = [str(ROOT / ".venv/bin/k3infra"), "weights", "mirror", str(src), "--stack", "existing",
           "--config", f"k3:weightsRevision={GOOD_REVISION}", "--config", f"k3:weights.store={keys}",
           "--config", f"k3:weights.lockFile={tmp_path / 'lock.json'}", "--config", "k3:profile=custom"]
    env = {**os.environ, **s3.env}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert f"mirror {s3.url('stack')}: {len(files)} files" in done.stdout
    assert (s3.object_file(f"stack/moonshotai--Kimi-K3/{GOOD_REVISION}.lock.json").read_text()
            == tree.lock_to_json(lock))
    clash = subprocess.run([*cmd, "--to", "s3://other-bucket"], env=env, capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
    assert clash.returncode == 2 and len(clash.stderr.strip().splitlines()) == 1
    assert "--stack existing takes the store, revision and lock from the stack: drop --to" in clash.stderr
    hub_only = subprocess.run(cmd[:4] + ["--stack", "existing"], env=env, capture_output=True,
                              text=True, timeout=60, cwd=ROOT)
    assert hub_only.returncode == 2 and "k3:weights.store is not set" in hub_only.stderr
