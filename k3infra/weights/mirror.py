"""`k3infra weights mirror`: the pinned tree into your object store, once, verified.

The bytes come from the Hub at the lock's revision (huggingface_hub: HF_ENDPOINT,
HF_TOKEN) or from a local tree; every file is hashed against the lock before it is
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
from k3infra.weights.tree import FileEntry, Lock, Problem

# User metadata on every object this command uploads: letters and digits only, since
# Azure takes C# identifiers as metadata names (Azurite refused `k3-sha256`).
SHA_ATTRIBUTE = "k3sha256"
UPLOAD_CHUNK = 64 << 20         # multipart part size
UPLOAD_CONCURRENCY = 8          # parts of one object in flight
WORKERS = 4                     # files judged or uploaded at once

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
    """The file at the lock's revision from the Hub, into a staging directory."""

    def __init__(self, lock: Lock, staging: str, token: Optional[str]):
        from huggingface_hub import hf_hub_download

        self.download, self.lock, self.staging, self.token = hf_hub_download, lock, staging, token
        # Read now, not at huggingface_hub's import: the endpoint of this run.
        self.endpoint = os.environ.get("HF_ENDPOINT") or None

    def __call__(self, entry: FileEntry) -> str:
        return self.download(self.lock.repo, entry.path, revision=self.lock.revision,
                             local_dir=self.staging, token=self.token, endpoint=self.endpoint)

    def done(self, path: str) -> None:
        os.unlink(path)                 # staged only as long as its upload


class _FromDir:
    def __init__(self, root: str):
        self.root = root

    def __call__(self, entry: FileEntry) -> str:
        return os.path.join(self.root, entry.path)

    def done(self, path: str) -> None:
        pass


def _object_sha256(store, key: str) -> str:
    digest = hashlib.sha256()
    for chunk in obstore.get(store, key).stream(min_chunk_size=8 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def _judge(store, key: str, entry: FileEntry, check: bool) -> tuple[Optional[str], bool]:
    """(why the object does not match the lock, or None; whether it was read)."""
    try:
        head = obstore.get(store, key, options={"head": True})
    except FileNotFoundError:
        return "missing", False
    size = int(head.meta["size"])
    if size != entry.size:
        return f"{size} bytes in the store, the lock says {entry.size}", False
    if not check and head.attributes.get(SHA_ATTRIBUTE) == entry.sha256:
        return None, False
    got = _object_sha256(store, key)
    if got != entry.sha256:
        return f"wrong hash: sha256 {got}, the lock says {entry.sha256}", True
    return None, True


def mirror(lock: Lock, url: store_mod.StoreUrl, *, options: Optional[store_mod.StoreOptions] = None,
           source_dir: Optional[str] = None, token: Optional[str] = None, check: bool = False,
           dry_run: bool = False, workers: int = WORKERS, staging: Optional[str] = None,
           emit: Optional[Emit] = print, store=None) -> MirrorReport:
    """Make the store hold exactly the lock's tree at the lock's revision, then its lock."""
    say = emit or (lambda _line: None)
    store = store if store is not None else store_mod.open_store(url, options or store_mod.StoreOptions())
    report = MirrorReport(url=str(url), files=len(lock.files), bytes=lock.total_bytes)
    key_of = {e.path: url.tree_key(lock.repo, lock.revision, e.path) for e in lock.files}

    def judge(entry: FileEntry):
        return entry, *_judge(store, key_of[entry.path], entry, check)

    todo: list[FileEntry] = []
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
    if dry_run:
        report.problems = [Problem(e.path, "missing") for e in todo
                           if e.path not in {p.path for p in report.mismatched}] + report.mismatched
        report.problems.sort(key=lambda p: p.path)
        return report

    own_staging = staging is None and source_dir is None
    staging = staging or (tempfile.mkdtemp(prefix="k3-mirror-") if source_dir is None else None)
    source = _FromDir(source_dir) if source_dir is not None else _FromHub(lock, staging, token)

    def upload(entry: FileEntry) -> Optional[Problem]:
        try:
            path = source(entry)
        except Exception as exc:         # the Hub's errors: not found, gated, offline...
            return Problem(entry.path, f"cannot fetch it: {type(exc).__name__}: {exc}")
        try:
            got = tree.hash_file(path, limit=entry.size)
            problem = verify.check_hash(entry, got)
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
        if bytes(obstore.get(store, key).bytes()) == text:
            return False
        say(f"mirror: {url.where(key)}: another lock was there; replacing it")
    except FileNotFoundError:
        pass
    obstore.put(store, key, text)
    say(f"mirror: lock {lock.tree_digest} -> {url.where(key)}")
    return True
