"""Standard-library helpers shared by the pod runtimes and the operator's machine, one
copy each: file SHA-256, atomic write, the comma-separated integer list of the CLIs.

The weights runtime (ConfigMap package `k3weights`) and the benchmark runtime ship this
file next to their own modules, so it imports nothing beyond the standard library.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat

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


# Every open of a file someone else may have written (a weights volume, a stack file): no
# link followed at the last component, no blocking open (a FIFO opens at once, and the
# fstat after the open refuses it), no fd leaked to children.
OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
              | getattr(os, "O_CLOEXEC", 0))
FILE_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
              (stat.S_ISDIR, "a directory"))


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """(fd, fstat) of `path` opened with OPEN_FLAGS; OSError naming `path` unless it is a
    regular file *after* opening (a FIFO, socket, device or link swapped in after a scan
    is refused here, without blocking)."""
    fd = os.open(path, OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in FILE_KINDS if test(st.st_mode)), "not a regular file")
            raise OSError(errno.EINVAL, f"{kind}, not a regular file", path)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them; OSError naming the
    path for anything else (see open_regular) or a larger file."""
    fd, st = open_regular(path)
    try:
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than the {limit} accepted", path)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:   # grew after the fstat
                raise OSError(errno.EFBIG, f"more than the {limit} bytes accepted", path)
    finally:
        os.close(fd)
