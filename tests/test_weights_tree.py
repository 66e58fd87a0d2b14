"""k3-tree-v1 and the lock file format: the digest follows its documented definition,
the lock round-trips byte for byte, and every malformed lock is refused by name."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from k3infra.weights import tree
from k3infra.weights.tree import FileEntry, LockError

REV = "0123456789abcdef0123456789abcdef01234567"
SHA_A = hashlib.sha256(b"a").hexdigest()
SHA_B = hashlib.sha256(b"bb").hexdigest()


def entries():
    return [FileEntry("z/last.bin", 2, SHA_B), FileEntry("B.json", 1, SHA_A), FileEntry("a.json", 1, SHA_A)]


def test_digest_is_the_documented_byte_string():
    # Spelled out from the docstring / docs/weights.md, independently of the code.
    message = (b"k3-tree-v1\n"
               + b"B.json\x001\x00" + SHA_A.encode() + b"\n"
               + b"a.json\x001\x00" + SHA_A.encode() + b"\n"
               + b"z/last.bin\x002\x00" + SHA_B.encode() + b"\n")
    assert tree.tree_digest(entries()) == "sha256:" + hashlib.sha256(message).hexdigest()


def test_empty_tree_hashes_the_header_alone():
    assert tree.tree_digest([]) == "sha256:" + hashlib.sha256(b"k3-tree-v1\n").hexdigest()


def test_order_is_utf8_bytes_not_locale_or_case():
    lock = tree.make_lock("o/m", REV, [FileEntry("é.json", 1, SHA_A), FileEntry("f.json", 1, SHA_A),
                                       FileEntry("F.json", 1, SHA_A)])
    assert [f.path for f in lock.files] == ["F.json", "f.json", "é.json"]


@pytest.mark.parametrize("change", [
    lambda e: FileEntry(e.path + "x", e.size, e.sha256),
    lambda e: FileEntry(e.path, e.size + 1, e.sha256),
    lambda e: FileEntry(e.path, e.size, SHA_B if e.sha256 == SHA_A else SHA_A),
])
def test_any_change_of_path_size_or_content_changes_the_digest(change):
    base = entries()
    changed = [change(base[0])] + base[1:]
    assert tree.tree_digest(changed) != tree.tree_digest(base)


def test_lock_round_trips_byte_for_byte(tmp_path):
    lock = tree.make_lock("o/m", REV, entries())
    text = tree.lock_to_json(lock)
    path = tmp_path / "l.json"
    path.write_text(text)
    again, sha = tree.load_lock(str(path))
    assert again == lock
    assert tree.lock_to_json(again) == text
    assert sha == hashlib.sha256(text.encode()).hexdigest()
    data = json.loads(text)
    assert list(data) == ["algorithm", "repo", "revision", "tree_digest", "total_bytes", "files"]
    assert data["total_bytes"] == 4 and data["algorithm"] == "k3-tree-v1"


def _lock_dict(**override):
    lock = tree.make_lock("o/m", REV, entries())
    data = json.loads(tree.lock_to_json(lock))
    data.update(override)
    return data


def _files(*rows):
    return [{"path": p, "size": 1, "sha256": SHA_A} for p in rows]


@pytest.mark.parametrize("data, needle", [
    (_lock_dict(revision="main"), "40-hex"),
    (_lock_dict(revision="ABCDEF0123456789ABCDEF0123456789ABCDEF01"), "40-hex"),
    (_lock_dict(algorithm="sha256-tree"), "only 'k3-tree-v1'"),
    (_lock_dict(repo="no-slash"), "<owner>/<name>"),
    (_lock_dict(tree_digest="sha256:" + "0" * 64), "does not match the files"),
    (_lock_dict(total_bytes=5), "add up to 4"),
    (_lock_dict(extra=1), "unknown key"),
    ({k: v for k, v in _lock_dict().items() if k != "files"}, "missing key"),
    (_lock_dict(files=_files("../escape")), "escapes"),
    (_lock_dict(files=_files("/abs")), "relative"),
    (_lock_dict(files=_files("a//b")), "empty"),
    (_lock_dict(files=_files("./a")), "'.'"),
    (_lock_dict(files=_files("a\\b")), "'\\\\'"),
    (_lock_dict(files=_files(".k3-verified.json")), "reserved"),
    (_lock_dict(files=_files(".cache/huggingface/x")), "reserved"),
    (_lock_dict(files=_files("a", "a")), "listed twice"),
    (_lock_dict(files=_files("a", "a/b")), "listed as a file"),
    (_lock_dict(files=[{"path": "a", "size": -1, "sha256": SHA_A}]), "non-negative"),
    (_lock_dict(files=[{"path": "a", "size": 1, "sha256": "XYZ"}]), "64 lowercase hex"),
    (_lock_dict(files=[{"path": "a", "size": 1}]), "exactly path, size, sha256"),
])
def test_malformed_locks_are_refused_by_name(data, needle):
    with pytest.raises(LockError) as err:
        tree.parse_lock(data)
    assert needle in str(err.value)


def test_unsorted_files_are_refused():
    data = _lock_dict()
    data["files"] = list(reversed(data["files"]))
    with pytest.raises(LockError, match="sorted"):
        tree.parse_lock(data)


def test_not_json_is_refused(tmp_path):
    (tmp_path / "l.json").write_text("{nope")
    with pytest.raises(LockError, match="not JSON"):
        tree.load_lock(str(tmp_path / "l.json"))


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "m.json"
    target.write_text("old")
    tree.atomic_write_json(str(target), {"new": 1})
    assert json.loads(target.read_text()) == {"new": 1}
    assert os.listdir(tmp_path) == ["m.json"]


def test_atomic_write_failure_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "m.json"
    target.write_text("old")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tree.os, "replace", broken_replace)
    with pytest.raises(OSError):
        tree.atomic_write(str(target), b"new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["m.json"]


def test_default_workers_is_positive_and_bounded_by_cpus():
    n = tree.default_workers()
    assert 1 <= n <= (os.cpu_count() or 1)


def test_revision_inferred_from_huggingface_local_dir_metadata(tmp_path):
    meta = tmp_path / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "a.json.metadata").write_text(f"{REV}\netag\n1.0\n")
    assert tree.revision_from_hf_metadata(str(tmp_path)) == REV
    (meta / "b.json.metadata").write_text(f"{'f' * 40}\netag\n1.0\n")
    assert tree.revision_from_hf_metadata(str(tmp_path)) is None   # two commits: no guess


@pytest.mark.parametrize("size", [0, 1, 4095, 3 * 65536 + 17])
def test_hash_file_is_sha256_across_map_windows(tmp_path, monkeypatch, size):
    # Windows of one 64 KiB granule: a file spans several, and ends mid-window.
    monkeypatch.setattr(tree, "MAP_WINDOW", 65536)
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    result = tree.hash_file(str(path))
    assert (result.sha256, result.size) == (hashlib.sha256(data).hexdigest(), size)
    assert tree.stamp_of(result.before) == tree.stamp_of(result.after)


def test_hash_file_reads_into_the_buffer_where_mmap_is_refused(tmp_path, monkeypatch):
    import mmap

    def refuse(*args, **kwargs):
        raise OSError(19, "No such device")       # what a filesystem without mmap says

    monkeypatch.setattr(mmap, "mmap", refuse)
    data = os.urandom(3 * tree.READ_SIZE + 5)
    (tmp_path / "f").write_bytes(data)
    result = tree.hash_file(str(tmp_path / "f"), bytearray(tree.READ_SIZE))
    assert (result.sha256, result.size) == (hashlib.sha256(data).hexdigest(), len(data))


def test_hash_file_refuses_a_symlink(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(OSError):
        tree.hash_file(str(tmp_path / "link"))
