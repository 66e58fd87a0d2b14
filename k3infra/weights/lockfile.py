"""The stack's lock file (`k3:weights.lockFile`), checked at program start.

The lock must pin the configured revision and, unless `k3:profile` is custom, carry the
receipt's published tree digest: anything else is "not the measured tree".
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from k3infra.config import ConfigError, StackConfig
from k3infra.receipt import Receipt

KEY = "k3:weights.lockFile"


@dataclass(frozen=True)
class StackLock:
    path: str
    text: str
    tree_digest: str
    revision: str
    total_bytes: int


def load_stack_lock(receipt: Receipt, cfg: StackConfig,
                    root: Optional[Path] = None) -> Optional[StackLock]:
    """None when the stack ships no lock (the prefetch Job then derives it from the Hub
    at the pinned revision and checks the same digest in the pod)."""
    if cfg.weights.lock_file is None:
        return None
    path = Path(cfg.weights.lock_file)
    if not path.is_absolute() and root is not None:
        path = root / path
    try:
        text = path.read_text()
        lock = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(KEY, cfg.weights.lock_file,
                          f"must name a readable k3-tree-v1 lock file (JSON): {exc}")
    for field in ("revision", "tree_digest", "files"):
        if field not in lock:
            raise ConfigError(KEY, cfg.weights.lock_file, f"lock has no {field!r}")
    if lock["revision"] != cfg.weights_revision:
        raise ConfigError(KEY, cfg.weights.lock_file,
                          f"the lock pins revision {lock['revision']}, k3:weightsRevision is "
                          f"{cfg.weights_revision}: they must be the same commit")
    if cfg.profile != "custom" and lock["tree_digest"] != receipt.model.tree_digest:
        raise ConfigError(KEY, cfg.weights.lock_file,
                          f"not the measured tree: lock digest {lock['tree_digest']} != receipt "
                          f"{receipt.model.tree_digest} (k3:profile custom serves another tree, "
                          "labelled as not measured)")
    total = int(lock.get("total_bytes") or sum(f["size"] for f in lock["files"]))
    return StackLock(str(path), text, lock["tree_digest"], lock["revision"], total)
