"""The Hub once per cluster, on loopback: a prefetch that takes an in-cluster source first
and the Hub as fallback (k3weights.sources), through the real huggingface_hub client.

- a loopback stand-in of a source (the Hub's URL layout, no CDN hop) with faults: a
  tampered byte is refused by the lock and the file refetched from the Hub; a source that
  dies mid-file hands the file to the Hub, which resumes it with Range; the HF token
  never reaches the source;
- the real nginx (when installed) with the configuration the stack renders, serving a
  verified copy: huggingface_hub fills a second copy from it with no Hub byte, takes the
  lock from it, never sees the marker; a byte changed in the served copy is refused;
- the source's start check, run as the rendered init container runs it: no marker, a
  changed byte or another tree, and the pod never starts serving.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hub_loopback import LoopbackHub, make_repo

from k3infra.weights import manifests as w
from k3infra.weights import prefetch, source_server, sources, tree, verify
from k3infra.weights.tree import FileEntry

from conftest import GOOD_REVISION, manifest, render

REPO = "moonshotai/Kimi-K3"
BIG = "model-00002-of-00004.safetensors"
CHUNK = 10 * 1024 * 1024   # huggingface_hub writes downloads in 10 MiB chunks
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def lock_of(files: dict, revision: str) -> tree.Lock:
    return tree.make_lock(REPO, revision, [FileEntry(p, len(d), hashlib.sha256(d).hexdigest())
                                           for p, d in files.items()])


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv(prefetch.FREE_BYTES_ENV, raising=False)


@pytest.fixture
def pair(env, monkeypatch):
    """The Hub and an in-cluster source holding the same repo at the same commit."""
    files = make_repo()
    files[BIG] = os.urandom(2 * CHUNK + 12345)
    with LoopbackHub(REPO, files, commit=GOOD_REVISION) as hub, \
            LoopbackHub(REPO, files, commit=GOOD_REVISION, redirect_lfs=False) as source:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        yield hub, source


def run(files, dest, order, **kw):
    lines: list[str] = []
    report = prefetch.prefetch(lock_of(files, GOOD_REVISION), "0" * 64, str(dest),
                               emit=lines.append, interval=0.2, sources=order, **kw)
    report.lines = lines
    return report


def assert_verified(files, dest):
    lock = lock_of(files, GOOD_REVISION)
    assert verify.verify_tree(str(dest), lock).ok
    assert verify.marker_problem(str(dest), lock) is None


def test_every_byte_from_the_source_and_none_from_the_hub(pair, tmp_path):
    hub, source = pair
    report = run(hub.files, tmp_path / "dest", [source.endpoint, "hub"])
    assert report.ok, report.problems
    assert_verified(hub.files, tmp_path / "dest")
    assert hub.hits == []                                   # not even a HEAD
    assert source.body_bytes() == sum(len(d) for d in hub.files.values())
    counts = report.sources[source.endpoint]
    assert counts.files == len(hub.files) and counts.bytes == source.body_bytes()
    assert report.refused_by_lock == 0 and report.failovers == 0
    assert f"{source.endpoint}: {len(hub.files)} files" in report.summary()


def test_a_tampered_byte_at_the_source_is_refused_and_refetched_from_the_hub(pair, tmp_path):
    hub, source = pair
    shard = "model-00003-of-00004.safetensors"
    source.faults.corrupt_always.add(shard)
    report = run(hub.files, tmp_path / "dest", [source.endpoint, "hub"])
    assert report.ok, report.problems
    assert_verified(hub.files, tmp_path / "dest")
    assert len(source.gets(shard)) == 1 and len(hub.gets(shard)) == 1
    assert report.refused_by_lock == 1
    assert report.sources[source.endpoint].refused_by_lock == 1
    assert report.sources["hub"].refused_by_lock == 0
    assert any(f"{shard}: wrong hash" in line and f"cluster source {source.endpoint}" in line
               and "refused by the lock" in line and "fetching it again from the Hub" in line
               for line in report.lines), report.lines
    assert "refused by the lock: 1 file(s)" in report.summary()


def test_a_source_that_dies_mid_file_hands_the_rest_to_the_hub_with_range(pair, tmp_path):
    hub, source = pair
    source.faults.stall[BIG] = CHUNK + 5000
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        report=run(hub.files, tmp_path / "dest", [source.endpoint, "hub"])))
    worker.start()
    assert source.stalled.wait(60), "the source never sent the first chunk"
    source.kill()                       # the source dies: every connection cut, port shut
    worker.join(120)
    report = result["report"]
    assert report.ok, report.problems
    assert_verified(hub.files, tmp_path / "dest")
    (resumed,) = hub.gets(BIG)
    assert resumed.range == f"bytes={CHUNK}-"      # the Hub continued the source's partial file
    assert resumed.sent == len(hub.files[BIG]) - CHUNK
    assert report.failovers >= 1
    assert report.sources[source.endpoint].failures >= 1
    assert any(f"{BIG}: cluster source {source.endpoint} failed" in line
               and f"resuming at byte {CHUNK} from the Hub" in line for line in report.lines)


def test_a_source_that_stalls_is_abandoned_by_the_watchdog_and_the_hub_resumes(pair, tmp_path,
                                                                               monkeypatch):
    """The source stops sending mid-file and holds the connection open: the prefetch's
    stall watchdog abandons the transfer, and the chain resumes it from the next source
    (the Hub) with Range, instead of asking the stalled source again."""
    from huggingface_hub import constants

    hub, source = pair
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 120)
    source.faults.stall[BIG] = CHUNK + 5000           # every GET from the source stalls
    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        if "stalled; resuming" in line:
            source.faults.released.set()             # let the abandoned connection end

    report = prefetch.prefetch(lock_of(hub.files, GOOD_REVISION), "0" * 64, str(tmp_path / "dest"),
                               emit=emit, interval=0.1, stall_seconds=1.0,
                               sources=[source.endpoint, "hub"])
    assert report.ok, report.problems
    assert_verified(hub.files, tmp_path / "dest")
    assert any(f"{BIG}: cluster source {source.endpoint} stalled; resuming at byte {CHUNK} "
               "from the Hub" in line for line in lines), lines
    (resumed,) = hub.gets(BIG)
    assert resumed.range == f"bytes={CHUNK}-"
    assert resumed.sent == len(hub.files[BIG]) - CHUNK
    assert report.sources[source.endpoint].failures >= 1 and report.failovers >= 1


def test_the_hf_token_goes_to_the_hub_only(pair, tmp_path, monkeypatch):
    hub, source = pair
    monkeypatch.setenv("HF_TOKEN", "hf_loopback_token")
    shard = "model-00001-of-00004.safetensors"
    source.faults.corrupt_always.add(shard)         # one file from each
    assert run(hub.files, tmp_path / "dest", [source.endpoint, "hub"]).ok
    assert source.hits and not any(h.auth for h in source.hits)
    assert [h for h in hub.hits if h.role == "hub"] and all(h.auth for h in hub.hits if h.role == "hub")


def test_a_source_list_is_checked():
    assert sources.parse_sources(None) == ["hub"]
    assert sources.parse_sources("http://a:8080/, hub") == ["http://a:8080", "hub"]
    for bad in ("ftp://a", "hub,hub", "cluster"):
        with pytest.raises(ValueError, match="source"):
            sources.parse_sources(bad)


# ---- the real nginx with the rendered configuration -------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NginxSource:
    """nginx running the configuration source_server renders, over one node's volume."""

    def __init__(self, weights_root: Path, tmp: Path, lay: w.WeightsLayout):
        self.port = free_port()
        tmp.mkdir(parents=True, exist_ok=True)
        conf = source_server.nginx_conf(lay, weights_root=str(weights_root), tmp_dir=str(tmp),
                                        port=self.port)
        conf = conf.replace("listen ", "listen 127.0.0.1:", 1)
        # Here nginx starts as root (a pod runs it as uid 1000, where `user` is ignored):
        # keep the workers' uid, so they read the test's private temporary directories.
        self.conf = tmp / "nginx.conf"
        self.conf.write_text("user root;\n" + conf)
        self.proc = subprocess.Popen([NGINX, "-e", "stderr", "-c", str(self.conf), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.url + source_server.LIVE_PATH, timeout=2).read()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(self.proc.stderr.read().decode())
                time.sleep(0.05)
        raise RuntimeError("nginx did not start")

    def status(self, path: str, method: str = "GET") -> int:
        try:
            return urllib.request.urlopen(urllib.request.Request(self.url + path, method=method),
                                          timeout=10).status
        except urllib.error.HTTPError as exc:
            return exc.code

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_nginx_serves_a_verified_copy_to_huggingface_hub(env, tmp_path, monkeypatch):
    files = make_repo()
    files[BIG] = os.urandom(CHUNK + 777)
    lay = w.WeightsLayout(REPO, GOOD_REVISION)
    lock = lock_of(files, GOOD_REVISION)

    def node(i: int) -> tuple[Path, Path]:
        root = tmp_path / f"node-{i}" / "weights"
        return root, root / lay.tree.replace(w.WEIGHTS_ROOT + "/", "", 1)

    with LoopbackHub(REPO, files, commit=GOOD_REVISION) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        root0, tree0 = node(0)
        assert run(files, tree0, ["hub"]).ok
        Path(str(tree0) + ".lock.json").write_text(tree.lock_to_json(lock))
        hub.clear_hits()
        src = NginxSource(root0, tmp_path / "nginx", lay)
        try:
            resolve = f"/{REPO}/resolve/{GOOD_REVISION}"
            assert src.status(f"{resolve}/{BIG}", "HEAD") == 200
            head = urllib.request.urlopen(urllib.request.Request(f"{src.url}{resolve}/{BIG}",
                                                                 method="HEAD"), timeout=10)
            assert head.headers["X-Repo-Commit"] == GOOD_REVISION
            assert int(head.headers["Content-Length"]) == len(files[BIG])
            ranged = urllib.request.urlopen(urllib.request.Request(
                f"{src.url}{resolve}/{BIG}", headers={"Range": "bytes=100-"}), timeout=10)
            assert ranged.status == 206 and ranged.read() == files[BIG][100:]
            assert src.status(f"{resolve}/{tree.MARKER_NAME}") == 404
            assert src.status(f"{resolve}/.cache/huggingface/x") == 404
            assert src.status(f"{resolve}/") in (403, 404)          # no listing
            assert src.status(f"{resolve}/config.json", "POST") in (403, 405)
            assert src.status(f"/{REPO}/resolve/{'1' * 40}/config.json") == 404
            # The lock beside the tree, for fills without a shipped lock.
            got = sources.lock_from_sources([src.url, "hub"], REPO, GOOD_REVISION)
            assert got == lock

            root1, tree1 = node(1)
            report = run(files, tree1, [src.url, "hub"])
            assert report.ok, report.problems
            assert_verified(files, tree1)
            assert hub.body_bytes() == 0 and hub.hits == []        # the Hub saw nothing
            assert report.sources[src.url].bytes == lock.total_bytes

            # A byte changed in the served copy after the source's start check: the
            # filling node refuses it and takes the file from the Hub.
            shard = tree0 / "model-00004-of-00004.safetensors"
            data = bytearray(shard.read_bytes())
            data[5] ^= 0x01
            shard.write_bytes(bytes(data))
            root2, tree2 = node(2)
            report = run(files, tree2, [src.url, "hub"])
            assert report.ok, report.problems
            assert_verified(files, tree2)
            assert report.refused_by_lock == 1
            assert len(hub.gets("model-00004-of-00004.safetensors")) == 1
            assert hub.body_bytes() == len(files["model-00004-of-00004.safetensors"])
        finally:
            src.stop()


# ---- the source's start check, as the rendered init container runs it -----------------

@pytest.fixture
def source_check(tmp_path):
    """The rendered init container of copy 0's source, runnable here (test_weights_pod_scripts'
    Pod), and a verified copy of a small repo where its env says the tree is."""
    from test_weights_pod_scripts import Pod, digest_of, materialize

    r = render("existing", f"weightsRevision={GOOD_REVISION}", "weights.mode=node-local",
               "replicas=3")
    runtime = materialize(r, tmp_path)
    dep = manifest(r, "Deployment", "kimi-k3-weights-source-0")
    (init,) = dep["spec"]["template"]["spec"]["initContainers"]
    files = make_repo(shards=2, shard_size=64 * 1024)
    pod = Pod(init, tmp_path, runtime, {})
    pod.env["K3_EXPECT_TREE_DIGEST"] = digest_of(files)
    lock = lock_of(files, GOOD_REVISION)
    pod.tree.mkdir(parents=True)
    for path, data in files.items():
        (pod.tree / path).parent.mkdir(parents=True, exist_ok=True)
        (pod.tree / path).write_bytes(data)
    Path(pod.env["K3_GATE_LOCK"]).write_text(tree.lock_to_json(lock))
    return pod, lock


def test_the_source_refuses_to_serve_an_unverified_tree(source_check):
    pod, lock = source_check
    res = pod.start()                                  # no marker: the prefetch never finished
    assert res.returncode != 0 and "not a verified tree" in res.stderr
    assert "hashed" not in res.stdout                  # refused before reading a byte
    verify.write_marker(str(pod.tree), lock, "0" * 64)
    res = pod.start()
    assert res.returncode == 0, res.stderr
    shard = sorted(pod.tree.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))                     # marker still there, a byte changed
    res = pod.start()
    assert res.returncode != 0 and f"{shard.name}: wrong hash" in res.stderr


def test_the_source_refuses_another_tree_even_with_its_marker(source_check):
    pod, lock = source_check
    verify.write_marker(str(pod.tree), lock, "0" * 64)
    pod.env["K3_EXPECT_TREE_DIGEST"] = "sha256:" + "ab" * 32
    res = pod.start()
    assert res.returncode != 0 and "not the pinned tree" in res.stderr


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_the_rendered_jobs_fill_copy_1_from_copy_0_with_no_hub_byte(tmp_path):
    """The rendered prefetch containers of a 3-replica node-local stack, run as pods run
    them (no lock shipped): Job 0 from the Hub; nginx over copy 0's volume; Job 1 with its
    rendered K3_WEIGHTS_SOURCES (the in-cluster name swapped for the local nginx) takes
    the lock and every byte from the source: the Hub sees nothing."""
    from hub_loopback import environment
    from test_weights_pod_scripts import Pod, digest_of, materialize

    files = make_repo(shards=2, shard_size=64 * 1024)
    r = render("existing", f"weightsRevision={GOOD_REVISION}", "weights.mode=node-local",
               "replicas=3")
    runtime = materialize(r, tmp_path)

    def job(i: int, hub) -> Pod:
        (c,) = manifest(r, "Job", f"kimi-k3-weights-prefetch-{i}")["spec"]["template"]["spec"]["containers"]
        node = tmp_path / f"node-{i}"
        node.mkdir()
        pod = Pod(c, node, runtime, environment(hub, str(node / "hf-home")))
        pod.env["K3_EXPECT_TREE_DIGEST"] = digest_of(files)
        return pod

    with LoopbackHub(REPO, files, commit=GOOD_REVISION) as hub:
        job0, job1 = job(0, hub), job(1, hub)
        assert job0.env["K3_WEIGHTS_SOURCES"] == "hub"
        done = job0.start()
        assert done.returncode == 0, done.stderr
        hub.clear_hits()
        src = NginxSource(tmp_path / "node-0" / "weights", tmp_path / "nginx",
                          w.WeightsLayout(REPO, GOOD_REVISION))
        try:
            rendered = job1.env["K3_WEIGHTS_SOURCES"]
            assert rendered == "http://kimi-k3-weights-source-0.kimi-k3.svc:8080,hub"
            job1.env["K3_WEIGHTS_SOURCES"] = rendered.replace(
                "http://kimi-k3-weights-source-0.kimi-k3.svc:8080", src.url)
            done = job1.start()
            assert done.returncode == 0, done.stderr
        finally:
            src.stop()
        assert hub.hits == []                                   # no metadata, no byte
        assert f"lock: {REPO}@{GOOD_REVISION} from cluster source {src.url}" in done.stdout
        assert f"cluster source {src.url}: {len(files)} files" in done.stdout
        lock = lock_of(files, GOOD_REVISION)
        assert verify.verify_tree(str(job1.tree), lock).ok
        assert verify.marker_problem(str(job1.tree), lock) is None
