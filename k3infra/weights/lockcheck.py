"""A lock against the receipt: is this the tree that was measured? (Not shipped to pods.)

The receipt publishes the measured tree's digest. A lock whose k3-tree-v1 digest differs
describes another tree: "not the measured tree", an error unless the stack runs
`profile: custom` (whose every object is labelled as not measured anyway).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from k3infra.config import ConfigError, StackConfig
from k3infra.receipt import Receipt
from k3infra.weights.tree import (LOCK_MAX_BYTES, Lock, LockError, describe_oserror,
                                   parse_lock_bytes, read_regular)

NOT_MEASURED = "not the measured tree"
KEY = "k3:weights.lockFile"


class NotMeasuredTree(ConfigError):
    """The stack's lock is not the receipt's tree (and the profile is not custom)."""


def compare_with_receipt(lock: Union[Lock, str], receipt_digest: str) -> Union[bool, str]:
    """True when the lock's tree digest is the receipt's, else a message starting with
    "not the measured tree". `lock` is a Lock or a tree digest string."""
    digest = lock.tree_digest if isinstance(lock, Lock) else lock
    if digest == receipt_digest:
        return True
    where = f" ({lock.repo}@{lock.revision})" if isinstance(lock, Lock) else ""
    return (f"{NOT_MEASURED}: the lock{where} has tree digest {digest}, "
            f"the receipt measured {receipt_digest}")


@dataclass(frozen=True)
class StackLock:
    """The stack's lock file: its exact text (shipped to pods unchanged) and content."""

    path: str
    text: str
    lock: Lock

    @property
    def total_bytes(self) -> int:
        return self.lock.total_bytes


def load_stack_lock(receipt: Receipt, cfg: StackConfig, root: Optional[Path] = None,
                    check_revision: bool = True) -> Optional[StackLock]:
    """`k3:weights.lockFile`, checked at program start: a well-formed k3-tree-v1 lock
    (its digest recomputed from its file list), of the configured revision, of the
    receipt's tree unless `k3:profile` is custom. None when the stack ships no lock (the
    prefetch Job then derives it from the Hub at the pinned revision and checks the same
    digest in the pod). `check_revision=False` leaves the revision to
    `check_lock_revision` (k3:weightsRevision wired from an Output: checked in apply)."""
    if cfg.weights.lock_file is None:
        return None
    path = Path(cfg.weights.lock_file)
    if not path.is_absolute() and root is not None:
        path = root / path
    try:    # read once, bounded, a regular file only (tree.read_regular); the text shipped is the text checked
        raw = read_regular(str(path), LOCK_MAX_BYTES)
    except OSError as exc:
        raise ConfigError(KEY, cfg.weights.lock_file,
                          f"must be a readable k3-tree-v1 lock file: {describe_oserror(exc)}") from None
    try:
        lock = parse_lock_bytes(raw, str(path))
        text = raw.decode("utf-8")
    except LockError as exc:
        raise ConfigError(KEY, cfg.weights.lock_file, f"must be a valid k3-tree-v1 lock: {exc}")
    stack_lock = StackLock(str(path), text, lock)
    if check_revision:
        check_lock_revision(stack_lock, cfg)
    verdict = compare_with_receipt(lock, receipt.model.tree_digest)
    if verdict is not True and cfg.profile != "custom":
        raise NotMeasuredTree(KEY, cfg.weights.lock_file,
                              f"{verdict}; k3:profile custom serves another tree, labelled "
                              "as not measured")
    return stack_lock


def check_lock_revision(stack_lock: Optional[StackLock], cfg: StackConfig) -> None:
    if stack_lock is not None and stack_lock.lock.revision != cfg.weights_revision:
        raise ConfigError(KEY, cfg.weights.lock_file,
                          f"the lock pins revision {stack_lock.lock.revision}, "
                          f"k3:weightsRevision is {cfg.weights_revision}: they must be the "
                          "same commit")
