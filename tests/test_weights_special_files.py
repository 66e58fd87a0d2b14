"""Issue 28, point 4: whoever can write the weights volume must not hang or exhaust the gate
and the verifier. Every file they open is opened without following links and without
blocking, checked to be a regular file after opening, read to a bound; every refusal
names the path. Each test runs under an alarm: a blocking open fails the test, it does
not hang the suite."""
from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys

import pytest

from k3infra.weights import gate, tree, verify

REV = "0123456789abcdef0123456789abcdef01234567"
LIMIT_S = 20


@pytest.fixture(autouse=True)
def bounded():
    """Fail (never hang) a test that blocks: the harness's bound, not a speed check."""
    def expired(_sig, _frame):
        raise TimeoutError(f"blocked for {LIMIT_S} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(os.urandom(200_000))
    (root / "config.json").write_text('{"a": 1}\n')
    (root / "sub" / "tok.json").write_text('{"t": 1}\n')
    lock = verify.lock_from_dir(str(root), "o/m", REV, workers=2)
    lock_file = tmp_path / "lock.json"
    lock_file.write_text(tree.lock_to_json(lock))
    return root, lock, lock_file


def gate_run(root, lock_file, lock, **kw):
    return gate.run_gate(str(root), str(lock_file), expect_digest=lock.tree_digest, repo="o/m",
                         revision=REV, emit=None, **kw)


def fifo(path):
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def unix_socket(path):
    path.unlink(missing_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


def link(path, target):
    path.unlink(missing_ok=True)
    os.symlink(target, path)


# ---- the lock -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "socket", "dev-zero-link", "dev-zero", "loop", "huge",
                                  "deep", "not-utf8"])
def test_a_hostile_lock_is_refused_with_its_path(served, tmp_path, kind):
    root, lock, lock_file = served
    held = None
    if kind == "fifo":
        fifo(lock_file)
    elif kind == "socket":
        held = unix_socket(lock_file)
    elif kind == "dev-zero-link":
        link(lock_file, "/dev/zero")
    elif kind == "dev-zero":
        lock_file = "/dev/zero"
    elif kind == "loop":
        link(lock_file, lock_file)
    elif kind == "huge":            # sparse: costs no disk
        with open(lock_file, "r+b") as fh:
            fh.truncate(tree.LOCK_MAX_BYTES + 1)
    elif kind == "deep":
        lock_file.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "not-utf8":
        lock_file.write_bytes(b"\xff\xfe{}")
    with pytest.raises(gate.GateRefused) as exc:
        gate_run(root, lock_file, lock)
    assert str(lock_file) in str(exc.value)
    with pytest.raises(tree.LockError) as exc:
        tree.load_lock(str(lock_file))
    assert str(lock_file) in str(exc.value)
    if held:
        held.close()


def test_the_runtime_gate_refuses_a_fifo_lock_in_one_line(served):
    root, lock, lock_file = served
    fifo(lock_file)
    res = subprocess.run([sys.executable, "-m", "k3infra.weights", "gate", str(root), "--lock",
                          str(lock_file), "--expect-digest", lock.tree_digest, "--repo", "o/m",
                          "--revision", REV], capture_output=True, text=True, timeout=LIMIT_S)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert f"REFUSED: no readable lock at {lock_file} (a FIFO, not a regular file)" in res.stderr


# ---- the marker and the stamp record --------------------------------------------------

@pytest.mark.parametrize("make", [fifo, lambda p: link(p, "/dev/zero"),
                                  lambda p: open(p, "wb").truncate(tree.SMALL_MAX_BYTES + 1)],
                         ids=["fifo", "dev-zero-link", "huge"])
def test_a_hostile_marker_is_no_marker(served, make):
    root, lock, lock_file = served
    make(root / tree.MARKER_NAME)
    assert verify.read_marker(str(root)) is None
    with pytest.raises(gate.GateRefused, match="is not a verified tree: no valid marker"):
        gate_run(root, lock_file, lock, require_marker=True)


@pytest.mark.parametrize("make", [fifo, lambda p: link(p, "/dev/zero")], ids=["fifo", "dev-zero-link"])
def test_a_hostile_stamp_record_is_no_record(served, tmp_path, make):
    root, lock, lock_file = served
    state = tmp_path / "pod-private"
    state.mkdir()
    make(state / gate.RECORD_NAME)
    assert gate.load_record(str(state), lock, str(root)) == {}


# ---- the tree -------------------------------------------------------------------------

def problems(report):
    return {p.path: p.message for p in report.problems}


@pytest.mark.parametrize("kind,expect", [
    ("fifo", "a FIFO: the tree must hold regular files only"),
    ("socket", "a socket: the tree must hold regular files only"),
    ("dev-zero-link", "symlink escaping the tree (-> /dev/zero)"),
    ("loop", "symlink escaping the tree (-> model.safetensors)"),
])
def test_a_special_file_in_the_tree_is_refused_by_path(served, kind, expect):
    root, lock, lock_file = served
    path = root / "model.safetensors"
    held = None
    if kind == "fifo":
        fifo(path)
    elif kind == "socket":
        held = unix_socket(path)
    elif kind == "dev-zero-link":
        link(path, "/dev/zero")
    elif kind == "loop":
        link(path, "model.safetensors")
    report = gate_run(root, lock_file, lock)
    assert problems(report) == {"model.safetensors": expect}
    if held:
        held.close()


def swap_after_scan(monkeypatch, change):
    """Run `change` between the verifier's scan and its hashing (the race an attacker wins)."""
    real = tree.scan_tree

    def scan_then_swap(root):
        scan = real(root)
        change()
        return scan

    monkeypatch.setattr(tree, "scan_tree", scan_then_swap)


@pytest.mark.parametrize("kind,expect", [
    ("fifo", "cannot read (a FIFO, not a regular file)"),
    ("dev-zero-link", "cannot read (a symbolic link, not a regular file)"),
    ("socket", "cannot read (a special file, not a regular file)"),
    ("grown", "grown: 200001 bytes, the lock says 200000"),
])
def test_a_file_swapped_between_scan_and_hash_is_refused(served, monkeypatch, kind, expect):
    root, lock, lock_file = served
    path = root / "model.safetensors"
    held = []

    def change():
        if kind == "fifo":
            fifo(path)
        elif kind == "dev-zero-link":
            link(path, "/dev/zero")
        elif kind == "socket":
            held.append(unix_socket(path))
        elif kind == "grown":
            with open(path, "ab") as fh:
                fh.write(b"x")

    swap_after_scan(monkeypatch, change)
    report = gate_run(root, lock_file, lock)
    assert problems(report) == {"model.safetensors": expect}
    for s in held:
        s.close()


def test_a_directory_swapped_for_a_link_to_dev_is_refused(served, monkeypatch, tmp_path):
    """O_NOFOLLOW guards the last component only; the fstat after the open catches a parent
    directory swapped for a link (here to a directory holding a FIFO)."""
    root, lock, lock_file = served
    fake = tmp_path / "fake"
    fake.mkdir()
    os.mkfifo(fake / "tok.json")

    def change():
        (root / "sub" / "tok.json").unlink()
        (root / "sub").rmdir()
        os.symlink(fake, root / "sub")

    swap_after_scan(monkeypatch, change)
    report = gate_run(root, lock_file, lock)
    assert problems(report) == {"sub/tok.json": "cannot read (a FIFO, not a regular file)"}


def test_an_unreadable_file_is_refused_by_path(served, monkeypatch):
    root, lock, lock_file = served
    target = str(root / "config.json")
    real = os.open

    def denied(path, *a, **kw):          # root reads a chmod 000 file: deny it here instead
        if str(path) == target:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "open", denied)
    report = gate_run(root, lock_file, lock)
    assert problems(report) == {"config.json": "cannot read (Permission denied)"}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 directory")
def test_an_unlistable_directory_is_refused_by_path(served):
    root, lock, lock_file = served
    os.chmod(root / "sub", 0)
    try:
        report = gate_run(root, lock_file, lock)
    finally:
        os.chmod(root / "sub", 0o755)
    assert problems(report) == {"sub": "cannot list directory (Permission denied)"}


def test_open_regular_refuses_a_fifo_without_blocking(tmp_path):
    path = tmp_path / "p"
    os.mkfifo(path)
    with pytest.raises(OSError) as exc:
        tree.open_regular(str(path))
    assert exc.value.filename == str(path) and "FIFO" in exc.value.strerror


def test_the_prefetch_refuses_a_fifo_for_its_partial_file_and_its_directory_lock(tmp_path):
    from k3infra.weights import prefetch

    partial = tmp_path / "model.safetensors.part"
    os.mkfifo(partial)
    with pytest.raises(OSError) as exc:
        prefetch._open_partial(str(partial))
    assert exc.value.filename == str(partial)
    with pytest.raises(OSError):
        prefetch._DirLock(str(partial), emit=lambda _line: None)
