"""Prefetch a locked weights tree from the Hugging Face Hub, verifying as files land.

Standard library plus huggingface_hub (the engine image has it): runs in the prefetch
Job and in the node-local gate. The Hub is reached the way huggingface_hub always
does: HF_ENDPOINT, HF_TOKEN (from a Secret), HF_XET_HIGH_PERFORMANCE (set to 1 here
unless the environment says otherwise).

What a run does, in order:

1. It takes an exclusive flock on DEST's parent directory (one prefetch per tree at a
   time; a filesystem without flock is refused, not trusted). A missing DEST is fetched
   into a staging directory beside it (`.k3-staging/<name>`) and renamed into place only
   once verified, so a revision change never exposes a half-written tree; an existing
   DEST is repaired in place. It plans from what is on disk: files of the right size are
   re-hashed (no stamp on the volume is trusted: anyone who can write the volume could
   forge one), missing or wrong-size files are fetched. A tree holding an extra file, a
   symlink or a special file is refused before anything is written (it is not the
   prefetch's to delete).
2. Free space: the bytes still to fetch must fit in DEST's filesystem (the free figure
   can be injected with K3_WEIGHTS_FREE_BYTES, for tests and for filesystems whose
   statvfs lies); otherwise a clear error and nothing is written.
3. The marker is removed, then files are downloaded in parallel at the pinned revision
   and each is hashed as soon as it lands while other downloads go on. While downloads
   run, files are hashed by worker processes under SCHED_IDLE
   (verify.Hasher(background=True)): they take only CPU the downloads leave idle and do
   not share the download threads' interpreter lock; once the last download has landed,
   normal threads hash the rest. A file that does not hash to the lock is
   deleted and fetched again (3 downloads at most). A failed download waits the server's
   `Retry-After` if it sent one, else an exponential backoff with jitter.
4. Resume: a plain-HTTP download goes to `.cache/huggingface/download/<path>.<sha256>.incomplete`
   inside DEST and a restarted run continues it with an HTTP Range request
   (huggingface_hub >= 1.0 deletes its own partial files on failure, so the partial
   file is managed here while huggingface_hub does the HEAD and the GET). Xet-backed
   files go through `hf_hub_download` (Xet reconstructs from its chunk cache). Verified
   files are not fetched again (a restarted run re-hashes them instead).
5. Stalls: a plain-HTTP transfer whose partial file has not grown for
   K3_DOWNLOAD_STALL_SECONDS (k3:coldStart.downloadStallSeconds, default 300) is
   abandoned and started again through the same resume path (an HTTP Range request from
   the bytes already on disk); the abandoned thread can no longer write (StallWatch).
   A hung read without a byte also ends at huggingface_hub's own read timeout
   (HF_HUB_DOWNLOAD_TIMEOUT). Xet transfers are watched by hf_xet itself (>= 1.5.2 fixed
   the download hangs, docs/coldstart.md).
6. Only when every file matches and no extra file exists: the scratch directory is
   removed, a final check (this run's own in-memory stamps, plus the extra-file check)
   passes, the marker `.k3-verified.json` is written atomically, and a staging directory
   is renamed into place. The marker says the prefetch finished; it proves nothing to the
   serving gate, which hashes the tree itself (k3weights.gate).

Where the bytes come from (`sources`): the Hub by default; an in-cluster source of a
verified copy first and the Hub as fallback in node-local fan-out (k3weights.sources).
Every source goes through the same `_Fetcher` (another endpoint, no token for the
cluster), the same partial file and the same hashing; a file the lock refuses is
reported to the source chain, which picks the next source.
"""
from __future__ import annotations

import email.utils
import errno
import hashlib
import os
import random
import shutil
import stat
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional
from urllib.parse import urlsplit
import datetime
import fcntl
import inspect
import re
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from importlib import metadata

from . import sources as sources_mod
from . import store as store_mod
from . import tree, verify
from .tree import FileEntry, Lock, Problem
from .hubapi import Hub, HubError

FREE_BYTES_ENV = "K3_WEIGHTS_FREE_BYTES"
STALL_ENV = "K3_DOWNLOAD_STALL_SECONDS"
STALL_SECONDS = 300.0
# Stall restarts of one file, beside its ATTEMPTS (a restart resumes, it does not refetch).
STALL_RESTARTS = 20
ATTEMPTS = 3
DOWNLOAD_WORKERS = 8
# Backoff between downloads of one file: 2 s, 4 s, 8 s... (with jitter) up to 60 s; a
# server's Retry-After is honoured up to 10 minutes.
BACKOFF_BASE_SECONDS = 2.0
BACKOFF_CAP_SECONDS = 60.0
RETRY_AFTER_CAP_SECONDS = 600.0
STAGING_DIR = ".k3-staging"
_NO_RETRY = ("RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError",
             "EntryNotFoundError", "RemoteEntryNotFoundError", "DisabledRepoError")

Emit = Callable[[str], None]


# hf_xet releases before this one hang downloads (huggingface/xet-core issues 850 and
# 883, fixed in 1.5.2): with an older one installed the prefetch stays on plain HTTP,
# where the stall watchdog below sees every transfer.
HF_XET_MIN = (1, 5, 2)


def _version(text: str) -> tuple:
    """(major, minor, patch) of a release string; a pre-release suffix is dropped."""
    return tuple(int(re.match(r"\d*", piece).group() or 0) for piece in text.split(".")[:3])


def xet_too_old() -> Optional[str]:
    """The installed hf_xet version when it is older than HF_XET_MIN, else None."""
    try:
        installed = metadata.version("hf-xet")
    except metadata.PackageNotFoundError:
        return None
    return installed if _version(installed) < HF_XET_MIN else None


def hub_environment() -> None:
    """Defaults for huggingface_hub, read when it is first imported."""
    if xet_too_old():
        os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    os.environ.setdefault("HF_XET_HIGH_PERFORMANCE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")   # our own progress lines
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


class FetchRefused(Exception):
    """The Hub answered, and the answer contradicts the lock: retrying cannot help."""


def free_bytes(dest: str) -> int:
    """Free bytes on DEST's filesystem (or K3_WEIGHTS_FREE_BYTES when set)."""
    override = os.environ.get(FREE_BYTES_ENV)
    if override is not None:
        try:
            return int(override)
        except ValueError:
            raise ValueError(f"{FREE_BYTES_ENV}={override!r}: must be an integer byte count") from None
    probe = os.path.abspath(dest)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    return shutil.disk_usage(probe).free


def partial_path(dest: str, entry: FileEntry) -> str:
    return os.path.join(dest, tree.SCRATCH_DIR, "download", f"{entry.path}.{entry.sha256}.incomplete")


def _partial_size(dest: str, entry: FileEntry) -> int:
    try:
        return os.stat(partial_path(dest, entry)).st_size
    except OSError:
        return 0


def staging_path(dest: str) -> str:
    """Where a tree that does not exist yet is fetched before its rename into place."""
    dest = os.path.abspath(dest)
    return os.path.join(os.path.dirname(dest), STAGING_DIR, os.path.basename(dest))


@dataclass
class Plan:
    rehash: list = field(default_factory=list)      # [FileEntry] present, right size
    fetch: list = field(default_factory=list)       # [FileEntry] missing
    replace: list = field(default_factory=list)     # [FileEntry] wrong size: delete, fetch
    refused: list = field(default_factory=list)     # [Problem] extras, symlinks, specials

    def bytes_to_fetch(self, dest: str) -> int:
        return sum(max(e.size - _partial_size(dest, e), 0) for e in self.fetch + self.replace)


def make_plan(dest: str, lock: Lock) -> Plan:
    plan = Plan()
    if not os.path.isdir(dest):
        plan.fetch = list(lock.files)
        return plan
    scan = tree.scan_tree(dest)
    plan.refused = list(scan.problems)
    plan.refused += [Problem(rel, "extra file, not in the lock (remove it; the prefetch deletes "
                               "nothing it did not write)")
                     for rel in sorted(set(scan.files) - set(lock.by_path))]
    for entry in lock.files:
        st = scan.files.get(entry.path)
        if st is None:
            if entry.path not in scan.problem_paths:
                plan.fetch.append(entry)
        elif st.st_size != entry.size:
            plan.replace.append(entry)
        else:
            plan.rehash.append(entry)
    return plan


@dataclass
class PrefetchReport:
    dest: str
    problems: list = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    downloaded_files: int = 0
    downloaded_bytes: int = 0
    reused_files: int = 0
    hashed_bytes: int = 0
    hash_cpu_seconds: float = 0.0     # CPU time of the hashing threads
    seconds: float = 0.0
    marker: Optional[dict] = None
    notes: list = field(default_factory=list)
    # Per source (k3weights.sources): files, bytes, failures, lock refusals; and the
    # totals: files whose landed bytes the lock refused, downloads moved to the next source.
    sources: dict = field(default_factory=dict)
    refused_by_lock: int = 0
    failovers: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems and self.marker is not None

    def summary(self) -> str:
        verdict = (f"OK, marker {tree.MARKER_NAME} names {self.marker.get('tree_digest')}" if self.ok
                   else f"FAILED ({len(self.problems)} problem(s)), no marker")
        rate = self.downloaded_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0
        return (f"prefetch {verdict}: {self.files} files, {verify._gb(self.bytes)} in {self.dest}; "
                f"downloaded {self.downloaded_files} files / {verify._gb(self.downloaded_bytes)} "
                f"({rate:.2f} GB/s overall), {self.reused_files} already present (re-hashed, kept), "
                f"hashed {verify._gb(self.hashed_bytes)} (hashing CPU {self.hash_cpu_seconds:.2f} s); "
                f"{self.seconds:.2f} s" + self._sources_line())

    def _sources_line(self) -> str:
        if not self.sources:
            return ""
        per = "; ".join(f"{sources_mod.label(s)}: {c.files} files / {verify._gb(c.bytes)}"
                        + (f", {c.failures} failed" if c.failures else "")
                        + (f", {c.refused_by_lock} refused by the lock" if c.refused_by_lock else "")
                        for s, c in self.sources.items())
        return (f"; sources: {per}; refused by the lock: {self.refused_by_lock} file(s), "
                f"moved to the next source: {self.failovers} download(s)")


class LockUnavailable(Exception):
    """The filesystem does not support flock: two writers could interleave, so refuse."""


def _open_partial(path: str):
    """The partial download, for appending: a regular file or new, never followed through
    a link, never a FIFO that blocks the open (tree.open_regular's rule for writing)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


class _DirLock:
    """flock on the directory holding the tree: two prefetches (a retried Job pod, a
    second Job) never write the same tree at once. A filesystem without flock is refused."""

    def __init__(self, path: str, emit: Emit):
        # A directory, opened without blocking (a FIFO put there by a volume writer
        # must not hang the prefetch; O_DIRECTORY refuses it at once).
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                          | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            emit(f"prefetch: another prefetch holds {path}; waiting for it")
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:
            os.close(self.fd)
            raise LockUnavailable(f"cannot flock {path} ({exc.strerror or exc}): this filesystem "
                                  "cannot keep two prefetches apart; use one that supports "
                                  "flock (local NVMe, or an RWX class with POSIX locks)") from None

    def release(self) -> None:
        os.close(self.fd)


class TransferAbandoned(Exception):
    """This transfer was declared stalled and restarted: it must not write again."""


class StallWatch:
    """Progress of each running download (its partial file's size) and which attempt of
    a file may write: a transfer that made no progress for `seconds` is abandoned, and
    the writes and the final rename of an abandoned attempt are refused. Each download
    gets its ticket when it is submitted (`bind`), so an abandoned one that only starts
    later can never take the place of the one that replaced it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._lock = threading.Lock()
        self._local = threading.local()
        self._current: dict[str, int] = {}          # path -> ticket allowed to write
        self._plain: set = set()                    # paths on plain HTTP (a partial file)
        self._seen: dict[str, tuple[int, float]] = {}  # path -> (size, when it last grew)
        self.restarts: dict[str, int] = {}

    def issue(self, path: str) -> int:
        with self._lock:
            self._current[path] = self._current.get(path, 0) + 1
            return self._current[path]

    def bind(self, path: str, fetcher: Callable[[FileEntry], None]) -> Callable[[FileEntry], None]:
        """`fetcher` holding a fresh ticket for `path` in the thread that runs it."""
        ticket = self.issue(path)

        def run(entry: FileEntry):
            self._local.ticket = ticket
            try:
                return fetcher(entry)
            finally:
                self._local.ticket = None
        return run

    def started(self, path: str, size: int, at: float) -> None:
        self._seen[path] = (size, at)

    def stalled(self, path: str, size: int, now: float) -> bool:
        last, since = self._seen.get(path, (size, now))
        if size != last or now < since:
            self._seen[path] = (size, max(now, since))
            return False
        return now - since >= self.seconds

    def watching(self, path: str) -> bool:
        """Only plain-HTTP transfers write a partial file this watch can see grow."""
        with self._lock:
            return path in self._plain

    def begin(self, path: str) -> int:
        """The plain-HTTP transfer of `path` starts: its ticket (bound, or a new one)."""
        with self._lock:
            self._plain.add(path)
        ticket = getattr(self._local, "ticket", None)
        return ticket if ticket is not None else self.issue(path)

    def abandon(self, path: str) -> None:
        with self._lock:
            self._current[path] = self._current.get(path, 0) + 1
        self.restarts[path] = self.restarts.get(path, 0) + 1

    def guarded(self, path: str, attempt: int, action: Callable[[], None]) -> None:
        with self._lock:
            if self._current.get(path) != attempt:
                raise TransferAbandoned(f"{path}: a stalled transfer, restarted")
            action()


class _GuardedFile:
    """The partial file as http_get sees it: writes only while this attempt is current,
    and never past the lock's size of the file (a source that sends more, an endless
    body included, fails the transfer there instead of filling the disk)."""

    def __init__(self, fh, watch: StallWatch, path: str, attempt: int, size: Optional[int] = None):
        self._fh, self._watch, self._path, self._attempt = fh, watch, path, attempt
        self._size = size

    def write(self, data) -> int:
        if self._size is not None and self._fh.tell() + len(data) > self._size:
            raise FetchRefused(f"the source sent more than the {self._size} bytes the lock "
                               "lists for this file; stopped writing")
        out: list = []
        self._watch.guarded(self._path, self._attempt, lambda: out.append(self._fh.write(data)))
        return out[0]

    def truncate(self, *args):
        out: list = []
        self._watch.guarded(self._path, self._attempt,
                            lambda: out.append(self._fh.truncate(*args)))
        return out[0]

    def __getattr__(self, name):
        return getattr(self._fh, name)


class _Fetcher:
    """One file from the Hub into its place in DEST (called from download threads)."""

    def __init__(self, lock: Lock, dest: str, endpoint: Optional[str], token: Optional[str]):
        self.watch: Optional[StallWatch] = None     # set by prefetch() for plain HTTP
        hub_environment()
        # Here, after hub_environment(), not at the top: huggingface_hub reads those
        # variables when it is first imported; and it takes 0.25 s to import (python -X
        # importtime), which `k3weights verify` and `gate` in a pod never pay.
        from huggingface_hub import file_download, utils

        self.fd, self.hf_utils = file_download, utils
        self.lock, self.dest = lock, dest
        self.endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
        self.token = token
        self.xet = bool(getattr(file_download, "is_xet_available", lambda: False)())
        # The engine image pins its own huggingface_hub: pass `endpoint` only where the
        # installed version takes it (older ones read HF_ENDPOINT themselves).

        takes = inspect.signature(file_download.get_hf_file_metadata).parameters
        self.meta_kw = {"endpoint": self.endpoint} if "endpoint" in takes else {}

    def __call__(self, entry: FileEntry) -> None:
        fd = self.fd
        url = fd.hf_hub_url(self.lock.repo, entry.path, revision=self.lock.revision, endpoint=self.endpoint)
        meta = fd.get_hf_file_metadata(url, token=self.token, **self.meta_kw)
        if meta.commit_hash != self.lock.revision:
            raise FetchRefused(f"the Hub resolved revision {self.lock.revision} to commit "
                               f"{meta.commit_hash!r}")
        if meta.size is not None and meta.size != entry.size:
            raise FetchRefused(f"the Hub has {meta.size} bytes at this revision, the lock says "
                               f"{entry.size}: the lock is not for this revision")
        etag = (meta.etag or "").lower()
        if len(etag) == 64 and etag != entry.sha256:
            raise FetchRefused(f"the Hub's sha256 {etag} differs from the lock's {entry.sha256}")
        final = os.path.join(self.dest, entry.path)
        if getattr(meta, "xet_file_data", None) is not None and self.xet:
            fd.hf_hub_download(self.lock.repo, entry.path, revision=self.lock.revision,
                               local_dir=self.dest, token=self.token, endpoint=self.endpoint)
            return
        partial = partial_path(self.dest, entry)
        os.makedirs(os.path.dirname(partial), exist_ok=True)
        headers = self.hf_utils.build_hf_headers(token=self.token)
        if _origin(meta.location) != _origin(url):
            headers.pop("authorization", None)      # a signed CDN URL: the token stays on the Hub
        watch = self.watch or StallWatch(STALL_SECONDS)
        attempt = watch.begin(entry.path)
        with _open_partial(partial) as fh:
            have = fh.tell()
            if have > entry.size:
                fh.truncate(0)
                have = 0
            if have < entry.size:
                fd.http_get(meta.location, _GuardedFile(fh, watch, entry.path, attempt, entry.size),
                            resume_size=have, headers=headers, expected_size=entry.size)
            fh.flush()
            os.fsync(fh.fileno())
        os.makedirs(os.path.dirname(final), exist_ok=True)
        watch.guarded(entry.path, attempt, lambda: os.replace(partial, final))


class _StoreFetcher:
    """One file from the user's object store (k3weights.store) into its place in DEST,
    hashed while it is written: parts are read over several connections and written in
    order to the same resumable partial file as a Hub download, so the file's SHA-256 is
    known when its last byte lands (no second read), a restarted run resumes at the
    partial file's size (re-hashing that prefix first), and the stall watchdog sees the
    prefix grow. Returns the hash; the prefetch holds it to the lock."""

    def __init__(self, lock: Lock, dest: str, source: str, workers: int):
        self.watch: Optional[StallWatch] = None     # set by prefetch()
        self.lock, self.dest = lock, dest
        self.url = store_mod.parse_store_url(source, aws=not store_mod.StoreOptions.from_env().endpoint)
        self.reader = store_mod.ObjectReader(self.url, store_mod.open_store(self.url), files=workers)
        self.hash_cpu_seconds = 0.0         # of the hashing while writing (the report's)
        self._cpu = threading.Lock()

    def close(self) -> None:
        self.reader.close()

    def __call__(self, entry: FileEntry) -> tree.FileHash:
        key = self.url.tree_key(self.lock.repo, self.lock.revision, entry.path)
        size = self.reader.size(key)
        if size != entry.size:
            raise FetchRefused(f"{self.url.where(key)} has {size} bytes, the lock says {entry.size}")
        partial = partial_path(self.dest, entry)
        os.makedirs(os.path.dirname(partial), exist_ok=True)
        watch = self.watch or StallWatch(STALL_SECONDS)
        attempt = watch.begin(entry.path)
        with _open_partial(partial) as fh:
            have = fh.tell()
            if have > entry.size:
                watch.guarded(entry.path, attempt, lambda: fh.truncate(0))
                have = 0
            spent = time.thread_time()
            digest = _hash_prefix(partial, have)
            out = _GuardedFile(fh, watch, entry.path, attempt)
            hashing = time.thread_time() - spent
            for chunk in self.reader.read_ordered(key, have, entry.size):
                out.write(chunk)
                spent = time.thread_time()
                digest.update(chunk)
                hashing += time.thread_time() - spent
            with self._cpu:
                self.hash_cpu_seconds += hashing
            fh.flush()
            os.fsync(fh.fileno())
        final = os.path.join(self.dest, entry.path)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        watch.guarded(entry.path, attempt, lambda: os.replace(partial, final))
        st = os.stat(final, follow_symlinks=False)
        return tree.FileHash(sha256=digest.hexdigest(), size=st.st_size, before=st, after=st)


def _hash_prefix(path: str, length: int):
    """SHA-256 state over the first `length` bytes of a partial file (a resumed transfer)."""
    digest = hashlib.sha256()
    if length:
        with open(path, "rb") as fh:
            left = length
            while left:
                data = fh.read(min(left, tree.READ_SIZE))
                if not data:
                    raise OSError(errno.EIO, f"{path}: shorter than {length} bytes while resuming")
                digest.update(data)
                left -= len(data)
    return digest


def _origin(url: str) -> tuple:
    parts = urlsplit(url)
    return (parts.scheme, parts.netloc)


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, FetchRefused):
        return False
    return not any(cls.__name__ in _NO_RETRY for cls in type(exc).__mro__)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _clean_scratch(dest: str, lock: Lock) -> None:
    """Drop partial downloads this run cannot resume (other names: a killed
    hf_hub_download, an older lock); keep `<path>.<sha256>.incomplete` of this lock."""
    keep = {os.path.abspath(partial_path(dest, e)) for e in lock.files}
    root = os.path.join(dest, tree.SCRATCH_DIR, "download")
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.abspath(os.path.join(dirpath, name))
            if name.endswith(".incomplete") and path not in keep:
                _unlink(path)
    for name in os.listdir(dest):
        if tree.reserved(name) and name != tree.MARKER_NAME and name != tree.SCRATCH_PARENT:
            # atomic-write leftovers of a killed run, and the stamp file older versions
            # kept on the volume (never read now)
            _unlink(os.path.join(dest, name))


def _remove_scratch(dest: str) -> None:
    shutil.rmtree(os.path.join(dest, tree.SCRATCH_DIR), ignore_errors=True)
    try:
        os.rmdir(os.path.join(dest, tree.SCRATCH_PARENT))
    except OSError:
        pass


def prefetch(lock: Lock, lock_sha256: str, dest: str, *, workers: Optional[int] = None,
             download_workers: int = DOWNLOAD_WORKERS, overlap: bool = True,
             attempts: int = ATTEMPTS, endpoint: Optional[str] = None, token: Optional[str] = None,
             emit: Optional[Emit] = print, interval: float = verify.PROGRESS_SECONDS,
             fetcher: Optional[Callable[[FileEntry], None]] = None,
             stall_seconds: Optional[float] = None,
             sources: Optional[list] = None) -> PrefetchReport:
    """Make DEST hold exactly the lock's tree and write the marker; see the module docstring.
    `sources`: where bytes come from, in order (k3weights.sources; default: the Hub)."""
    say = emit or (lambda _line: None)
    watch = StallWatch(stall_seconds if stall_seconds is not None
                       else float(os.environ.get(STALL_ENV) or STALL_SECONDS))
    start = time.monotonic()
    report = PrefetchReport(dest=dest, files=len(lock.files), bytes=lock.total_bytes)

    def done() -> PrefetchReport:
        report.seconds = time.monotonic() - start
        return report

    final_dest = os.path.abspath(dest)
    parent = os.path.dirname(final_dest)
    report.dest = final_dest
    if not os.path.isdir(parent):
        plan = make_plan(staging_path(final_dest), lock)
        if not _space_ok(final_dest, plan, report):
            return done()
        os.makedirs(parent, exist_ok=True)
    try:
        dir_lock = _DirLock(parent, say)
    except LockUnavailable as exc:
        report.problems.append(Problem(".", str(exc)))
        return done()
    try:
        # Decided under the lock: a prefetch that waited may find the tree renamed into
        # place by the one it waited for.
        work = final_dest if os.path.isdir(final_dest) else staging_path(final_dest)
        report.dest = work
        plan = make_plan(work, lock)
        if plan.refused:
            report.problems = plan.refused
            return done()
        if not _space_ok(work, plan, report):
            return done()
        os.makedirs(work, exist_ok=True)
        verify.remove_marker(work)
        _clean_scratch(work, lock)
        for entry in plan.replace:
            _unlink(os.path.join(work, entry.path))
        chain = None
        if fetcher is None:
            def source_fetcher(source: str):
                if store_mod.is_store_url(source):
                    one = _StoreFetcher(lock, work, source, download_workers)
                else:
                    one = _Fetcher(lock, work, sources_mod.endpoint_for(source, endpoint),
                                   sources_mod.hub_token_for(source, token))
                one.watch = watch
                return one

            chain = sources_mod.SourceChain(sources or [sources_mod.HUB], source_fetcher,
                                            lambda e: _partial_size(work, e), say)
        try:
            good, tries = _run(lock, work, plan, report, workers=workers,
                               download_workers=download_workers, overlap=overlap,
                               attempts=attempts, fetcher=fetcher or chain, say=say,
                               interval=interval, watch=watch)
        finally:
            if chain is not None:
                report.hash_cpu_seconds += sum(getattr(f, "hash_cpu_seconds", 0.0)
                                               for f in chain.fetchers)
                for f in chain.fetchers:
                    getattr(f, "close", lambda: None)()
                report.sources = chain.counts
                report.refused_by_lock, report.failovers = chain.refused_by_lock, chain.failovers
        # Files already on disk that hashed right and were not fetched again.
        report.reused_files = sum(1 for e in plan.rehash if not tries.get(e.path))
        if report.problems:
            return done()
        if not plan.fetch and not plan.replace:
            say(f"prefetch: {work} already holds the tree {lock.tree_digest} (re-hashed, "
                "nothing fetched)")
        _remove_scratch(work)
        final = verify.verify_tree(work, lock, stamps=good, workers=workers, emit=emit,
                                   interval=interval)
        if not final.ok:
            report.problems = final.problems
            return done()
        report.marker = verify.write_marker(work, lock, lock_sha256)
        if work != final_dest:
            os.replace(work, final_dest)        # same filesystem: atomic
            tree.fsync_dir(parent)
            try:
                os.rmdir(os.path.dirname(work))
            except OSError:
                pass
            report.dest = final_dest
        return done()
    finally:
        dir_lock.release()


def _space_ok(dest: str, plan: Plan, report: PrefetchReport) -> bool:
    need = plan.bytes_to_fetch(dest)
    free = free_bytes(dest)
    if need > free:
        report.problems.append(Problem(
            ".", f"not enough free space in {dest}: {need} bytes ({verify._gb(need)}) to fetch for "
                 f"{len(plan.fetch) + len(plan.replace)} file(s), {free} bytes ({verify._gb(free)}) "
                 "free; nothing was written"))
        return False
    return True


def _run(lock: Lock, dest: str, plan: Plan, report: PrefetchReport, *, workers, download_workers,
         overlap, attempts, fetcher, say, interval, watch: StallWatch) -> None:
    good: dict = {}          # this run's own stamps: path -> stamp + sha256
    tries: dict[str, int] = {}
    pending: dict = {}
    landed: list[FileEntry] = []
    to_hash: deque = deque()            # landed files waiting for a hashing slot
    in_flight: set = set()
    downloads = ThreadPoolExecutor(max_workers=max(1, download_workers), thread_name_prefix="k3-fetch")
    hasher = verify.Hasher(workers)                       # after the last download
    try:
        idle_hasher = verify.Hasher(workers, background=True)  # while downloads run
    except (OSError, ImportError, NotImplementedError) as exc:  # e.g. no /dev/shm for its queues
        say(f"prefetch: no background hashing ({exc}); files are hashed after the downloads")
        idle_hasher = None
    rejected = getattr(fetcher, "rejected", None)      # a SourceChain wants to know
    last_line = time.monotonic()
    t0 = time.monotonic()

    def fetch(entry: FileEntry, delay: float = 0.0, restart: bool = False) -> None:
        if not restart:
            tries[entry.path] = tries.get(entry.path, 0) + 1
        in_flight.add(entry.path)
        watch.started(entry.path, _partial_size(dest, entry), time.monotonic() + delay)
        pending[downloads.submit(_after, delay, watch.bind(entry.path, fetcher), entry)] = \
            ("fetch", entry)

    def restart_stalled(now: float) -> None:
        """Abandon each transfer that made no progress for watch.seconds; resume it."""
        for fut, (kind, entry) in list(pending.items()):
            if kind != "fetch" or not watch.watching(entry.path) \
                    or not watch.stalled(entry.path, _partial_size(dest, entry), now):
                continue
            if watch.restarts.get(entry.path, 0) >= STALL_RESTARTS:
                continue            # left to huggingface_hub's timeouts and the attempts
            del pending[fut]        # its result, whenever it comes, is not this run's
            fut.cancel()            # not started yet: never will
            watch.abandon(entry.path)
            say(f"prefetch: {entry.path}: no progress for {watch.seconds:g} s at "
                f"{_partial_size(dest, entry)} bytes; restarting the transfer from there "
                f"(stall restart {watch.restarts[entry.path]})")
            fetch(entry, restart=True)

    def hash_(entry: FileEntry) -> None:
        to_hash.append(entry)

    def start_hashing() -> None:
        fetching = sum(1 for kind, _ in pending.values() if kind == "fetch")
        hashing = len(pending) - fetching
        pool = idle_hasher if fetching else hasher
        while pool is not None and to_hash and hashing < hasher.workers:
            entry = to_hash.popleft()
            pending[pool.submit(os.path.join(dest, entry.path))] = ("hash", entry)
            hashing += 1

    for entry in plan.rehash:
        hash_(entry)
    for entry in plan.fetch + plan.replace:
        fetch(entry)
    try:
        start_hashing()
        while pending:
            finished, _ = wait(list(pending), timeout=interval, return_when=FIRST_COMPLETED)
            for fut in finished:
                kind, entry = pending.pop(fut)
                if kind == "fetch":
                    in_flight.discard(entry.path)
                    _fetched(fut, entry, report, tries, attempts, fetch, hash_, landed, overlap, say,
                             judge=lambda e, r: _hashed(None, e, report, good, tries, attempts,
                                                        dest, fetch, say, rejected, result=r))
                else:
                    _hashed(fut, entry, report, good, tries, attempts, dest, fetch, say, rejected)
            if not overlap and landed and not any(k == "fetch" for k, _ in pending.values()):
                for entry in landed:
                    hash_(entry)
                landed.clear()
            start_hashing()
            now = time.monotonic()
            restart_stalled(now)
            if now - last_line >= interval:
                last_line = now
                partial = sum(_partial_size(dest, lock.by_path[p]) for p in list(in_flight))
                rate = (report.downloaded_bytes + partial) / max(now - t0, 1e-9) / 1e9
                say(f"prefetch: verified {len(good)}/{len(lock.files)} files; downloaded "
                    f"{report.downloaded_files} files / {verify._gb(report.downloaded_bytes)} "
                    f"(+{verify._gb(partial)} in flight, {rate:.2f} GB/s)")
    finally:
        downloads.shutdown(wait=True, cancel_futures=True)
        for pool in (p for p in (idle_hasher, hasher) if p is not None):
            pool.close()
            report.hash_cpu_seconds += pool.cpu_seconds
    report.problems.sort(key=lambda p: p.path)
    return good, tries


def _after(delay: float, fetcher, entry: FileEntry):
    if delay:
        time.sleep(delay)        # back off in the download thread, not the loop
    return fetcher(entry)


def _fetched(fut, entry, report, tries, attempts, fetch, hash_, landed, overlap, say,
             judge=None) -> None:
    try:
        streamed = fut.result()
    except Exception as exc:    # network, HTTP and Hub errors all end here
        if _retryable(exc) and tries[entry.path] < attempts:
            say(f"prefetch: {entry.path}: download failed ({_brief(exc)}); attempt "
                f"{tries[entry.path] + 1} of {attempts}")
            fetch(entry, delay=backoff_seconds(exc, tries[entry.path]))
        else:
            report.problems.append(Problem(entry.path, f"download failed after {tries[entry.path]} "
                                                       f"attempt(s): {_brief(exc)}"))
        return
    report.downloaded_files += 1
    report.downloaded_bytes += entry.size
    if isinstance(streamed, tree.FileHash) and judge is not None:
        judge(entry, streamed)          # hashed while written (a store): no second read
    elif overlap:
        hash_(entry)
    else:
        landed.append(entry)


def _hashed(fut, entry, report, good, tries, attempts, dest, fetch, say, rejected=None,
            result=None) -> None:
    try:
        result = result if result is not None else fut.result()
        report.hashed_bytes += result.size
        problem = verify.check_hash(entry, result)
    except OSError as exc:
        problem = f"cannot read ({exc.strerror or exc})"
    if problem is None:
        good[entry.path] = tree.stamp_of(result.after) + (entry.sha256,)
        return
    _unlink(os.path.join(dest, entry.path))
    again = tries.get(entry.path, 0) < attempts
    if tries.get(entry.path, 0) and rejected is not None:
        rejected(entry, problem, again)       # counted, logged, the next source chosen
    elif again:
        say(f"prefetch: {entry.path}: {problem}; deleted, fetching it again")
    if again:
        fetch(entry)
    else:
        report.problems.append(Problem(entry.path, f"{problem} after {tries[entry.path]} "
                                                   "download(s); deleted"))


def retry_after_seconds(exc: BaseException) -> Optional[float]:
    """The server's Retry-After (seconds or an HTTP date) on a failed request, if any."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    if not value:
        return None
    value = str(value).strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None

    now = datetime.datetime.now(when.tzinfo or datetime.timezone.utc)
    return max((when - now).total_seconds(), 0.0)


def backoff_seconds(exc: BaseException, attempt: int) -> float:
    """Wait before download attempt `attempt + 1`: the server's Retry-After (capped) when
    it sent one, else exponential backoff with jitter (so retrying pods spread out)."""
    told = retry_after_seconds(exc)
    if told is not None:
        return min(told, RETRY_AFTER_CAP_SECONDS)
    ceiling = min(BACKOFF_BASE_SECONDS * 2 ** max(attempt - 1, 0), BACKOFF_CAP_SECONDS)
    return ceiling * (0.5 + random.random() / 2)


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


# ---- a lock from Hub metadata ---------------------------------------------------------

def lock_from_hub(repo: str, revision: str, *, endpoint: Optional[str] = None,
                  token: Optional[str] = None, workers: int = DOWNLOAD_WORKERS,
                  emit: Optional[Emit] = None, client=None) -> Lock:
    """The lock of REPO at REVISION from Hub metadata: LFS files carry their sha256 and
    size in the tree listing (no shard is downloaded); small non-LFS files are fetched
    (never past their listed size), hashed, and checked against their git blob id.
    Every call goes through the one HTTP client (`client`, with the command's deadline;
    hubapi.py says why not HfApi)."""
    tree.check_repo(repo)
    tree.check_revision(revision)
    hub_environment()

    hub = Hub(client or sources_mod.http_client(), endpoint, token)
    try:
        sha = hub.commit(repo, revision)
        listed = hub.files(repo, revision)
    except HubError as exc:
        raise tree.LockError(str(exc)) from None
    if sha != revision:
        raise tree.LockError(f"the Hub resolved {repo}@{revision} to commit {sha!r}")
    entries = [FileEntry(path=f.path, size=f.lfs_size, sha256=f.lfs_sha256)
               for f in listed if f.lfs_sha256 is not None]
    small = [f for f in listed if f.lfs_sha256 is None]
    if emit:
        emit(f"lock: {repo}@{revision}: {len(entries)} LFS files from metadata, "
             f"{len(small)} small files to fetch and hash")

    def fetch_small(item) -> FileEntry:
        try:
            data = hub.small_file(repo, revision, item)
        except HubError as exc:
            raise tree.LockError(str(exc)) from None
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        if blob != item.blob_id:
            raise tree.LockError(f"{item.path}: fetched {len(data)} bytes with git blob id {blob}, "
                                 f"the Hub lists blob {item.blob_id}")
        return FileEntry(path=item.path, size=len(data), sha256=hashlib.sha256(data).hexdigest())

    with ThreadPoolExecutor(max_workers=max(1, min(workers, 64))) as pool:
        entries += list(pool.map(fetch_small, small))
    return tree.make_lock(repo, revision, entries)
