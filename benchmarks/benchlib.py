"""What every benchmark here measures the same way: the machine's hashing limit."""
from __future__ import annotations

import hashlib
import os
import time

MIB = 1 << 20


def single_core_sha256(seconds: float = 2.0) -> float:
    """GB/s of hashlib SHA-256 on one core over an in-memory buffer: one core's share of
    the hashing limit (cores x this) the figures are given against."""
    buf = os.urandom(64 * MIB)
    h = hashlib.sha256()
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        h.update(buf)
        n += len(buf)
    return n / (time.perf_counter() - start) / 1e9
