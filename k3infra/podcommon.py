"""Standard-library helpers shared by the pod runtimes and the operator's machine, one
copy each: file SHA-256, the one output writer (atomic_write), the one bounded reader
(open_regular / read_regular) and JSON parser (parse_json), the comma-separated integer
list of the CLIs, the one rule for credentials inside a URL (url_credentials).

The weights runtime (ConfigMap package `k3weights`) and the benchmark runtime ship this
file next to their own modules, so it imports nothing beyond the standard library.
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat

CHUNK = 1 << 20


def sha256_file(path) -> str:
    """SHA-256 of a regular file (open_regular: no link followed, no FIFO waited on)."""
    h = hashlib.sha256()
    fd, _st = open_regular(os.fspath(path))
    with open(fd, "rb", closefd=True) as fh:
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


def output_target(path) -> os.stat_result | None:
    """What `path` is as an output: None for a new file in an existing directory, its
    lstat for an existing regular file; OSError naming `path` for anything else (a device
    node, a FIFO, a socket, a directory, a symbolic link, a missing or non-directory
    parent), so a writer never replaces or writes through what is not a file."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        parent = os.stat(directory)
    except FileNotFoundError:
        raise OSError(errno.ENOENT, f"the directory {directory} does not exist (create it "
                      "first)", path) from None
    if not stat.S_ISDIR(parent.st_mode):
        raise OSError(errno.ENOTDIR, f"{directory} is not a directory", path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "a symbolic link, not a regular file (name the file it "
                      "points at)", path)
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in FILE_KINDS if test(st.st_mode)), "not a regular file")
        raise OSError(errno.EINVAL, f"{kind}, not a regular file (an output is a regular "
                      "file or a new one)", path)
    return st


def output_directory(path, create: bool = True) -> str:
    """A directory outputs go into: an existing directory (not a link to one), or a new
    one made with its missing parents (`mkdir -p`; `create=False` only checks that it
    can be). OSError naming the path for a file, a device, a link or a non-directory on
    the way."""
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise OSError(errno.ENOTDIR, f"{parent} is not a directory", path) from None
        if create:
            os.makedirs(path, exist_ok=True)
        return path
    if not stat.S_ISDIR(st.st_mode):
        kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else
                next((name for test, name in FILE_KINDS if test(st.st_mode)), "a regular file"))
        raise OSError(errno.ENOTDIR, f"{kind}, not a directory (an output directory is an "
                      "existing directory or a new one)", path)
    return path


def atomic_write(path, data: bytes) -> None:
    """The one output writer. Writes `data` to `path` so a reader sees the old file or
    the new one, never half: `path` must be a regular file or a new one in an existing
    directory (output_target; anything else is refused before a byte is written), the
    bytes go to a temporary file beside it (fsync), which is renamed over it (the
    directory fsync'd). An existing file keeps its permission bits."""
    path = os.fspath(path)
    before = output_target(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    mode = stat.S_IMODE(before.st_mode) if before is not None else 0o644
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, mode)
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
        # Checked again right before the rename: a node swapped in meanwhile is refused.
        now = output_target(path)
        if (before is None) != (now is None) or (now is not None and (now.st_ino, now.st_dev)
                                                 != (before.st_ino, before.st_dev)):
            raise OSError(errno.EAGAIN, "changed while it was being written; nothing replaced", path)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    fsync_dir(directory)


def atomic_write_text(path, text: str) -> None:
    atomic_write(path, text.encode("utf-8"))


# A URL's userinfo: `scheme://user:password@` (any scheme) or `http(s)://token@` (a token
# as the user). Credentials in a URL end up in plain text wherever the value goes. Here,
# not in fieldtypes, so that the pod runtime's `--sources` holds the stack keys' rule.
_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*)://([^\s/?#@]*)@")


def url_credentials(value: str) -> str | None:
    """`value` with the credentials of every URL in it masked (`***`), or None when no URL
    in it carries any (see _URL_USERINFO; `ssh://git@host` names a user, not a secret)."""
    found = False

    def mask(m: re.Match) -> str:
        nonlocal found
        if ":" in m.group(2) or m.group(1).lower() in ("http", "https"):
            found = True
            return f"{m.group(1)}://***@"
        return m.group(0)

    masked = _URL_USERINFO.sub(mask, value)
    return masked if found else None


def credentials_in_url(shown_in: str, instead: str) -> str:
    """The one wording of a refusal by url_credentials, for a stack key (fieldtypes) or a
    flag (CREDENTIALS_IN_FLAG): where the credentials would show, and how to pass them."""
    return (f"holds a URL with credentials (user:password@, or a token as the user): they "
            f"would stand in plain text in {shown_in}. Give the URL without them, and the "
            f"credentials {instead}")


# A flag's: the CLIs read a store's credentials as the provider's own tools do.
CREDENTIALS_IN_FLAG = credentials_in_url(
    "the shell's history, the process list and this command's output",
    "in the environment, as the provider's tools read them (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY; GOOGLE_SERVICE_ACCOUNT_KEY or GOOGLE_APPLICATION_CREDENTIALS; "
    "AZURE_STORAGE_ACCOUNT_KEY; the Hub's HF_TOKEN)")


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


def open_regular(path: str, follow_links: bool = False) -> tuple[int, os.stat_result]:
    """(fd, fstat) of `path` opened with OPEN_FLAGS; OSError naming `path` unless it is a
    regular file *after* opening (a FIFO, socket, device or link swapped in after a scan
    is refused here, without blocking). `follow_links`: a path the user typed may be a
    link (the file it reaches must still be regular); a path found inside a tree may not."""
    flags = OPEN_FLAGS if not follow_links else OPEN_FLAGS & ~getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise OSError(errno.ELOOP, "a symbolic link, not a regular file", path) from None
        if exc.errno == errno.ENXIO:     # O_NONBLOCK open of a FIFO for writing, a socket
            raise OSError(exc.errno, "a special file, not a regular file", path) from None
        raise
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


def read_regular(path: str, limit: int, follow_links: bool = False) -> bytes:
    """The one bounded reader: the bytes of the regular file `path`, at most `limit` of
    them; OSError naming the path for anything else (see open_regular) or a larger file."""
    fd, st = open_regular(path, follow_links)
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


# JSON from a file or a server: nesting, number sizes and NaN bounded, so no input makes
# the parser raise RecursionError, the int-string limit's ValueError or yield inf.
JSON_MAX_DEPTH = 64
JSON_MAX_DIGITS = 40        # 10^40: past every count, size and time any format holds


class JsonRefused(ValueError):
    """Text that is not bounded JSON; the message says where and why, in one line."""


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > JSON_MAX_DIGITS:
        raise JsonRefused(f"an integer of {len(text.lstrip('-'))} digits (at most "
                          f"{JSON_MAX_DIGITS} are accepted)")
    return int(text)


def _json_float(text: str) -> float:
    if len(text) > 2 * JSON_MAX_DIGITS:
        raise JsonRefused(f"a number written with {len(text)} characters (at most "
                          f"{2 * JSON_MAX_DIGITS} are accepted)")
    value = float(text)
    if not math.isfinite(value):
        raise JsonRefused(f"the number {text} is out of range (not finite)")
    return value


def _json_constant(name: str):
    raise JsonRefused(f"{name} is not a JSON number")


def _json_object(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise JsonRefused(f"the key {dup[:80]!r} appears twice in one object")
    return out


def json_depth(value, limit: int) -> int:
    """Nesting depth of parsed JSON, counted without recursion (stops past `limit`)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(raw, max_depth: int = JSON_MAX_DEPTH):
    """The one JSON parser for what a file or a server sent: bytes must be UTF-8, the
    text one JSON document; objects without duplicate keys, numbers finite and at most
    JSON_MAX_DIGITS digits, nesting at most `max_depth`. JsonRefused (one line) else."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = bytes(raw)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[:exc.start].count(b"\n") + 1
            raise JsonRefused(f"not UTF-8 (byte {raw[exc.start]:#04x} at line {line})") from None
    else:
        text = raw
    try:
        value = json.loads(text, parse_int=_json_int, parse_float=_json_float,
                           parse_constant=_json_constant, object_pairs_hook=_json_object)
    except JsonRefused:
        raise
    except RecursionError:
        raise JsonRefused(f"nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        what = ("more than one JSON document" if exc.msg == "Extra data"
                else f"not JSON ({exc.msg})")
        raise JsonRefused(f"{what} at line {exc.lineno}, column {exc.colno}") from None
    except ValueError as exc:          # what a hook or int() still raises
        raise JsonRefused(f"not JSON ({str(exc)[:120]})") from None
    if json_depth(value, max_depth) > max_depth:
        raise JsonRefused(f"nested deeper than {max_depth} levels")
    return value
