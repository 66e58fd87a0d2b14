"""The lock file and the k3-tree-v1 tree digest (standard library only: runs in pods).

Lock file (JSON, UTF-8)::

    {
      "algorithm": "k3-tree-v1",
      "repo": "<owner>/<name>",                      # Hugging Face model repo
      "revision": "<40 lowercase hex>",              # the pinned Hub commit
      "tree_digest": "sha256:<64 lowercase hex>",    # k3-tree-v1 over `files`
      "total_bytes": <sum of sizes>,
      "files": [{"path": "<relative path>", "size": <bytes>, "sha256": "<64 hex>"}, ...]
    }

`files` is sorted by path (ascending UTF-8 bytes) and lists every regular file of the
tree. A path is relative with `/` separators; no empty, `.` or `..` component, no
leading `/`, no backslash, NUL or newline; none of the reserved names below.

k3-tree-v1, exactly: the tree digest is `"sha256:" + hex(SHA-256(M))` (lowercase hex)
where the message M is the ASCII bytes `k3-tree-v1` followed by one LF (0x0A), then,
for every file in ascending order of its path's UTF-8 bytes, the record

    path (UTF-8) , 0x00 , size (ASCII decimal, no sign, no leading zeros) , 0x00 ,
    sha256 of the file's content (64 lowercase ASCII hex) , 0x0A

and nothing else (no record count, no trailing bytes). Directories, permissions,
timestamps and ownership are not hashed; an empty tree hashes the header alone. Two
trees have the same digest iff they hold the same paths with the same contents.

Reserved names, excluded from the tree, the lock and the extra-file check (top level of
the tree directory only):

- `.k3-verified.json`      the "verified" marker the prefetch writes last;
- `.k3-verify-state.json`  the verifier's per-file stamps;
- their atomic-write temporaries `<name>.<pid>.<hex>.tmp`;
- `.cache/huggingface/`    huggingface_hub's local-dir metadata and partial downloads
  (the prefetch removes it once the tree matches; a tree made with `hf download
  --local-dir` keeps it, and it must not change that tree's digest).
"""
from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import re
import stat
from collections import namedtuple
from collections.abc import Iterable

try:                       # in a pod: shipped beside this file (k3weights/podcommon.py)
    from .podcommon import (OPEN_FLAGS, JsonRefused, atomic_write, fsync_dir,  # noqa: F401
                            open_regular, output_target, parse_json, read_regular)  # (re-exported)
except ImportError:        # on the operator's machine: the one copy, k3infra/podcommon.py
    from ..podcommon import (OPEN_FLAGS, JsonRefused, atomic_write, fsync_dir,  # noqa: F401
                             open_regular, output_target, parse_json, read_regular)

ALGORITHM = "k3-tree-v1"
MARKER_NAME = ".k3-verified.json"
STATE_NAME = ".k3-verify-state.json"
SCRATCH_PARENT = ".cache"
SCRATCH_NAME = "huggingface"
SCRATCH_DIR = f"{SCRATCH_PARENT}/{SCRATCH_NAME}"
# Full matches only (re.fullmatch, \A..\Z): `$` also matches before a final newline.
_HEX40 = re.compile(r"\A[0-9a-f]{40}\Z")
_HEX64 = re.compile(r"\A[0-9a-f]{64}\Z")
_REPO = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_TMP = re.compile(r"\A(%s|%s)\.[0-9]+\.[0-9a-f]+\.tmp\Z" % (re.escape(MARKER_NAME), re.escape(STATE_NAME)))
# The most bytes read from a lock (a million files fit in ~150 MB: a 1 TB tree has a few
# thousand), a marker, a stamp record or a Hub metadata file: past that a file is refused
# unread (whoever writes the volume must not make the gate allocate without bound).
LOCK_MAX_BYTES = 256 << 20
SMALL_MAX_BYTES = 1 << 20
# Every file of a tree is opened by podcommon.open_regular (a regular file after a
# no-follow, non-blocking open) and small files read by podcommon.read_regular (bounded).
_LOCK_KEYS = ("algorithm", "repo", "revision", "tree_digest", "total_bytes", "files")
# The read path (hash_file): files are mapped in windows of MAP_WINDOW bytes and hashed
# straight from the page cache. The window is not pre-filled (no MAP_POPULATE): the page
# faults map the page cache's large folios a folio at a time, while MAP_POPULATE walks
# them page by page (on kernel 6.18 / ext4 that cost about twice the system time and
# 3-5 % of the verify's wall time). MADV_SEQUENTIAL and a POSIX_FADV_WILLNEED on the next
# window keep a cold disk read ahead of the hashing. Where a file cannot be mapped, it is
# read into a READ_SIZE buffer (1 MiB: it stays in the core's L2 between the copy and
# the hash). Either way hashlib drops the GIL for the whole buffer, so threads hash
# files in parallel.
MAP_WINDOW = 64 << 20
READ_SIZE = 1 << 20
_MADV_SEQUENTIAL = getattr(mmap, "MADV_SEQUENTIAL", None)


class LockError(ValueError):
    """A lock file (or a value for one) that does not follow the format."""


def describe_oserror(exc: OSError) -> str:
    """`<path>: <reason>` for a refusal line (strerror alone hides which file)."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


# Value types are named tuples and small classes, not dataclasses: `dataclasses` imports
# `inspect` (~10 ms), paid by every `k3infra weights verify` and every serving pod's gate.
FileEntry = namedtuple("FileEntry", "path size sha256")


class Lock(namedtuple("Lock", "repo revision files tree_digest total_bytes algorithm",
                      defaults=(ALGORITHM,))):
    """A parsed lock: `files` is a tuple of FileEntry; `by_path` indexes them by path."""

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls, *args, **kwargs)
        self.by_path = {f.path: f for f in self.files}
        return self


def check_path(path: str) -> str:
    """`path` if it is a valid lock path, else LockError naming the rule it breaks."""
    if not isinstance(path, str) or not path:
        raise LockError(f"path {_brief(path)}: must be a non-empty string")
    if len(path) > 4096:
        raise LockError(f"path {_brief(path)}: longer than 4096 characters")
    if path.startswith("/"):
        raise LockError(f"path {path!r}: must be relative (no leading '/')")
    bad = next((c for c in ("\\", "\x00", "\n", "\r") if c in path), None)
    if bad is not None:
        raise LockError(f"path {path!r}: must not contain {bad!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise LockError(f"path {path!r}: empty, '.' or '..' component (escapes or aliases the tree)")
    if reserved(path):
        raise LockError(f"path {path!r}: reserved for the verifier/prefetch ({MARKER_NAME}, "
                        f"{STATE_NAME}, {SCRATCH_DIR}/)")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise LockError(f"path {path!r}: not valid UTF-8") from None
    return path


def reserved(path: str) -> bool:
    """True for the top-level names the tree excludes (marker, state, scratch)."""
    if path in (MARKER_NAME, STATE_NAME) or _TMP.match(path):
        return True
    return path == SCRATCH_DIR or path.startswith(SCRATCH_DIR + "/")


def check_revision(revision: str) -> str:
    if not isinstance(revision, str) or not _HEX40.match(revision):
        raise LockError(f"revision {_brief(revision)}: must be a 40-hex lowercase commit id "
                        "(a branch or tag name is never accepted: it moves)")
    return revision


def check_repo(repo: str) -> str:
    if not isinstance(repo, str) or len(repo) > 256 or not _REPO.match(repo):
        raise LockError(f"repo {_brief(repo)}: must be '<owner>/<name>'")
    return repo


def check_sha256(value: str, path: str = "") -> str:
    if not isinstance(value, str) or not _HEX64.match(value):
        raise LockError(f"sha256 {_brief(value)}{' of ' + _brief(path) if path else ''}: must "
                        "be 64 lowercase hex")
    return value


def _sort_key(path: str) -> bytes:
    return path.encode("utf-8")


def tree_digest(files: Iterable[FileEntry]) -> str:
    """k3-tree-v1 over (path, size, sha256) records; see the module docstring."""
    h = hashlib.sha256(ALGORITHM.encode("ascii") + b"\n")
    for f in sorted(files, key=lambda e: _sort_key(e.path)):
        h.update(f.path.encode("utf-8") + b"\0" + str(int(f.size)).encode("ascii") + b"\0"
                 + f.sha256.encode("ascii") + b"\n")
    return "sha256:" + h.hexdigest()


# A file's size: at most 1 PiB (a lock's total is bounded by what the lock can list).
MAX_FILE_BYTES = 1 << 50


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _entry(path: object, size: object, sha256: object) -> FileEntry:
    """One checked FileEntry; LockError naming the field that breaks the format."""
    check_path(path)
    check_sha256(sha256, path)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_BYTES:
        raise LockError(f"size {_brief(size)} of {_brief(path)}: must be a non-negative integer "
                        f"(at most {MAX_FILE_BYTES})")
    return FileEntry(path=path, size=size, sha256=sha256)


def make_lock(repo: str, revision: str, files: Iterable[FileEntry]) -> Lock:
    """A validated Lock for these files (sorted; digest and total computed)."""
    entries = [_entry(*e) for e in files]
    entries.sort(key=lambda e: _sort_key(e.path))
    seen = set()
    for e in entries:
        if e.path in seen:
            raise LockError(f"path {e.path!r}: listed twice")
        seen.add(e.path)
    _check_no_file_dir_clash(entries)
    return Lock(repo=check_repo(repo), revision=check_revision(revision), files=tuple(entries),
                tree_digest=tree_digest(entries), total_bytes=sum(e.size for e in entries))


def _check_no_file_dir_clash(entries: list[FileEntry]) -> None:
    paths = {e.path for e in entries}
    for e in entries:
        parts = e.path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in paths:
                raise LockError(f"path {e.path!r}: {'/'.join(parts[:i])!r} is listed as a file")


def lock_to_json(lock: Lock) -> str:
    """Deterministic text: the same lock always serialises to the same bytes."""
    head = {"algorithm": lock.algorithm, "repo": lock.repo, "revision": lock.revision,
            "tree_digest": lock.tree_digest, "total_bytes": lock.total_bytes}
    lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    rows = [json.dumps({"path": f.path, "size": f.size, "sha256": f.sha256}, ensure_ascii=False)
            for f in lock.files]
    if rows:
        lines.append('  "files": [')
        lines += [f"    {r}," for r in rows[:-1]] + [f"    {rows[-1]}", "  ]"]
    else:
        lines.append('  "files": []')
    lines.append("}")
    return "\n".join(lines) + "\n"


def parse_lock(data: object) -> Lock:
    """A Lock from parsed JSON; LockError naming the key, the value and what is accepted."""
    if not isinstance(data, dict):
        raise LockError("lock: the top level must be a JSON object")
    missing = [k for k in _LOCK_KEYS if k not in data]
    if missing:
        raise LockError(f"lock: missing key(s) {missing}; a lock has {list(_LOCK_KEYS)}")
    unknown = sorted(set(data) - set(_LOCK_KEYS))
    if unknown:
        raise LockError(f"lock: unknown key(s) {unknown}; a lock has {list(_LOCK_KEYS)}")
    if data["algorithm"] != ALGORITHM:
        raise LockError(f"algorithm {_brief(data['algorithm'])}: only {ALGORITHM!r} is accepted")
    if not isinstance(data["files"], list):
        raise LockError("files: must be a list of {path, size, sha256}")
    entries = []
    for i, row in enumerate(data["files"]):
        if not isinstance(row, dict) or set(row) != {"path", "size", "sha256"}:
            raise LockError(f"files[{i}] {_brief(row)}: must be an object with exactly path, "
                            "size, sha256")
        # Each field checked before the list is sorted or hashed: the sort key encodes
        # the path (a number, an object or a lone surrogate there must be a refusal).
        try:
            entry = _entry(row["path"], row["size"], row["sha256"])
        except LockError as exc:
            raise LockError(f"files[{i}]: {exc}") from None
        entries.append(entry)
    lock = make_lock(data["repo"], data["revision"], entries)
    if [e.path for e in entries] != [e.path for e in lock.files]:
        raise LockError("files: must be sorted by path (ascending UTF-8 bytes)")
    if data["tree_digest"] != lock.tree_digest:
        raise LockError(f"tree_digest {_brief(data['tree_digest'])} does not match the files "
                        f"listed (k3-tree-v1 gives {lock.tree_digest}): the lock was edited or "
                        "is corrupt")
    if (not isinstance(data["total_bytes"], int) or isinstance(data["total_bytes"], bool)
            or data["total_bytes"] != lock.total_bytes):
        raise LockError(f"total_bytes {_brief(data['total_bytes'])}: the files add up to "
                        f"{lock.total_bytes}")
    return lock


def load_lock(path: str) -> tuple[Lock, str]:
    """(Lock, sha256 hex of the lock file's bytes)."""
    try:
        raw = read_regular(path, LOCK_MAX_BYTES)
    except OSError as exc:
        raise LockError(f"lock {path}: cannot read ({exc.strerror or exc})") from None
    return parse_lock_bytes(raw, path), hashlib.sha256(raw).hexdigest()


def parse_served_lock(raw: bytes, where: str, repo: str, revision: str, limit: int) -> Lock:
    """A lock a source served (an in-cluster source, an object store): bounded, parsed (its
    digest recomputed from its file list) and of the pinned repo and revision; the pinned
    digest is check-lock.sh's to hold, before a single shard is fetched."""
    if len(raw) > limit:
        raise LockError(f"{where}: lock larger than {limit} bytes")
    lock = parse_lock_bytes(raw, where)
    if lock.repo != repo or lock.revision != revision:
        raise LockError(f"{where}: the served lock pins {lock.repo}@{lock.revision}, "
                        f"wanted {repo}@{revision}")
    return lock


def parse_lock_bytes(raw: bytes, path: str) -> Lock:
    """parse_lock of a lock file's bytes; LockError naming `path` for bytes that are not
    UTF-8 JSON (deep nesting included: json's RecursionError is a refusal too)."""
    try:
        data = parse_json(raw, max_depth=8)         # podcommon's bounded JSON parser
    except JsonRefused as exc:
        raise LockError(f"lock {path}: not a lock ({exc})") from None
    try:
        return parse_lock(data)
    except LockError as exc:
        raise LockError(f"lock {path}: {exc}") from None


def atomic_write_json(path: str, obj: object) -> None:
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode("utf-8"))


class Problem(namedtuple("Problem", "path message")):
    __slots__ = ()

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class Scan:
    """What is on disk under a tree: regular files (lstat) and what may not be there."""

    def __init__(self) -> None:
        self.files: dict = {}            # relative path -> os.stat_result
        self.problems: list = []         # [Problem]
        self.problem_paths: set = set()


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def _realpath(path: str) -> str:
    try:
        return os.path.realpath(path, strict=True)
    except (OSError, RuntimeError):     # a dangling link or a loop resolves nowhere
        return ""


def scan_tree(root: str) -> Scan:
    """Walk `root` without following symlinks: one lstat per entry (O(files) calls)."""
    scan = Scan()
    real_root = os.path.realpath(root).rstrip("/") + "/"

    def add(rel: str, message: str) -> None:
        scan.problems.append(Problem(rel, message))
        scan.problem_paths.add(rel)

    def walk(abs_dir: str, rel_dir: str) -> None:
        try:
            entries = sorted(os.scandir(abs_dir), key=lambda e: e.name)
        except OSError as exc:
            add(rel_dir or ".", f"cannot list directory ({exc.strerror})")
            return
        for entry in entries:
            if not rel_dir and (entry.name in (MARKER_NAME, STATE_NAME) or _TMP.match(entry.name)):
                continue
            if rel_dir == SCRATCH_PARENT and entry.name == SCRATCH_NAME and entry.is_dir(follow_symlinks=False):
                continue  # huggingface_hub's download scratch area, see the module docstring
            visit(entry, f"{rel_dir}/{entry.name}" if rel_dir else entry.name)

    def visit(entry: os.DirEntry, rel: str) -> None:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as exc:
            add(rel, f"cannot stat ({exc.strerror})")
            return
        if stat.S_ISREG(st.st_mode):
            scan.files[rel] = st
        elif stat.S_ISDIR(st.st_mode):
            walk(entry.path, rel)
        elif stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(entry.path)
            except OSError as exc:
                target = f"unreadable: {exc.strerror}"
            inside = (_realpath(entry.path) + "/").startswith(real_root)
            add(rel, f"symlink (-> {target}): the tree must hold regular files only" if inside
                else f"symlink escaping the tree (-> {target})")
        else:
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
            add(rel, f"{kind}: the tree must hold regular files only")

    walk(root, "")
    return scan


# size: the bytes actually read; before/after: fstat around the read.
FileHash = namedtuple("FileHash", "sha256 size before after")


def stamp_of(st: os.stat_result) -> tuple[int, int, int, int]:
    """What proves a file unchanged since it was hashed: (size, mtime_ns, ctime_ns, inode).
    ctime cannot be set from user space, so rewriting a file and restoring its mtime
    still changes the stamp."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def hash_file(path: str, buf: bytearray | None = None, limit: int | None = None) -> FileHash:
    """SHA-256 of a regular file: the weights runtime's one read path (the verifier, the
    prefetch and the serving gate read through it). Opens with O_NOFOLLOW (a symlink is
    refused), stamps the file before and after, and reads every byte through the page
    cache, so the pages stay warm for the engine that loads the file next.

    Zero-copy where it can: windows of the file are mapped and hashed in place
    (`_hash_mapped`), which spends ~10 % less CPU per byte than copying into a buffer
    (benchmarks/weights_bench.py). Elsewhere (a filesystem without mmap, an empty file)
    it reads into `buf` (READ_SIZE when not given). A file truncated by another writer
    while it is mapped ends the process with SIGBUS: the run fails, nothing is marked
    verified. The runtime never hashes a file that another process is writing (the
    prefetch holds a flock on the tree; the gate reads a read-only mount).

    `limit` (the lock's size of the file): a larger file is not read at all, and a file
    growing while read is read to one buffer past it, never without bound."""
    fd, before = open_regular(path)
    try:
        if limit is not None and before.st_size > limit:
            return FileHash(sha256="", size=before.st_size, before=before, after=before)
        _advise(fd, 0, 0, "POSIX_FADV_SEQUENTIAL")
        h = hashlib.sha256()
        buf = buf if buf is not None else bytearray(READ_SIZE)
        total = _hash_mapped(fd, before.st_size, h, buf, limit)
        if total is None:
            total = _hash_read(fd, h, buf, 0, limit)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    return FileHash(sha256=h.hexdigest(), size=total, before=before, after=after)


def _advise(fd: int, offset: int, length: int, advice: str) -> None:
    if hasattr(os, "posix_fadvise") and hasattr(os, advice):
        try:
            os.posix_fadvise(fd, offset, length, getattr(os, advice))
        except OSError:
            pass        # advice only: some filesystems refuse it


def _hash_mapped(fd: int, size: int, h, buf: bytearray, most: int | None = None) -> int | None:
    """Hash `size` bytes of `fd` from the page cache through mmap windows; None when the
    file cannot be mapped (then nothing was hashed)."""
    if size <= 0:
        return None
    offset = 0
    _advise(fd, 0, min(MAP_WINDOW, size), "POSIX_FADV_WILLNEED")
    while offset < size:
        length = min(MAP_WINDOW, size - offset)
        if offset + length < size:      # the disk reads the next window while this one hashes
            _advise(fd, offset + length, min(MAP_WINDOW, size - offset - length), "POSIX_FADV_WILLNEED")
        try:
            window = mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=offset)
        except (OSError, ValueError):
            if offset == 0:
                return None
            raise
        try:
            if _MADV_SEQUENTIAL is not None:
                window.madvise(_MADV_SEQUENTIAL)
            with memoryview(window) as view:
                h.update(view)
        finally:
            window.close()
        offset += length
    # Bytes appended after the fstat are read too: the size check sees a grown file.
    return offset + _hash_read(fd, h, buf, offset, None if most is None else most - offset)


def _hash_read(fd: int, h, buf: bytearray, offset: int = 0, most: int | None = None) -> int:
    """Hash `fd` from `offset` to its end (or just past `most` bytes) through `buf`; the
    number of bytes read."""
    view = memoryview(buf)
    total = 0
    os.lseek(fd, offset, os.SEEK_SET)
    with open(fd, "rb", buffering=0, closefd=False) as raw:
        while True:
            n = raw.readinto(buf)
            if not n:
                return total
            h.update(view[:n])
            total += n
            if most is not None and total > most:
                return total


def default_workers() -> int:
    """Hashing threads: the CPUs this process may run on, capped by a cgroup v2 CPU quota
    (a pod limited to 32 CPUs on a 192-core node must not start 192 readers)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def revision_from_hf_metadata(root: str) -> str | None:
    """The commit a `hf download --local-dir` tree was fetched at, from huggingface_hub's
    `.cache/huggingface/download/*.metadata` (first line: commit). None when absent or
    when the files disagree."""
    commits = set()
    for dirpath, _dirs, names in os.walk(os.path.join(root, SCRATCH_DIR, "download")):
        for name in names:
            if name.endswith(".metadata"):
                try:
                    raw = read_regular(os.path.join(dirpath, name), SMALL_MAX_BYTES)
                    commits.add(raw.decode("utf-8", "replace").split("\n", 1)[0].strip())
                except OSError:
                    continue
    if len(commits) == 1:
        (commit,) = commits
        return commit if _HEX40.match(commit) else None
    return None
