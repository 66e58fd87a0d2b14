"""The verifier: exact match or every offending path named; no stamp on the volume is ever
trusted (the forged-stamp attack of issue 21 is refused); a caller's own stamps skip only
unchanged files, and any change (even with the mtime restored) is re-hashed."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from k3infra.weights import tree, verify
from k3infra.weights.tree import LockError

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def shard_tree(tmp_path):
    """A small tree (shards, nested files) and its lock from lock_from_dir."""
    root = tmp_path / "tree"
    (root / "original").mkdir(parents=True)
    for i in range(6):
        (root / f"model-{i:05d}.safetensors").write_bytes(os.urandom(200_000 + 1000 * i))
    (root / "config.json").write_text('{"a": 1}\n')
    (root / "original" / "params.json").write_text("{}\n")
    lock = verify.lock_from_dir(str(root), "o/m", REV, workers=2)
    return root, lock


@pytest.fixture
def hash_calls(monkeypatch):
    """Paths actually opened and read by the verifier."""
    calls: list[str] = []
    real = tree.hash_file

    def counting(path, buf=None, limit=None):
        calls.append(path)
        return real(path, buf, limit)

    monkeypatch.setattr(tree, "hash_file", counting)
    return calls


def problems(report):
    return {p.path: p.message for p in report.problems}


def test_exact_tree_verifies(shard_tree):
    root, lock = shard_tree
    report = verify.verify_tree(str(root), lock, workers=2)
    assert report.ok, report.problems
    assert report.hashed_files == len(lock.files) == 8
    assert report.hashed_bytes == lock.total_bytes


def test_lock_from_dir_lists_every_file_with_its_hash(shard_tree):
    root, lock = shard_tree
    assert [f.path for f in lock.files] == sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    import hashlib
    for f in lock.files:
        data = (root / f.path).read_bytes()
        assert (f.size, f.sha256) == (len(data), hashlib.sha256(data).hexdigest())


def test_corrupt_byte_is_named(shard_tree):
    root, lock = shard_tree
    shard = root / "model-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[12345] ^= 0x01
    shard.write_bytes(bytes(data))
    report = verify.verify_tree(str(root), lock)
    assert list(problems(report)) == ["model-00002.safetensors"]
    assert problems(report)["model-00002.safetensors"].startswith("wrong hash")


def test_truncated_grown_missing_extra_symlink_special_all_named_at_once(shard_tree, tmp_path):
    root, lock = shard_tree
    with open(root / "model-00000.safetensors", "r+b") as fh:
        fh.truncate(100)
    with open(root / "model-00001.safetensors", "ab") as fh:
        fh.write(b"x")
    (root / "model-00003.safetensors").unlink()
    (root / "model-00009.safetensors").write_bytes(b"not in the lock")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"elsewhere")
    (root / "original" / "escape.bin").symlink_to(outside)
    (root / "inside.json").symlink_to("config.json")
    os.mkfifo(root / "pipe")
    report = verify.verify_tree(str(root), lock)
    found = problems(report)
    assert found["model-00000.safetensors"].startswith("truncated: 100 of")
    assert found["model-00001.safetensors"].startswith("grown:")
    assert found["model-00003.safetensors"] == "missing"
    assert found["model-00009.safetensors"].startswith("extra file")
    assert found["original/escape.bin"].startswith("symlink escaping the tree")
    assert found["inside.json"].startswith("symlink (-> config.json)")
    assert found["pipe"].startswith("a FIFO")
    assert len(found) == 7


def test_symlinked_shard_in_place_of_a_locked_file_is_refused(shard_tree, tmp_path):
    root, lock = shard_tree
    real = tmp_path / "real.bin"
    os.replace(root / "model-00004.safetensors", real)
    (root / "model-00004.safetensors").symlink_to(real)      # same bytes, outside the tree
    found = problems(verify.verify_tree(str(root), lock))
    assert list(found) == ["model-00004.safetensors"]
    assert "escaping the tree" in found["model-00004.safetensors"]


def test_symlinked_directory_escaping_the_tree_is_refused(shard_tree, tmp_path):
    root, lock = shard_tree
    elsewhere = tmp_path / "elsewhere"
    os.replace(root / "original", elsewhere)
    (root / "original").symlink_to(elsewhere, target_is_directory=True)
    found = problems(verify.verify_tree(str(root), lock))
    assert "escaping the tree" in found["original"]
    assert found["original/params.json"] == "missing"    # not followed through the link


def forge_stamp_file(root, lock):
    """What an attacker with write access to the volume writes: the stamp file older
    versions trusted, with every file's current stamp and the lock's digests."""
    files = {e.path: [*tree.stamp_of(os.lstat(root / e.path)), e.sha256] for e in lock.files}
    (root / tree.STATE_NAME).write_text(json.dumps({"format": "k3-verify-state/1",
                                                    "files": files}))


def test_stamps_on_the_volume_are_never_read(shard_tree, hash_calls):
    root, lock = shard_tree
    forge_stamp_file(root, lock)
    report = verify.verify_tree(str(root), lock)
    assert report.ok and report.stamped_files == 0
    assert len(hash_calls) == len(lock.files)


def test_forged_stamp_attack_is_refused_by_verify_require_marker(shard_tree, tmp_path):
    """Issue 21, reproduced: a verified tree with its marker; rewrite a shard, then write
    its new stamp. `verify --require-marker` used to pass on the forged stamp."""
    root, lock = shard_tree
    lock_file = tmp_path / "lock.json"
    lock_file.write_text(tree.lock_to_json(lock))
    verify.write_marker(str(root), lock, "0" * 64)
    assert run_runtime("verify", str(root), "--lock", str(lock_file), "--require-marker").returncode == 0
    shard = root / "model-00002.safetensors"
    shard.write_bytes(os.urandom(shard.stat().st_size))     # same size, other bytes
    forge_stamp_file(root, lock)
    res = run_runtime("verify", str(root), "--lock", str(lock_file), "--require-marker")
    assert res.returncode == 1
    assert "model-00002.safetensors: wrong hash" in res.stderr


def test_verify_writes_nothing_in_the_tree(shard_tree):
    root, lock = shard_tree
    before = sorted(p.name for p in root.iterdir())
    assert verify.verify_tree(str(root), lock).ok
    assert sorted(p.name for p in root.iterdir()) == before


def test_callers_own_stamps_skip_only_unchanged_files(shard_tree, hash_calls):
    root, lock = shard_tree
    first = verify.verify_tree(str(root), lock)
    assert first.ok and set(first.good) == set(lock.by_path)
    hash_calls.clear()
    report = verify.verify_tree(str(root), lock, stamps=first.good)
    assert report.ok and hash_calls == []
    assert report.stamped_files == len(lock.files) and report.hashed_files == 0
    os.utime(root / "config.json")
    report = verify.verify_tree(str(root), lock, stamps=first.good)
    assert report.ok
    assert [os.path.relpath(p, root) for p in hash_calls] == ["config.json"]


def test_rewrite_with_restored_mtime_is_caught_by_ctime(shard_tree):
    root, lock = shard_tree
    first = verify.verify_tree(str(root), lock)
    assert first.ok
    shard = root / "model-00005.safetensors"
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    with open(shard, "r+b") as fh:        # same inode, same size
        fh.write(bytes(data[:1]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard.stat().st_mtime_ns == st.st_mtime_ns
    found = problems(verify.verify_tree(str(root), lock, stamps=first.good))
    assert list(found) == ["model-00005.safetensors"]
    assert found["model-00005.safetensors"].startswith("wrong hash")


def test_stamp_for_another_hash_is_not_trusted(shard_tree, hash_calls):
    root, lock = shard_tree
    good = dict(verify.verify_tree(str(root), lock).good)
    good["config.json"] = (*good["config.json"][:4], "0" * 64)
    hash_calls.clear()
    assert verify.verify_tree(str(root), lock, stamps=good).ok
    assert [os.path.relpath(p, root) for p in hash_calls] == ["config.json"]


def test_marker_and_state_are_not_extra_files(shard_tree):
    root, lock = shard_tree
    verify.write_marker(str(root), lock, "0" * 64)
    (root / f"{tree.MARKER_NAME}.123.abcd.tmp").write_text("{")   # a killed atomic write
    assert verify.verify_tree(str(root), lock).ok
    assert verify.marker_problem(str(root), lock) is None


def test_huggingface_local_dir_scratch_is_not_part_of_the_tree(shard_tree):
    root, lock = shard_tree
    scratch = root / ".cache" / "huggingface" / "download"
    scratch.mkdir(parents=True)
    (scratch / "config.json.metadata").write_text(f"{REV}\netag\n1\n")
    assert verify.verify_tree(str(root), lock).ok
    (root / ".cache" / "other.bin").write_text("x")          # only huggingface/ is scratch
    assert list(problems(verify.verify_tree(str(root), lock))) == [".cache/other.bin"]


def test_marker_must_name_the_same_digest_and_revision(shard_tree):
    root, lock = shard_tree
    assert "no valid marker" in verify.marker_problem(str(root), lock)
    other = tree.make_lock("o/m", "f" * 40, lock.files)
    verify.write_marker(str(root), other, "0" * 64)
    assert "revision" in verify.marker_problem(str(root), lock)
    marker = json.loads((root / tree.MARKER_NAME).read_text())
    assert set(marker) >= {"tree_digest", "lock_sha256", "repo", "revision", "files", "bytes",
                           "verified_at"}


def test_lock_from_dir_refuses_symlinks(shard_tree):
    root, _lock = shard_tree
    (root / "link").symlink_to("config.json")
    with pytest.raises(LockError, match="link: symlink"):
        verify.lock_from_dir(str(root), "o/m", REV)


def test_many_workers_agree_with_one(shard_tree):
    root, lock = shard_tree
    one = verify.lock_from_dir(str(root), "o/m", REV, workers=1)
    assert one == verify.lock_from_dir(str(root), "o/m", REV, workers=8) == lock


# ---- the runtime command line ---------------------------------------------------------

def run_runtime(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "k3infra.weights", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_runtime_cli_names_every_offending_path_and_exits_1(shard_tree, tmp_path):
    root, lock = shard_tree
    lock_file = tmp_path / "lock.json"
    lock_file.write_text(tree.lock_to_json(lock))
    ok = run_runtime("verify", str(root), "--lock", str(lock_file), "--workers", "2")
    assert ok.returncode == 0, ok.stderr
    assert "verify OK: 8 files" in ok.stdout
    (root / "config.json").unlink()
    (root / "stray.txt").write_text("x")
    bad = run_runtime("verify", str(root), "--lock", str(lock_file))
    assert bad.returncode == 1
    assert "config.json: missing" in bad.stderr and "stray.txt: extra file" in bad.stderr


def test_runtime_cli_require_marker_fails_fast_without_reading(shard_tree, tmp_path):
    root, lock = shard_tree
    lock_file = tmp_path / "lock.json"
    lock_file.write_text(tree.lock_to_json(lock))
    res = run_runtime("verify", str(root), "--lock", str(lock_file), "--require-marker")
    assert res.returncode == 1 and "not a verified tree" in res.stderr
    assert "hashed" not in res.stdout                      # failed before reading a shard
    verify.write_marker(str(root), lock, "0" * 64)
    res = run_runtime("verify", str(root), "--lock", str(lock_file), "--require-marker")
    assert res.returncode == 0, res.stderr


def test_runtime_cli_lock_then_bad_lock_is_exit_2(shard_tree, tmp_path):
    root, lock = shard_tree
    out = tmp_path / "made.json"
    res = run_runtime("lock", str(root), "--repo", "o/m", "--revision", REV, "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert tree.load_lock(str(out))[0] == lock
    res = run_runtime("lock", str(root), "--repo", "o/m", "--revision", "main", "--out", str(out))
    assert res.returncode == 2 and "40-hex" in res.stderr
    broken = tmp_path / "broken.json"
    broken.write_text(tree.lock_to_json(lock).replace(lock.tree_digest, "sha256:" + "1" * 64))
    res = run_runtime("verify", str(root), "--lock", str(broken))
    assert res.returncode == 2 and "does not match the files" in res.stderr
