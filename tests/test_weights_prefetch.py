"""Prefetch through the real huggingface_hub client against a loopback Hub
(tests/hub_loopback.py): clean, resumed, corrupt, truncated, missing, extra, symlink,
out of space, wrong lock; the marker only ever names a tree that matches."""
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

import pytest
from hub_loopback import LoopbackHub, environment, make_repo

from k3infra.weights import prefetch, runtime_paths, tree, verify
from k3infra.weights.tree import FileEntry

REPO = "moonshotai/loopback-k3"
BIG = "model-00002-of-00004.safetensors"
CHUNK = 10 * 1024 * 1024   # huggingface_hub writes downloads in 10 MiB chunks


def lock_of(files: dict, revision: str) -> tree.Lock:
    """The lock computed straight from the repo's bytes (independent of lock_from_hub)."""
    return tree.make_lock(REPO, revision, [FileEntry(p, len(d), hashlib.sha256(d).hexdigest())
                                           for p, d in files.items()])


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with LoopbackHub(REPO, make_repo()) as h:
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv(prefetch.FREE_BYTES_ENV, raising=False)
        yield h


@pytest.fixture
def big_hub(tmp_path, monkeypatch):
    """A repo with one shard larger than huggingface_hub's 10 MiB write chunk, so a
    partial download holds whole chunks to resume from."""
    files = make_repo()
    files[BIG] = os.urandom(2 * CHUNK + 12345)
    with LoopbackHub(REPO, files) as h:
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield h


def run(hub, dest, **kw):
    lines: list[str] = []
    lock = kw.pop("lock", None) or lock_of(hub.files, hub.commit)
    report = prefetch.prefetch(lock, "0" * 64, str(dest), emit=lines.append, interval=0.2, **kw)
    report.lines = lines
    return report


def fetched(hub) -> dict:
    """path -> number of GETs that carried its bytes."""
    return {p: len(hub.gets(p)) for p in hub.files if hub.gets(p)}


def assert_verified(hub, dest):
    lock = lock_of(hub.files, hub.commit)
    assert verify.verify_tree(str(dest), lock, full=True).ok
    assert verify.marker_problem(str(dest), lock) is None


def test_clean_prefetch_writes_the_tree_and_the_marker(hub, tmp_path):
    dest = tmp_path / "dest"
    report = run(hub, dest)
    assert report.ok, report.problems
    assert_verified(hub, dest)
    assert fetched(hub) == {p: 1 for p in hub.files}
    assert not (dest / ".cache").exists()                      # scratch removed
    marker = verify.read_marker(str(dest))
    assert marker["revision"] == hub.commit and marker["files"] == len(hub.files)
    assert marker["bytes"] == sum(len(d) for d in hub.files.values())


def test_token_reaches_the_hub_but_not_the_cdn(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_loopback_token")
    assert run(hub, tmp_path / "dest").ok
    assert all(h.auth for h in hub.hits if h.role == "hub")
    cdn = [h for h in hub.hits if h.role == "cdn"]
    assert cdn and not any(h.auth for h in cdn)


def test_verified_tree_is_not_fetched_again(hub, tmp_path):
    dest = tmp_path / "dest"
    assert run(hub, dest).ok
    hub.clear_hits()
    again = run(hub, dest)
    assert again.ok and again.downloaded_files == 0
    assert hub.hits == []                                      # not even a HEAD


def test_dropped_connection_resumes_with_a_range_request(big_hub, tmp_path):
    big_hub.faults.drop_once[BIG] = CHUNK + 5000
    report = run(big_hub, tmp_path / "dest")
    assert report.ok, report.problems
    first, second = big_hub.gets(BIG)
    assert first.range is None and second.range == f"bytes={CHUNK}-"
    assert second.sent == len(big_hub.files[BIG]) - CHUNK
    assert_verified(big_hub, tmp_path / "dest")


def runtime_package(tmp_path: Path) -> Path:
    """The runtime files as the pods get them: a top-level package `k3weights`."""
    pkg = tmp_path / "runtime" / "k3weights"
    pkg.mkdir(parents=True)
    for name, path in runtime_paths().items():
        shutil.copy(path, pkg / name)
    return pkg.parent


def test_killed_prefetch_resumes_in_a_new_process(big_hub, tmp_path):
    dest = tmp_path / "dest"
    lock_file = tmp_path / "lock.json"
    lock_file.write_text(tree.lock_to_json(lock_of(big_hub.files, big_hub.commit)))
    env = environment(big_hub, str(tmp_path / "hf-home"))
    env["PYTHONPATH"] = str(runtime_package(tmp_path))
    cmd = [sys.executable, "-m", "k3weights", "prefetch", "--lock", str(lock_file), "--dest", str(dest)]
    big_hub.faults.stall[BIG] = CHUNK + 5000
    first = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    staging = Path(prefetch.staging_path(str(dest)))      # a new tree lands here first
    partial = Path(prefetch.partial_path(str(staging), lock_of(big_hub.files, big_hub.commit).by_path[BIG]))
    deadline = time.monotonic() + 60
    others = [p for p in big_hub.files if p != BIG]
    while time.monotonic() < deadline:
        done = all((staging / p).exists() for p in others)
        if done and partial.exists() and partial.stat().st_size >= CHUNK:
            break
        time.sleep(0.05)
    else:
        first.kill()
        pytest.fail(f"the first prefetch never got half-way: {first.communicate()}")
    first.send_signal(signal.SIGKILL)
    first.communicate()
    assert not dest.exists() and not (staging / tree.MARKER_NAME).exists()
    big_hub.faults.stall.clear()
    big_hub.faults.released.set()
    gets_before = fetched(big_hub)
    second = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    gets_after = fetched(big_hub)
    # Completed files were not downloaded again; the interrupted one continued.
    assert {p: gets_after[p] - gets_before[p] for p in others} == {p: 0 for p in others}
    resumed = big_hub.gets(BIG)[-1]
    assert resumed.range == f"bytes={CHUNK}-"
    assert resumed.sent == len(big_hub.files[BIG]) - CHUNK
    assert_verified(big_hub, dest)


def test_corrupt_byte_from_the_hub_is_deleted_and_fetched_again(hub, tmp_path):
    shard = "model-00003-of-00004.safetensors"
    hub.faults.corrupt_once.add(shard)
    report = run(hub, tmp_path / "dest")
    assert report.ok, report.problems
    assert fetched(hub)[shard] == 2
    assert any(f"{shard}: wrong hash" in line and "fetching it again" in line for line in report.lines)
    assert_verified(hub, tmp_path / "dest")


def test_persistently_corrupt_file_fails_without_a_marker(hub, tmp_path):
    shard = "model-00001-of-00004.safetensors"
    hub.faults.corrupt_always.add(shard)
    dest = tmp_path / "dest"
    report = run(hub, dest)
    assert not report.ok
    assert [p.path for p in report.problems] == [shard]
    assert "wrong hash" in report.problems[0].message and "3 download(s)" in report.problems[0].message
    assert fetched(hub)[shard] == 3
    assert not (dest / shard).exists()
    assert not (dest / tree.MARKER_NAME).exists()
    hub.faults.corrupt_always.clear()                   # the Hub recovers: a rerun completes
    assert run(hub, dest).ok


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "delete"])
def test_damaged_local_file_is_refetched_alone(hub, tmp_path, damage):
    dest = tmp_path / "dest"
    assert run(hub, dest).ok
    shard = dest / "model-00004-of-00004.safetensors"
    if damage == "corrupt":
        data = bytearray(shard.read_bytes())
        data[7] ^= 0x80
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        os.truncate(shard, 1000)
    else:
        shard.unlink()
    assert not verify.verify_tree(str(dest), lock_of(hub.files, hub.commit)).ok
    hub.clear_hits()
    report = run(hub, dest)
    assert report.ok, report.problems
    assert fetched(hub) == {"model-00004-of-00004.safetensors": 1}
    assert report.reused_files == len(hub.files) - 1
    assert_verified(hub, dest)


def test_extra_file_is_refused_before_anything_is_fetched(hub, tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "model-00099-of-00099.safetensors").write_bytes(b"stale shard")
    report = run(hub, dest)
    assert not report.ok
    assert [p.path for p in report.problems] == ["model-00099-of-00099.safetensors"]
    assert "extra file" in report.problems[0].message
    assert hub.hits == [] and sorted(os.listdir(dest)) == ["model-00099-of-00099.safetensors"]


def test_symlink_escaping_the_tree_is_refused(hub, tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (tmp_path / "elsewhere.json").write_text("{}")
    (dest / "config.json").symlink_to(tmp_path / "elsewhere.json")
    report = run(hub, dest)
    assert not report.ok and hub.hits == []
    assert report.problems[0].path == "config.json"
    assert "symlink escaping the tree" in report.problems[0].message


def test_not_enough_disk_writes_nothing(hub, tmp_path, monkeypatch):
    total = sum(len(d) for d in hub.files.values())
    monkeypatch.setenv(prefetch.FREE_BYTES_ENV, str(total - 1))
    dest = tmp_path / "dest"
    report = run(hub, dest)
    assert not report.ok and hub.hits == []
    assert "not enough free space" in report.problems[0].message
    assert f"{total} bytes" in report.problems[0].message
    assert not dest.exists()
    dest.mkdir()                                       # the Job's `mkdir -p` ran first
    assert not run(hub, dest).ok and os.listdir(dest) == []


def test_free_space_counts_only_what_is_still_to_fetch(hub, tmp_path, monkeypatch):
    dest = tmp_path / "dest"
    assert run(hub, dest).ok
    shard = "model-00002-of-00004.safetensors"
    (dest / shard).unlink()
    monkeypatch.setenv(prefetch.FREE_BYTES_ENV, str(len(hub.files[shard])))
    assert run(hub, dest).ok


def test_stale_marker_is_removed_when_the_tree_no_longer_matches(hub, tmp_path):
    dest = tmp_path / "dest"
    assert run(hub, dest).ok
    shard = "model-00001-of-00004.safetensors"
    (dest / shard).unlink()
    hub.faults.corrupt_always.add(shard)
    assert not run(hub, dest).ok
    assert not (dest / tree.MARKER_NAME).exists()


def test_lock_for_a_revision_the_hub_does_not_have_fails_without_retrying(hub, tmp_path):
    lock = lock_of(hub.files, "e" * 40)
    report = run(hub, tmp_path / "dest", lock=lock)
    assert not report.ok and len(report.problems) == len(hub.files)
    assert all("RevisionNotFoundError" in p.message and "after 1 attempt" in p.message
               for p in report.problems)
    assert not (tmp_path / "dest" / tree.MARKER_NAME).exists()


def test_lock_that_disagrees_with_the_hub_is_refused(hub, tmp_path):
    files = dict(hub.files)
    files["model-00001-of-00004.safetensors"] += b"more"          # the lock of another tree
    report = run(hub, tmp_path / "dest", lock=lock_of(files, hub.commit))
    assert [p.path for p in report.problems] == ["model-00001-of-00004.safetensors"]
    assert "the lock is not for this revision" in report.problems[0].message
    assert fetched(hub).get("model-00001-of-00004.safetensors") is None


def test_without_overlap_the_tree_is_verified_all_the_same(hub, tmp_path):
    hub.faults.corrupt_once.add("config.json")
    report = run(hub, tmp_path / "dest", overlap=False)
    assert report.ok, report.problems
    assert fetched(hub)["config.json"] == 2
    assert_verified(hub, tmp_path / "dest")


def test_lock_from_hub_fetches_no_shard_and_equals_the_lock_of_the_local_tree(hub, tmp_path):
    hub_lock = prefetch.lock_from_hub(REPO, hub.commit)
    assert not any(fetched(hub).get(p) for p in hub.files if p.endswith(".safetensors"))
    assert hub_lock == lock_of(hub.files, hub.commit)
    dest = tmp_path / "dest"
    assert run(hub, dest).ok
    dir_lock = verify.lock_from_dir(str(dest), REPO, hub.commit)
    assert tree.lock_to_json(dir_lock) == tree.lock_to_json(hub_lock)


def test_lock_from_hub_refuses_an_unknown_revision(hub):
    with pytest.raises(tree.LockError, match="404 Not Found .RevisionNotFound"):
        prefetch.lock_from_hub(REPO, "d" * 40)
    with pytest.raises(tree.LockError, match="40-hex"):
        prefetch.lock_from_hub(REPO, "main")


@pytest.mark.parametrize("xet_installed", [False, True])
def test_xet_backed_files(tmp_path, monkeypatch, xet_installed):
    """Xet-advertised files: with hf_xet usable they go through hf_hub_download (which owns
    Xet transfers); without it, through the resumable plain-HTTP path. The loopback has no
    CAS server, so huggingface_hub itself runs with Xet disabled in both cases."""
    import huggingface_hub.constants
    from huggingface_hub import file_download

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    calls: list[str] = []
    real = file_download.hf_hub_download

    def counting(repo_id, filename, **kw):
        calls.append(filename)
        return real(repo_id, filename, **kw)

    monkeypatch.setattr(file_download, "hf_hub_download", counting)
    with LoopbackHub(REPO, make_repo(), advertise_xet=True) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        dest = tmp_path / "dest"
        lock = lock_of(hub.files, hub.commit)
        fetcher = prefetch._Fetcher(lock, prefetch.staging_path(str(dest)), None, None)
        assert fetcher.xet is False
        fetcher.xet = xet_installed
        report = run(hub, dest, lock=lock, fetcher=fetcher)
        assert report.ok, report.problems
        lfs = sorted(p for p in hub.files if hub.lfs(p))
        assert sorted(calls) == (lfs if xet_installed else [])
        assert not (dest / ".cache").exists()
        assert_verified(hub, dest)


def test_second_prefetch_on_the_same_tree_waits_for_the_first(hub, tmp_path):
    import fcntl
    import threading

    dest = tmp_path / "dest"
    holder = os.open(tmp_path, os.O_RDONLY)            # the lock is on the tree's parent
    fcntl.flock(holder, fcntl.LOCK_EX)                 # another prefetch (a retried Job pod)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.setdefault("report", run(hub, dest)))
    worker.start()
    worker.join(timeout=1.0)
    assert worker.is_alive() and hub.hits == []        # blocked before planning or fetching
    os.close(holder)
    worker.join(timeout=60)
    report = result["report"]
    assert report.ok and any("waiting for it" in line for line in report.lines)


def test_background_hasher_runs_in_sched_idle_processes(tmp_path):
    """While downloads run, hashing takes only idle CPU, in its own processes: a SCHED_IDLE
    thread would share the interpreter lock with the download threads."""
    idle = verify.Hasher(1, background=True)
    normal = verify.Hasher(1)
    data = os.urandom(70_000)
    (tmp_path / "f").write_bytes(data)
    try:
        assert idle.pool.submit(os.sched_getscheduler, 0).result() == os.SCHED_IDLE
        assert idle.pool.submit(os.getpid).result() != os.getpid()
        assert normal.pool.submit(os.sched_getscheduler, 0).result() == os.SCHED_OTHER
        for hasher in (idle, normal):
            result = hasher.submit(str(tmp_path / "f")).result()
            assert (result.sha256, result.size) == (hashlib.sha256(data).hexdigest(), len(data))
        with pytest.raises(OSError):
            idle.submit(str(tmp_path / "absent")).result()
    finally:
        idle.close()
        normal.close()
    assert idle.cpu_seconds > 0            # the workers' CPU, counted once they have exited


def test_hashing_yields_to_downloads_and_uses_normal_threads_after(tmp_path, monkeypatch):
    """A fetcher standing in for the Hub (no HTTP): a file that lands while a download runs
    goes to the background (SCHED_IDLE) hasher, at most `workers` hashes at once; once the
    last download has landed, the normal threads hash."""
    import threading

    files = {f"model-{i:05d}.safetensors": os.urandom(4096 + i) for i in range(9)}
    lock = tree.make_lock(REPO, "a" * 40, [FileEntry(p, len(d), hashlib.sha256(d).hexdigest())
                                          for p, d in files.items()])
    dest = tmp_path / "dest"
    guard = threading.Lock()
    state = {"downloading": 0}
    seen: list[tuple[int, int, bool]] = []      # (downloads running, hashes at once, background)

    def fetcher(entry):
        with guard:
            state["downloading"] += 1
        try:
            time.sleep(0.05)
            # A new tree lands in the staging directory, renamed into place at the end.
            (Path(prefetch.staging_path(str(dest))) / entry.path).write_bytes(files[entry.path])
        finally:
            with guard:
                state["downloading"] -= 1

    real_submit = verify.Hasher.submit
    futures: list = []

    def submit(self, path):
        with guard:     # hashes in flight as the prefetch sees them: futures not done yet
            running = sum(1 for f in futures if not f.done()) + 1
            seen.append((state["downloading"], running, self.background))
        fut = real_submit(self, path)
        futures.append(fut)
        return fut

    monkeypatch.setattr(verify.Hasher, "submit", submit)
    monkeypatch.delenv(prefetch.FREE_BYTES_ENV, raising=False)
    report = prefetch.prefetch(lock, "0" * 64, str(dest), workers=4, download_workers=3,
                               fetcher=fetcher, emit=None)
    assert report.ok, report.problems
    assert all(h <= 4 for _, h, _ in seen), seen
    overlapped = [bg for d, _, bg in seen if d > 0]
    assert overlapped and set(overlapped) == {True}, seen          # hashing did overlap
    assert False in {bg for d, _, bg in seen if d == 0}, seen       # normal threads after
    assert report.hash_cpu_seconds > 0 and "hashing CPU" in report.summary()


def test_without_background_hashing_files_are_hashed_after_the_downloads(tmp_path, monkeypatch):
    """Where the background pool cannot start (no /dev/shm for its queues), the prefetch
    says so and verifies after the downloads instead of failing."""
    files = {f"model-{i:05d}.safetensors": os.urandom(2048 + i) for i in range(4)}
    lock = tree.make_lock(REPO, "a" * 40, [FileEntry(p, len(d), hashlib.sha256(d).hexdigest())
                                          for p, d in files.items()])
    dest = tmp_path / "dest"
    downloading = []

    def fetcher(entry):
        downloading.append(entry.path)
        (Path(prefetch.staging_path(str(dest))) / entry.path).write_bytes(files[entry.path])
        downloading.remove(entry.path)

    real_init, real_submit = verify.Hasher.__init__, verify.Hasher.submit
    submitted_while_fetching = []

    def init(self, workers=None, *, background=False):
        if background:
            raise OSError(38, "Function not implemented")     # what sem_open says there
        real_init(self, workers)

    def submit(self, path):
        submitted_while_fetching.append(bool(downloading))
        return real_submit(self, path)

    monkeypatch.setattr(verify.Hasher, "__init__", init)
    monkeypatch.setattr(verify.Hasher, "submit", submit)
    monkeypatch.delenv(prefetch.FREE_BYTES_ENV, raising=False)
    lines: list[str] = []
    report = prefetch.prefetch(lock, "0" * 64, str(dest), workers=2, download_workers=2,
                               fetcher=fetcher, emit=lines.append)
    assert report.ok, report.problems
    assert submitted_while_fetching and not any(submitted_while_fetching)
    assert any("no background hashing" in line for line in lines), lines


# ---- issue 21: trust, staging, flock, backoff ------------------------------------------

def test_prefetch_rehashes_a_tampered_file_despite_a_forged_stamp(hub, tmp_path):
    """Issue 21, reproduced: rewrite a verified file, write its new stamp where older
    versions read stamps, re-run the prefetch. It used to count the file as verified and
    write a fresh marker; now it re-hashes, deletes and fetches the file again."""
    dest = tmp_path / "dest"
    assert run(hub, dest).ok
    shard = dest / "model-00003-of-00004.safetensors"
    shard.write_bytes(os.urandom(shard.stat().st_size))
    lock = lock_of(hub.files, hub.commit)
    (dest / tree.STATE_NAME).write_text(json.dumps({"format": "k3-verify-state/1", "files": {
        e.path: [*tree.stamp_of(os.lstat(dest / e.path)), e.sha256] for e in lock.files}}))
    hub.clear_hits()
    report = run(hub, dest)
    assert report.ok, report.problems
    assert fetched(hub) == {shard.name: 1}
    assert report.reused_files == len(hub.files) - 1
    assert not (dest / tree.STATE_NAME).exists()              # the forgery is removed
    assert_verified(hub, dest)


def test_a_new_revision_is_staged_beside_the_old_tree_then_renamed(hub, tmp_path, monkeypatch):
    old = tmp_path / "repo" / "a"
    assert run(hub, old).ok
    new_files = dict(hub.files, **{"config.json": b'{"revision": 2}\n'})
    with LoopbackHub(REPO, new_files) as hub2:
        monkeypatch.setenv("HF_ENDPOINT", hub2.endpoint)
        new = tmp_path / "repo" / "b"
        lines: list[str] = []
        report = prefetch.prefetch(lock_of(new_files, hub2.commit), "0" * 64, str(new),
                                   emit=lines.append, interval=0.2)
        assert report.ok, report.problems
        assert report.dest == str(new)
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["a", "b"]   # staging gone
    assert verify.verify_tree(str(old), lock_of(hub.files, hub.commit)).ok
    assert verify.verify_tree(str(new), lock_of(new_files, hub2.commit)).ok


def test_a_filesystem_without_flock_is_refused(hub, tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    report = run(hub, tmp_path / "dest")
    assert not report.ok and report.marker is None
    assert "cannot flock" in str(report.problems[0])
    assert hub.hits == [] and not (tmp_path / "dest").exists()


class _HttpError(Exception):
    def __init__(self, headers):
        super().__init__("429 Too Many Requests")
        self.response = type("R", (), {"headers": headers})()


def test_backoff_honours_retry_after_else_grows_exponentially():
    assert prefetch.backoff_seconds(_HttpError({"Retry-After": "7"}), 1) == 7.0
    assert prefetch.backoff_seconds(_HttpError({"Retry-After": "86400"}), 1) == \
        prefetch.RETRY_AFTER_CAP_SECONDS
    import email.utils

    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= prefetch.backoff_seconds(_HttpError({"Retry-After": later}), 1) <= 30
    for attempt, ceiling in ((1, 2.0), (2, 4.0), (3, 8.0), (10, 60.0)):
        waits = [prefetch.backoff_seconds(OSError("reset"), attempt) for _ in range(50)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits), (attempt, waits)


def test_a_prefetch_that_waited_finds_the_tree_the_other_renamed_into_place(hub, tmp_path):
    import fcntl
    import threading

    assert run(hub, tmp_path / "src").ok               # a verified tree to "land" later
    hub.clear_hits()
    dest = tmp_path / "dest"
    holder = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)                 # the other prefetch is running
    result: dict = {}
    worker = threading.Thread(target=lambda: result.setdefault("report", run(hub, dest)))
    worker.start()
    worker.join(timeout=1.0)
    assert worker.is_alive()
    shutil.copytree(tmp_path / "src", dest)             # ...and renames its tree into place
    os.close(holder)
    worker.join(timeout=60)
    report = result["report"]
    assert report.ok and report.downloaded_files == 0 and report.dest == str(dest)
    assert not (tmp_path / prefetch.STAGING_DIR).exists()
    assert fetched(hub) == {}


def test_stalled_transfer_is_restarted_from_where_it_stopped(big_hub, tmp_path, monkeypatch):
    """The Hub stand-in stops sending mid-file (after one 10 MiB chunk landed) and holds
    the connection open: the watchdog abandons that transfer and resumes it with a Range
    request, long before huggingface_hub's own read timeout would."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 120)
    big_hub.faults.stall_once[BIG] = CHUNK + 5000
    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        if "restarting the transfer" in line:
            big_hub.faults.released.set()    # let the abandoned connection end

    lock = lock_of(big_hub.files, big_hub.commit)
    report = prefetch.prefetch(lock, "0" * 64, str(tmp_path / "dest"), emit=emit, interval=0.1,
                               stall_seconds=1.0)
    assert report.ok, report.problems
    restarts = [line for line in lines if "restarting the transfer" in line]
    assert len(restarts) == 1 and f"{BIG}: no progress for 1 s at {CHUNK} bytes" in restarts[0]
    first, second = big_hub.gets(BIG)[:2]
    assert first.range is None and first.sent == CHUNK + 5000
    assert second.range == f"bytes={CHUNK}-" and second.sent == len(big_hub.files[BIG]) - CHUNK
    assert_verified(big_hub, tmp_path / "dest")


def test_stall_watch_counts_only_time_without_growth():
    watch = prefetch.StallWatch(10)
    watch.started("a", 0, at=100.0)
    assert not watch.stalled("a", 0, 105.0)
    assert not watch.stalled("a", 5, 109.0)          # grew: the clock restarts
    assert not watch.stalled("a", 5, 118.0)
    assert watch.stalled("a", 5, 119.0)
    watch.started("b", 0, at=200.0)                    # a backoff delay ends at 200
    assert not watch.stalled("b", 0, 150.0) and not watch.stalled("b", 0, 209.0)
    tickets = []
    stale = watch.bind("a", lambda e: tickets.append(watch.begin("a")))
    watch.abandon("a")
    fresh = watch.bind("a", lambda e: tickets.append(watch.begin("a")))
    fresh(None)
    stale(None)                    # an abandoned download that only starts now
    with pytest.raises(prefetch.TransferAbandoned):
        watch.guarded("a", tickets[1], lambda: None)
    done = []
    watch.guarded("a", tickets[0], lambda: done.append(True))
    assert done == [True] and watch.restarts == {"a": 1} and watch.watching("a")
    assert not watch.watching("b")                     # never on plain HTTP (Xet)


def test_an_hf_xet_older_than_the_hang_fixes_keeps_the_prefetch_on_plain_http(monkeypatch):
    from importlib import metadata

    monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)
    monkeypatch.setattr(metadata, "version", lambda name: "1.5.1")
    assert prefetch.xet_too_old() == "1.5.1"
    prefetch.hub_environment()
    assert os.environ["HF_HUB_DISABLE_XET"] == "1"
    monkeypatch.delenv("HF_HUB_DISABLE_XET")
    monkeypatch.setattr(metadata, "version", lambda name: "1.5.2")
    assert prefetch.xet_too_old() is None
    prefetch.hub_environment()
    assert "HF_HUB_DISABLE_XET" not in os.environ
