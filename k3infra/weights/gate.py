"""The serving gate: what runs before every `vllm serve` start (standard library only).

Threat: anyone who can write the weights volume (a compromised prefetch pod, another pod
mounting the volume, a shared file system's other clients) can rewrite shards, the lock,
the marker and any stamp file beside the tree. So the gate trusts none of them:

- **The lock** is read once, its k3-tree-v1 digest recomputed from its file list, and
  that digest, repo and revision must equal what the pod spec pins (the stack's lock or
  the receipt's digest, rendered by Pulumi into the container's arguments): a replaced
  lock describing a replaced tree is refused, in every profile.
- **The tree** is read and hashed in full against that in-memory lock (`warm`, the
  default). On a node whose RAM holds the tree this also warms the page cache the
  engine then loads from, so the check costs little extra time.
- **Stamps** (`stamps` mode, for nodes short of memory): the first start of a pod hashes
  in full, then records (size, mtime_ns, ctime_ns, inode) of every file in a
  pod-private directory (an emptyDir no other pod can write and the weights volume does
  not contain). A restart of the serving container re-hashes only files whose stamp
  changed. Rewriting a file changes its ctime, which user space cannot set back.

The marker `.k3-verified.json` is not consulted: it only says a prefetch finished.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable

from . import tree, verify
from .tree import Lock

MODES = ("warm", "stamps")
RECORD_NAME = "k3-gate-stamps.json"
RECORD_FORMAT = "k3-gate-stamps/1"

Emit = Callable[[str], None]


class GateRefused(Exception):
    """The lock or the tree is not the one the pod spec pins."""


def load_pinned_lock(path: str, *, expect_digest: str, repo: str, revision: str) -> tuple[Lock, str]:
    """The lock at `path`, read once, that describes the pinned tree; GateRefused otherwise.
    Everything after this uses the returned object, never the file again."""
    try:
        raw = tree.read_regular(path, tree.LOCK_MAX_BYTES)
    except FileNotFoundError:
        raise GateRefused(f"no lock at {path}: the weights prefetch has not completed") from None
    except OSError as exc:
        raise GateRefused(f"no readable lock at {path} ({exc.strerror or exc})") from None
    try:
        lock = tree.parse_lock_bytes(raw, path)
    except ValueError as exc:
        raise GateRefused(f"malformed {exc}") from None
    if lock.tree_digest != expect_digest:
        raise GateRefused(f"not the pinned tree: lock {path} describes {lock.tree_digest}, the "
                          f"stack pins {expect_digest} (not the measured tree unless the "
                          "stack ships its own lock)")
    if lock.repo != repo or lock.revision != revision:
        raise GateRefused(f"lock {path} pins {lock.repo}@{lock.revision}, the stack pins "
                          f"{repo}@{revision}")
    return lock, hashlib.sha256(raw).hexdigest()


# ---- the pod-private stamp record (stamps mode) -----------------------------------------

def _record_path(state_dir: str) -> str:
    return os.path.join(state_dir, RECORD_NAME)


def check_state_dir(state_dir: str, root: str) -> None:
    """The record must live outside the weights tree: a stamp beside the tree is writable
    by whoever writes the tree. (That the directory is pod-private, an emptyDir only the
    serving container mounts, is the pod spec's part; the device may be shared, since
    the kubelet may keep emptyDirs on the same NVMe array.)"""
    real_state = os.path.realpath(state_dir).rstrip("/") + "/"
    real_root = os.path.realpath(root).rstrip("/") + "/"
    if real_state.startswith(real_root) or real_root.startswith(real_state):
        raise GateRefused(f"--state-dir {state_dir} overlaps the weights tree {root}: stamps "
                          "must live in a pod-private directory")
    if not os.path.isdir(state_dir):
        raise GateRefused(f"--state-dir {state_dir} does not exist")


def load_record(state_dir: str, lock: Lock, root: str) -> dict:
    """path -> stamp + sha256 from this pod's own record, {} when absent or for another
    tree or root."""
    try:    # the record is this pod's own, but bounded and non-blocking all the same
        data = json.loads(tree.read_regular(_record_path(state_dir), tree.LOCK_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT \
            or data.get("tree_digest") != lock.tree_digest or data.get("root") != os.path.realpath(root):
        return {}
    files = data.get("files")
    if not isinstance(files, dict):
        return {}
    return {p: tuple(v) for p, v in files.items() if isinstance(v, list) and len(v) == 5}


def save_record(state_dir: str, lock: Lock, root: str, good: dict) -> None:
    data = {"format": RECORD_FORMAT, "tree_digest": lock.tree_digest,
            "root": os.path.realpath(root), "files": {p: list(v) for p, v in sorted(good.items())}}
    tree.atomic_write(_record_path(state_dir), json.dumps(data, separators=(",", ":")).encode())


def drop_record(state_dir: str) -> None:
    try:
        os.unlink(_record_path(state_dir))
    except FileNotFoundError:
        pass


# ---- the gate ------------------------------------------------------------------------

def run_gate(root: str, lock_path: str, *, expect_digest: str, repo: str, revision: str,
             mode: str = "warm", state_dir: str | None = None, workers: int | None = None,
             emit: Emit | None = print, require_marker: bool = False) -> verify.Report:
    """Verify `root` against the pinned lock; GateRefused for a lock that is not the
    pinned one, else the verifier's report (ok or every offending path).
    `require_marker` (the in-cluster source's start check): also refuse, before reading
    a byte, a tree whose prefetch marker does not name the pinned tree; the full hash then
    runs all the same (a marker proves nothing)."""
    if mode not in MODES:
        raise GateRefused(f"--mode {mode!r}: accepted {', '.join(MODES)}")
    start = time.monotonic()
    lock, _sha = load_pinned_lock(lock_path, expect_digest=expect_digest, repo=repo,
                                  revision=revision)
    if require_marker:
        problem = verify.marker_problem(root, lock)
        if problem:
            raise GateRefused(f"{root} is not a verified tree: {problem}")
    stamps: dict = {}
    if mode == "stamps":
        if not state_dir:
            raise GateRefused("--mode stamps needs --state-dir (a pod-private emptyDir)")
        check_state_dir(state_dir, root)
        stamps = load_record(state_dir, lock, root)
    report = verify.verify_tree(root, lock, stamps=stamps, workers=workers, emit=emit)
    if mode == "stamps":
        if report.ok:
            save_record(state_dir, lock, root, report.good)
        else:
            drop_record(state_dir)
    report.seconds = time.monotonic() - start
    return report
