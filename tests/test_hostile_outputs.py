"""Issue 48, kind 3: output paths are hostile. The one output writer
(podcommon.atomic_write, podcommon.output_directory) writes a regular file or a new one in
an existing directory, through a temporary file beside it renamed into place; a device
node, a FIFO, a socket, a directory, a link or a missing parent is refused in one line,
before the command does its work, and left as it was."""
from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from bench_results import receipt_latencies_ms, result_dict, write_result
from hostile import bounded, cli
from k3infra.podcommon import atomic_write, output_directory

REV = "0123456789abcdef0123456789abcdef01234567"


def target(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"out-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))     # a /dev/null of our own
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
    elif kind == "link":
        (tmp_path / "real").write_text("old")
        path.symlink_to(tmp_path / "real")
    elif kind == "dangling-link":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "missing-parent":
        path = tmp_path / "absent" / "out"
    elif kind == "parent-is-a-file":
        (tmp_path / "file").write_text("x")
        path = tmp_path / "file" / "out"
    return path


KINDS = ["fifo", "device", "directory", "socket", "link", "dangling-link", "missing-parent",
         "parent-is-a-file"]
WORDS = {"fifo": "a FIFO", "device": "a character device", "directory": "a directory",
         "socket": "a socket", "link": "a symbolic link", "dangling-link": "a symbolic link",
         "missing-parent": "does not exist", "parent-is-a-file": "is not a directory"}


def _unchanged(tmp_path: Path, kind: str, path: Path) -> None:
    if kind == "device":
        assert stat.S_ISCHR(os.lstat(path).st_mode)
    elif kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(path).st_mode)
    elif kind == "link":
        assert path.is_symlink() and (tmp_path / "real").read_text() == "old"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("kind", KINDS)
def test_the_writer_refuses_what_is_not_a_file_and_leaves_it(tmp_path, kind):
    path = target(tmp_path, kind)
    with bounded(10), pytest.raises(OSError) as err:
        atomic_write(path, b"new")
    assert WORDS[kind] in err.value.strerror and err.value.filename == str(path)
    _unchanged(tmp_path, kind, path)


def test_the_writer_replaces_a_regular_file_atomically_and_keeps_its_mode(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text("old")
    path.chmod(0o600)
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o600
    atomic_write(tmp_path / "fresh", b"x")
    assert (tmp_path / "fresh").read_bytes() == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "stack.yaml"]


def test_a_node_swapped_in_while_writing_is_refused(tmp_path, monkeypatch):
    import k3infra.podcommon as pc

    path = tmp_path / "out"
    path.write_text("old")
    real = pc.os.fsync

    def swap(fd):
        real(fd)
        if not path.is_symlink():
            path.unlink()
            path.symlink_to("/etc/passwd")

    monkeypatch.setattr(pc.os, "fsync", swap)
    with pytest.raises(OSError, match="a symbolic link"):
        atomic_write(path, b"new")
    assert path.is_symlink()


@pytest.mark.parametrize("kind", ["fifo", "device", "socket", "link", "parent-is-a-file"])
def test_an_output_directory_is_a_directory(tmp_path, kind):
    path = target(tmp_path, kind)
    with pytest.raises(OSError):
        output_directory(path)
    output_directory(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()


# ---- every command that writes, each refusal before its work ---------------------------------

def _result(tmp_path: Path) -> Path:
    return write_result(tmp_path / "r.json", result_dict(receipt_latencies_ms(18695.0, 18766.0)))


def _tree(tmp_path: Path) -> Path:
    d = tmp_path / "tree"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text("{}")
    return d


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", [
    ("weights", "lock", "{tree}", "--repo", "o/m", "--revision", REV, "--out", "{out}"),
    ("bench", "receipt", "{result}", "--id", "x", "--single-run", "--out", "{out}"),
    ("bench", "compare", "{result}", "--plot", "{out}"),
    ("bench", "cost", "--node-rate", "80", "{result}", "--plot", "{out}"),
])
def test_each_writing_command_refuses_each_non_regular_output(tmp_path, capsys, kind, command):
    """The kit's case: `weights lock --out` given a device node replaced it (as root)."""
    out = target(tmp_path, kind)
    tree, result = _tree(tmp_path), _result(tmp_path)
    argv = [a.format(tree=tree, result=result, out=out) for a in command]
    rc, text = cli(capsys, *argv)
    assert rc == 2, text
    assert str(out) in text
    _unchanged(tmp_path, kind, out)


def test_a_plot_must_name_a_figure_format(tmp_path, capsys):
    rc, text = cli(capsys, "bench", "compare", str(_result(tmp_path)), "--plot",
                   str(tmp_path / "plot.json"))
    assert rc == 2 and "a figure is written as .png, .svg, .pdf" in text


@pytest.mark.parametrize("kind", ["fifo", "device", "socket", "link", "parent-is-a-file"])
def test_render_out_is_a_directory(tmp_path, capsys, kind):
    out = target(tmp_path, kind)
    rc, text = cli(capsys, "render", "--out", str(out))
    assert rc == 2 and str(out) in text
    _unchanged(tmp_path, kind, out)


def test_render_never_writes_through_a_linked_manifests_folder(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.yaml").write_text("mine")
    out = tmp_path / "render"
    out.mkdir()
    (out / "manifests").symlink_to(elsewhere)
    rc, text = cli(capsys, "render", "--out", str(out))
    assert rc == 2 and "manifests" in text and "a symbolic link" in text
    assert (elsewhere / "keep.yaml").read_text() == "mine" and len(list(elsewhere.iterdir())) == 1


def test_accuracy_accept_writes_through_the_one_writer(tmp_path, capsys):
    from test_hostile_files import _accuracy_run

    run = _accuracy_run(tmp_path, {"k3_smoke_gsm8k": {"metric": "exact_match,f", "score": 0.5,
                                                      "samples": 5}})
    for kind in ("fifo", "directory", "missing-parent"):
        out = target(tmp_path, kind)
        rc, text = cli(capsys, "accuracy", "compare", str(run), "--accept", "--out", str(out))
        assert rc == 2 and str(out) in text, text
        _unchanged(tmp_path, kind, out)


def test_a_refusal_comes_before_the_work(tmp_path, capsys, monkeypatch):
    """The output is checked when the arguments are parsed: nothing is hashed for a lock
    that cannot be written."""
    from k3infra.weights import verify

    monkeypatch.setattr(verify, "lock_from_dir", lambda *a, **k: pytest.fail("hashed first"))
    rc, text = cli(capsys, "weights", "lock", str(_tree(tmp_path)), "--repo", "o/m",
                   "--revision", REV, "--out", str(target(tmp_path, "fifo")))
    assert rc == 2 and "a FIFO" in text


def test_the_weights_runtime_refuses_the_same_outputs_in_pods(tmp_path):
    """`python3 -m k3weights lock --out` (the prefetch Job) has the same writer."""
    import subprocess
    import sys

    out = target(tmp_path, "fifo")
    done = subprocess.run([sys.executable, "-m", "k3infra.weights", "lock", str(_tree(tmp_path)),
                           "--repo", "o/m", "--revision", REV, "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "a FIFO, not a regular file" in done.stderr
