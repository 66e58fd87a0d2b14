"""A lock against the receipt: is this the tree that was measured? (Not shipped to pods.)

The receipt publishes the measured tree's digest. A lock whose k3-tree-v1 digest differs
describes another tree: "not the measured tree", an error unless the stack runs
`profile: custom` (then a warning the render carries).
"""
from __future__ import annotations

from typing import Optional, Union

from k3infra.weights.tree import Lock, LockError, load_lock

NOT_MEASURED = "not the measured tree"


class NotMeasuredTree(LockError):
    """The lock's tree digest is not the receipt's."""


def compare_with_receipt(lock: Union[Lock, str], receipt_digest: str) -> Union[bool, str]:
    """True when the lock's tree digest is the receipt's, else a message starting with
    "not the measured tree". `lock` is a Lock or a tree digest string."""
    digest = lock.tree_digest if isinstance(lock, Lock) else lock
    if digest == receipt_digest:
        return True
    where = f" ({lock.repo}@{lock.revision})" if isinstance(lock, Lock) else ""
    return (f"{NOT_MEASURED}: the lock{where} has tree digest {digest}, "
            f"the receipt measured {receipt_digest}")


def check_stack_lock(path: str, profile: str, receipt_digest: Optional[str] = None) -> tuple[Lock, Optional[str]]:
    """Load the stack's lock file and hold it against the receipt.

    Returns (lock, warning): warning is the mismatch message under `profile: custom`,
    None on a match. Raises NotMeasuredTree on a mismatch under any other profile, and
    LockError for a malformed lock."""
    if receipt_digest is None:
        from k3infra.receipt import load_receipt

        receipt_digest = load_receipt().model.tree_digest
    lock, _sha = load_lock(path)
    verdict = compare_with_receipt(lock, receipt_digest)
    if verdict is True:
        return lock, None
    if profile == "custom":
        return lock, f"{verdict} (accepted: profile custom)"
    raise NotMeasuredTree(f"k3:weights.lockFile {path}: {verdict}; set k3:profile to custom to "
                          "serve another tree")
