"""Parallel verifier of a weights tree against its lock (standard library only: runs in pods).

Hashing runs in threads over large reads: CPython's hashlib and file reads release the
GIL for big buffers, so N threads approach N x one core's SHA-256 speed. Files are
scheduled largest first so the last core is not left with the biggest shard.

Stamps: a file that hashes to its lock digest gets a stamp (size, mtime_ns, ctime_ns,
inode) in `Report.good`. The verifier reads no stamps from the tree: anyone who can
write the weights volume could forge them. A caller may pass `stamps` it holds itself
(the prefetch's own in-memory stamps of this run; the serving gate's pod-private record,
k3weights.gate) and only those let a file skip its re-hash.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable

from . import tree
from .tree import FileEntry, Lock, Problem

MARKER_FORMAT = "k3-verified/1"
PROGRESS_SECONDS = 5.0

Emit = Callable[[str], None]


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


class Progress:
    """Plain-text progress lines at most every `interval` seconds (pod logs, no TTY)."""

    def __init__(self, label: str, total_files: int, total_bytes: int, emit: Emit | None,
                 interval: float = PROGRESS_SECONDS):
        self.label, self.total_files, self.total_bytes = label, total_files, total_bytes
        self.emit, self.interval = emit, interval
        self.files = self.bytes = 0
        self.start = self.last = time.monotonic()
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.files += 1
            self.bytes += nbytes
            now = time.monotonic()
            if self.emit is None or now - self.last < self.interval:
                return
            self.last = now
            rate = self.bytes / max(now - self.start, 1e-9) / 1e9
            line = (f"{self.label}: {self.files}/{self.total_files} files, "
                    f"{_gb(self.bytes)}/{_gb(self.total_bytes)}, {rate:.2f} GB/s")
        self.emit(line)


def _idle_worker(parent: int) -> None:
    """Initializer of a background hashing process (Linux; elsewhere a no-op): SCHED_IDLE,
    so it gets a core only when nothing else wants it (an unprivileged process cannot
    leave it: these workers never do foreground work), and killed with its parent, so a
    killed prefetch leaves no hasher behind holding its output pipes."""
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is not None:
        try:
            os.sched_setscheduler(0, policy, os.sched_param(0))
        except OSError:
            pass
    if sys.platform.startswith("linux"):
        import ctypes       # in the hashing process only: see Hasher.__init__

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:          # the parent died before prctl took effect
            os._exit(1)


class Hasher:
    """A pool of hashers that counts the CPU time they spend (benchmarks and the prefetch
    report show what hashing cost). Foreground: threads, each with its own read buffer.
    Background (`background=True`): worker *processes* under SCHED_IDLE. Threads would
    share the interpreter lock with the download threads, and a SCHED_IDLE thread that
    holds it while the scheduler keeps it off the CPU stalls every download (priority
    inversion; docs/weights.md has the A/B). A process has its own lock."""

    def __init__(self, workers: int | None = None, *, background: bool = False):
        self.workers = max(1, workers or tree.default_workers())
        self.background = background
        self._local = threading.local()
        self._cpu_lock = threading.Lock()
        self.cpu_seconds = 0.0
        # The pools' modules here, not at the top: only the prefetch hashes through a
        # Hasher, and `verify` (verify_tree) never loads concurrent.futures,
        # multiprocessing, ctypes and what they bring (pickle, socket, subprocess,
        # logging: ~0.03 s, python -X importtime).
        from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

        if background:
            import multiprocessing

            # spawn, not fork: this process runs download threads (fork would copy their locks).
            self._children_cpu = _children_cpu(resource)
            self.pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_idle_worker,
                                            initargs=(os.getpid(),),
                                            mp_context=multiprocessing.get_context("spawn"))
        else:
            self.pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="k3-hash")

    def _buf(self) -> bytearray:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = bytearray(tree.READ_SIZE)
        return buf

    def _hash(self, path: str) -> "tree.FileHash":
        cpu = time.thread_time()
        try:
            return tree.hash_file(path, self._buf())
        finally:
            spent = time.thread_time() - cpu
            with self._cpu_lock:
                self.cpu_seconds += spent

    def submit(self, path: str):
        """Future of tree.FileHash (raises OSError when the file cannot be read)."""
        if self.background:
            return self.pool.submit(tree.hash_file, path)
        return self.pool.submit(self._hash, path)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        if self.background:         # the workers have exited and been waited for: counted
            self.cpu_seconds += _children_cpu(resource) - self._children_cpu
            self._children_cpu = _children_cpu(resource)


def _children_cpu(resource) -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def hash_files(paths: list, workers: int | None, done: Callable, limits: list | None = None) -> None:
    """Hash `paths` (taken in this order) on `workers` threads and call `done(index,
    FileHash or OSError)` for each, one call at a time. The verifier and the lock builder
    know their whole list up front, so plain threads do; the prefetch, which submits files
    as they land and waits on downloads and hashes together, uses Hasher's futures.
    (concurrent.futures imports logging: ~13 ms on every verify and every pod's gate.)
    `limits[i]`: the most bytes paths[i] may hold (tree.hash_file's `limit`)."""
    todo = iter(enumerate(paths))
    lock = threading.Lock()
    failure: list = []

    def work() -> None:
        buf = bytearray(tree.READ_SIZE)
        while True:
            with lock:
                item = None if failure else next(todo, None)
            if item is None:
                return
            index, path = item
            try:
                try:
                    result = tree.hash_file(path, buf, limits[index] if limits else None)
                except OSError as exc:
                    result = exc
                with lock:
                    done(index, result)
            except BaseException as exc:        # a bug or an interrupt: stop, re-raise below
                with lock:
                    failure.append(exc)
                return

    threads = [threading.Thread(target=work, name=f"k3-hash-{n}", daemon=True)
               for n in range(min(max(1, workers or tree.default_workers()), len(paths)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failure:
        raise failure[0]


class Report:
    """What a verify found (a plain class: see tree.py on dataclasses)."""

    def __init__(self, root: str, files: int = 0, bytes: int = 0) -> None:
        self.root, self.files, self.bytes = root, files, bytes
        self.problems: list = []        # [Problem]
        self.hashed_files = self.hashed_bytes = self.stamped_files = 0
        self.seconds = 0.0
        self.good: dict = {}            # path -> stamp of files that match

    def __repr__(self) -> str:
        return f"Report({self.summary()!r}, problems={self.problems!r})"

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def gbps(self) -> float:
        return self.hashed_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def summary(self) -> str:
        verdict = "OK" if self.ok else f"FAILED ({len(self.problems)} problem(s))"
        return (f"verify {verdict}: {self.files} files, {_gb(self.bytes)} in {self.root}; "
                f"hashed {self.hashed_files} files / {_gb(self.hashed_bytes)} at {self.gbps:.2f} GB/s, "
                f"{self.stamped_files} unchanged by stamp; {self.seconds:.2f} s")


# ---- marker ------------------------------------------------------------------------

def marker_path(root: str) -> str:
    return os.path.join(root, tree.MARKER_NAME)


def read_marker(root: str) -> dict | None:
    """The marker's JSON object; None when absent, not a small regular file or not JSON."""
    try:
        data = json.loads(tree.read_regular(marker_path(root), tree.SMALL_MAX_BYTES))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def marker_problem(root: str, lock: Lock) -> str | None:
    """None when the marker names this lock's tree digest, repo and revision."""
    data = read_marker(root)
    if data is None:
        return (f"no valid marker {tree.MARKER_NAME}: the prefetch has not completed "
                "(or the marker is unreadable)")
    for key, want in (("tree_digest", lock.tree_digest), ("repo", lock.repo),
                      ("revision", lock.revision)):
        if data.get(key) != want:
            return f"marker names {key} {data.get(key)!r}, the lock has {want!r}"
    return None


def write_marker(root: str, lock: Lock, lock_sha256: str) -> dict:
    # Here, not at import: the verify and gate paths never write a marker, and what they
    # do not need costs every pod's gate start-up (issue 18, ~25 ms with the rest;
    # tests/test_weights_runtime.py).
    import datetime

    data = {"format": MARKER_FORMAT, "algorithm": tree.ALGORITHM, "tree_digest": lock.tree_digest,
            "lock_sha256": lock_sha256, "repo": lock.repo, "revision": lock.revision,
            "files": len(lock.files), "bytes": lock.total_bytes,
            "verified_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    tree.atomic_write_json(marker_path(root), data)
    return data


def remove_marker(root: str) -> None:
    try:
        os.unlink(marker_path(root))
    except FileNotFoundError:
        return
    tree.fsync_dir(root)


# ---- the verifier --------------------------------------------------------------------

def size_problem(entry: FileEntry, size: int) -> str | None:
    if size < entry.size:
        return f"truncated: {size} of {entry.size} bytes"
    if size > entry.size:
        return f"grown: {size} bytes, the lock says {entry.size}"
    return None


def check_hash(entry: FileEntry, result: "tree.FileHash") -> str | None:
    """None when the hashed file is the locked one and did not change while read."""
    if tree.stamp_of(result.before) != tree.stamp_of(result.after):
        return "changed while being verified"
    problem = size_problem(entry, result.size)
    if problem:
        return problem
    if result.sha256 != entry.sha256:
        return f"wrong hash: sha256 {result.sha256}, the lock says {entry.sha256}"
    return None


def stamp_valid(state: dict, entry: FileEntry, st: os.stat_result) -> bool:
    recorded = state.get(entry.path)
    return recorded is not None and recorded[4] == entry.sha256 and \
        tuple(recorded[:4]) == tree.stamp_of(st)


def verify_tree(root: str, lock: Lock, *, stamps: dict | None = None,
                workers: int | None = None, emit: Emit | None = None,
                interval: float = PROGRESS_SECONDS, full: bool = True) -> Report:
    """Check that `root` holds exactly the lock's files with the lock's contents: every
    file is read and hashed, except those whose current stamp matches `stamps` (path ->
    stamp + sha256), which the caller must have written itself after hashing them.
    `full` is kept for callers of the former stamp-file API: verification is always full
    unless trusted stamps are passed."""
    start = time.monotonic()
    report = Report(root=root, files=len(lock.files), bytes=lock.total_bytes)
    if not os.path.isdir(root):
        report.problems.append(Problem(".", f"{root} is not a directory"))
        report.seconds = time.monotonic() - start
        return report
    scan = tree.scan_tree(root)
    report.problems.extend(scan.problems)
    for rel in sorted(set(scan.files) - set(lock.by_path)):
        report.problems.append(Problem(rel, "extra file, not in the lock"))
    state = stamps or {}
    to_hash: list[FileEntry] = []
    for entry in lock.files:
        st = scan.files.get(entry.path)
        if st is None:
            if entry.path not in scan.problem_paths:
                report.problems.append(Problem(entry.path, "missing"))
            continue
        problem = size_problem(entry, st.st_size)
        if problem:
            report.problems.append(Problem(entry.path, problem))
        elif stamp_valid(state, entry, st):
            report.stamped_files += 1
            report.good[entry.path] = tuple(state[entry.path])
        else:
            to_hash.append(entry)
    if to_hash:
        _hash_entries(root, to_hash, workers, emit, interval, report)
    report.problems.sort(key=lambda p: p.path)
    report.seconds = time.monotonic() - start
    return report


def _hash_entries(root: str, entries: list[FileEntry], workers: int | None, emit: Emit | None,
                  interval: float, report: Report) -> None:
    entries = sorted(entries, key=lambda e: -e.size)   # largest first: balanced tail
    progress = Progress("verify", len(entries), sum(e.size for e in entries), emit, interval)

    def done(index: int, result) -> None:
        entry = entries[index]
        if isinstance(result, OSError):
            report.problems.append(Problem(entry.path, f"cannot read ({result.strerror or result})"))
            return
        report.hashed_files += 1
        report.hashed_bytes += result.size
        progress.add(result.size)
        problem = check_hash(entry, result)
        if problem:
            report.problems.append(Problem(entry.path, problem))
        else:
            report.good[entry.path] = tree.stamp_of(result.after) + (entry.sha256,)

    hash_files([os.path.join(root, e.path) for e in entries], workers, done,
               [e.size for e in entries])


# ---- a lock from a local tree ---------------------------------------------------------

def lock_from_dir(root: str, repo: str, revision: str, *, workers: int | None = None,
                  emit: Emit | None = None, interval: float = PROGRESS_SECONDS) -> Lock:
    """Hash every regular file under `root` (in parallel) into a lock. Refuses a tree
    holding symlinks or special files: the lock describes regular files only."""
    tree.check_repo(repo)
    tree.check_revision(revision)
    if not os.path.isdir(root):
        raise tree.LockError(f"{root}: not a directory")
    scan = tree.scan_tree(root)
    if scan.problems:
        raise tree.LockError("cannot lock " + root + ":\n" + "\n".join(f"  {p}" for p in scan.problems))
    for rel in scan.files:
        tree.check_path(rel)
    ordered = sorted(scan.files.items(), key=lambda kv: -kv[1].st_size)
    progress = Progress("lock", len(ordered), sum(st.st_size for _, st in ordered), emit, interval)
    entries: list = [None] * len(ordered)

    def done(index: int, result) -> None:
        rel = ordered[index][0]
        if isinstance(result, OSError):
            raise result
        if tree.stamp_of(result.before) != tree.stamp_of(result.after):
            raise tree.LockError(f"{rel}: changed while being hashed")
        progress.add(result.size)
        entries[index] = FileEntry(path=rel, size=result.size, sha256=result.sha256)

    hash_files([os.path.join(root, rel) for rel, _ in ordered], workers, done)
    return tree.make_lock(repo, revision, entries)


def print_problems(problems: Iterable[Problem], stream=None) -> None:
    stream = stream or sys.stderr
    for p in problems:
        print(f"  {p}", file=stream)
