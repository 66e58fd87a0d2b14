"""`k3infra weights mirror`: the pinned tree into your object store, once, verified.

The bytes come from the Hub at the lock's revision (hubapi.py through the one HTTP client:
HF_ENDPOINT, HF_TOKEN; never more than the lock's size of a file, within the command's
deadline) or from a local tree; every file is hashed against the lock before it is
uploaded (a file that does not match is never uploaded), and the lock is written beside
the tree last, once every object matches it (k3weights.store's layout). Credentials are
the provider's own, from the operator's environment (obstore reads them).

Each object already in the store is judged before anything is uploaded:

- missing, or of another size than the lock's: uploaded (reported file by file);
- carrying the `k3sha256` metadata this command writes, equal to the lock's: kept;
- without it, or with another value, or every object with `--check`: read and hashed;
  kept when the bytes hash to the lock's sha256, reported and uploaded again otherwise.

So a second run uploads nothing, and a killed run resumes: an object appears only once
its upload is complete (each provider's put is atomic), so it is either whole and judged
as above, or absent and uploaded again. `--dry-run` reports and changes nothing (exit 1
when the store does not match the lock). Not shipped to pods.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import obstore

from k3infra.weights import store as store_mod
from k3infra.weights import tree, verify
from k3infra.weights.hubapi import HubError, Hub
from k3infra.weights.tree import FileEntry, Lock, Problem
from k3infra.weights.prefetch import hub_environment
from k3infra.weights.sources import http_client

# User metadata on every object this command uploads: letters and digits only, since
# Azure takes C# identifiers as metadata names (Azurite refused `k3-sha256`).
SHA_ATTRIBUTE = "k3sha256"
UPLOAD_CHUNK = 64 << 20         # multipart part size
UPLOAD_CONCURRENCY = 8          # parts of one object in flight
WORKERS = 4                     # files judged or uploaded at once
# The Hub's reads: every call ends by the command's deadline (--timeout), and one file's
# within a minute plus its size at 1 MiB/s (a file slower than that is given up; a rerun
# resumes, uploaded files are kept).
HUB_DEADLINE_SECONDS = 86400.0
HUB_CALL_SECONDS = 60.0
HUB_MIN_BYTES_PER_S = 1 << 20

Emit = Callable[[str], None]


@dataclass
class MirrorReport:
    url: str
    files: int = 0
    bytes: int = 0
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    kept_files: int = 0
    read_back: int = 0                          # objects read and hashed to judge them
    mismatched: list = field(default_factory=list)   # Problem: objects that did not match
    problems: list = field(default_factory=list)     # Problem: what could not be fixed
    lock_written: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return (f"mirror {self.url}: {self.files} files, {verify._gb(self.bytes)}; uploaded "
                f"{self.uploaded_files} files / {verify._gb(self.uploaded_bytes)}, kept "
                f"{self.kept_files} already matching the lock ({self.read_back} read and hashed); "
                f"{len(self.mismatched)} did not match the lock"
                + ("; lock written" if self.lock_written else ""))


class _FromHub:
    """The file at the lock's revision from the Hub (hubapi.py, through the one HTTP
    client: HF_ENDPOINT, the token only to the Hub's own origin) into a staging file of
    its own: never more than the lock's size, hashed as it arrives, refused unless it is
    the lock's size and sha256, and deleted if anything goes wrong."""

    verified = True                     # the bytes were held to the lock while streamed

    def __init__(self, lock: Lock, staging: str, token: Optional[str], seconds: float):
        hub_environment()
        self.lock, self.staging = lock, staging
        # HF_ENDPOINT read now, not at huggingface_hub's import: the endpoint of this run.
        self.hub = Hub(http_client(seconds, what="the mirror"), None, token)

    def __call__(self, entry: FileEntry) -> str:
        # A name of our own: no path from the lock touches the filesystem.
        fd, path = tempfile.mkstemp(prefix=".k3-mirror-", suffix=".part", dir=self.staging)
        try:
            with os.fdopen(fd, "wb") as sink:
                self.hub.file(self.lock.repo, self.lock.revision, entry.path, entry.size,
                              entry.sha256, sink, seconds=HUB_CALL_SECONDS
                              + entry.size / HUB_MIN_BYTES_PER_S)
        except BaseException:
            os.unlink(path)             # a partial staged file is never left behind
            raise
        return path

    def done(self, path: str) -> None:
        os.unlink(path)                 # staged only as long as its upload


class _FromDir:
    verified = False                    # hashed against the lock before its upload

    def __init__(self, root: str):
        self.root = root

    def __call__(self, entry: FileEntry) -> str:
        return os.path.join(self.root, entry.path)

    def done(self, path: str) -> None:
        pass


def _object_sha256(reader: store_mod.ObjectReader, key: str, entry: FileEntry) -> str:
    """The object's first entry.size bytes hashed: ranged reads of the prefetch's own
    reader, never past the lock's size, each part held to its length and the store
    client's per-request timeout (store.open_store)."""
    digest = hashlib.sha256()
    for part in reader.read_ordered(key, 0, entry.size):
        digest.update(part)
    return digest.hexdigest()


def _judge(reader: store_mod.ObjectReader, key: str, entry: FileEntry, check: bool
           ) -> tuple[Optional[str], bool]:
    """(why the object does not match the lock, or None; whether it was read)."""
    try:
        head = obstore.get(reader.store, key, options={"head": True})
    except FileNotFoundError:
        return "missing", False
    size = int(head.meta["size"])
    if size != entry.size:
        return f"{size} bytes in the store, the lock says {entry.size}", False
    if not check and head.attributes.get(SHA_ATTRIBUTE) == entry.sha256:
        return None, False
    got = _object_sha256(reader, key, entry)
    if got != entry.sha256:
        return f"wrong hash: sha256 {got}, the lock says {entry.sha256}", True
    return None, True


def mirror(lock: Lock, url: store_mod.StoreUrl, *, options: Optional[store_mod.StoreOptions] = None,
           source_dir: Optional[str] = None, token: Optional[str] = None, check: bool = False,
           dry_run: bool = False, workers: int = WORKERS, staging: Optional[str] = None,
           emit: Optional[Emit] = print, store=None,
           hub_seconds: float = HUB_DEADLINE_SECONDS) -> MirrorReport:
    """Make the store hold exactly the lock's tree at the lock's revision, then its lock."""
    say = emit or (lambda _line: None)
    store = store if store is not None else store_mod.open_store(url, options or store_mod.StoreOptions())
    report = MirrorReport(url=str(url), files=len(lock.files), bytes=lock.total_bytes)
    key_of = {e.path: url.tree_key(lock.repo, lock.revision, e.path) for e in lock.files}

    # Files judged in parallel, one part of each at a time: memory workers x part size.
    reader = store_mod.ObjectReader(url, store, files=max(1, workers), parts=1)

    def judge(entry: FileEntry):
        return entry, *_judge(reader, key_of[entry.path], entry, check)

    todo: list[FileEntry] = []
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for entry, why, read in pool.map(judge, lock.files):
                report.read_back += read
                if why is None:
                    report.kept_files += 1
                    continue
                if why != "missing":
                    report.mismatched.append(Problem(entry.path, why))
                say(f"mirror: {entry.path}: {why}" + ("" if dry_run else "; uploading it"))
                todo.append(entry)
    finally:
        reader.close()
    if dry_run:
        report.problems = [Problem(e.path, "missing") for e in todo
                           if e.path not in {p.path for p in report.mismatched}] + report.mismatched
        report.problems.sort(key=lambda p: p.path)
        return report

    own_staging = staging is None and source_dir is None
    staging = staging or (tempfile.mkdtemp(prefix="k3-mirror-") if source_dir is None else None)
    source = (_FromDir(source_dir) if source_dir is not None
              else _FromHub(lock, staging, token, hub_seconds))

    def upload(entry: FileEntry) -> Optional[Problem]:
        try:
            path = source(entry)
        except (HubError, tree.LockError) as exc:   # refused: too long, short, wrong hash, late...
            return Problem(entry.path, f"not taken from the Hub: {exc}; the lock says "
                           f"{entry.size} bytes, sha256 {entry.sha256}")
        except Exception as exc:         # the staging directory's: full, not writable...
            return Problem(entry.path, f"cannot fetch it: {type(exc).__name__}: {exc}")
        try:
            if not source.verified:
                problem = verify.check_hash(entry, tree.hash_file(path, limit=entry.size))
                if problem:
                    return Problem(entry.path, f"{problem}; not uploaded")
            obstore.put(store, key_of[entry.path], Path(path), attributes={SHA_ATTRIBUTE: entry.sha256},
                        chunk_size=UPLOAD_CHUNK, max_concurrency=UPLOAD_CONCURRENCY)
        except Exception as exc:        # the store's answer: denied, unreachable, refused...
            first = (str(exc).strip().splitlines() or [""])[0]
            return Problem(entry.path, f"cannot upload it: {type(exc).__name__}: {first}")
        finally:
            if source_dir is None and os.path.exists(path):
                source.done(path)
        say(f"mirror: {entry.path}: uploaded ({verify._gb(entry.size)})")
        return None

    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for entry, problem in zip(todo, pool.map(upload, todo)):
                if problem is None:
                    report.uploaded_files += 1
                    report.uploaded_bytes += entry.size
                else:
                    report.problems.append(problem)
    finally:
        if own_staging and staging:
            shutil.rmtree(staging, ignore_errors=True)
    report.problems.sort(key=lambda p: p.path)
    if report.ok:
        report.lock_written = _write_lock(store, url, lock, say)
    return report


def _write_lock(store, url: store_mod.StoreUrl, lock: Lock, say: Emit) -> bool:
    """The lock beside the tree, last: only a store that matches it gets one. Unchanged
    bytes are not written again."""
    key = url.lock_key(lock.repo, lock.revision)
    text = tree.lock_to_json(lock).encode("utf-8")
    try:
        # Read only when it is this lock's size, and then no further.
        size = int(obstore.head(store, key)["size"])
        if size == len(text) and bytes(obstore.get_range(store, key, start=0, end=size)) == text:
            return False
        say(f"mirror: {url.where(key)}: another lock was there; replacing it")
    except FileNotFoundError:
        pass
    obstore.put(store, key, text)
    say(f"mirror: lock {lock.tree_digest} -> {url.where(key)}")
    return True
