"""Standard-library helpers shared by the pod runtimes and the operator's machine, one
copy each: file SHA-256, atomic write, the comma-separated integer list of the CLIs.

The weights runtime (ConfigMap package `k3weights`) and the benchmark runtime ship this
file next to their own modules, so it imports nothing beyond the standard library.
"""
from __future__ import annotations

import hashlib
import os

CHUNK = 1 << 20


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, data: bytes) -> None:
    """Write `data` to `path` so a reader sees the old file or the new one, never half:
    temporary in the same directory, fsync, rename, fsync the directory."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    fsync_dir(directory)


def atomic_write_text(path, text: str) -> None:
    atomic_write(path, text.encode("utf-8"))


def int_list(text: str) -> list[int]:
    """`8,16,32` -> [8, 16, 32] (empty items ignored): argparse `type=` of the CLIs."""
    return [int(x) for x in text.split(",") if x.strip()]
