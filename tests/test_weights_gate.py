"""The serving gate (k3weights.gate) against an attacker who can write the weights volume:
forged stamps, a forged marker, a replaced lock + tree + marker; the lock is read once;
stamps mode trusts only the pod-private record it wrote itself."""
from __future__ import annotations

import json
import os

import pytest

from k3infra.weights import gate, tree, verify

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def served(tmp_path):
    """A verified tree as the prefetch leaves it: files, lock beside it, marker."""
    root = tmp_path / "weights" / "o--m" / REV
    root.mkdir(parents=True)
    for i in range(4):
        (root / f"model-{i:05d}.safetensors").write_bytes(os.urandom(100_000 + i))
    (root / "config.json").write_text('{"a": 1}\n')
    lock = verify.lock_from_dir(str(root), "o/m", REV, workers=2)
    lock_file = tmp_path / "weights" / "o--m" / f"{REV}.lock.json"
    lock_file.write_text(tree.lock_to_json(lock))
    verify.write_marker(str(root), lock, "0" * 64)
    state = tmp_path / "pod-private"
    state.mkdir()
    return root, lock, lock_file, state


def run(root, lock_file, digest, **kw):
    return gate.run_gate(str(root), str(lock_file), expect_digest=digest, repo="o/m",
                         revision=REV, workers=2, emit=None, **kw)


def tamper(path):
    path.write_bytes(os.urandom(path.stat().st_size))        # same size, other bytes


def test_verified_tree_passes_in_both_modes(served):
    root, lock, lock_file, state = served
    assert run(root, lock_file, lock.tree_digest).ok
    assert run(root, lock_file, lock.tree_digest, mode="stamps", state_dir=str(state)).ok


def test_forged_stamps_beside_the_tree_are_ignored(served):
    root, lock, lock_file, _state = served
    shard = root / "model-00001.safetensors"
    tamper(shard)
    (root / tree.STATE_NAME).write_text(json.dumps({"format": "k3-verify-state/1", "files": {
        e.path: [*tree.stamp_of(os.lstat(root / e.path)), e.sha256] for e in lock.files}}))
    report = run(root, lock_file, lock.tree_digest)
    assert [p.path for p in report.problems] == [shard.name]


def test_forged_marker_does_not_make_a_tampered_tree_pass(served):
    root, lock, lock_file, _state = served
    tamper(root / "config.json")
    verify.write_marker(str(root), lock, "f" * 64)            # a fresh marker, as a writer can
    assert verify.marker_problem(str(root), lock) is None
    report = run(root, lock_file, lock.tree_digest)
    assert not report.ok and report.problems[0].path == "config.json"


def test_replaced_lock_tree_and_marker_are_refused(served):
    """The attacker swaps in their own tree, a valid lock of it, and a marker naming it:
    everything on the volume agrees, but not with the digest the pod spec pins."""
    root, lock, lock_file, _state = served
    pinned = lock.tree_digest
    tamper(root / "model-00002.safetensors")
    theirs = verify.lock_from_dir(str(root), "o/m", REV, workers=2)
    lock_file.write_text(tree.lock_to_json(theirs))
    verify.write_marker(str(root), theirs, "0" * 64)
    assert verify.verify_tree(str(root), theirs).ok            # self-consistent forgery
    with pytest.raises(gate.GateRefused, match="not the pinned tree"):
        run(root, lock_file, pinned)


def test_a_lock_of_another_revision_or_repo_is_refused(served, tmp_path):
    root, lock, _lock_file, _state = served
    other = tmp_path / "other.json"
    other.write_text(tree.lock_to_json(tree.make_lock("o/m", "f" * 40, lock.files)))
    with pytest.raises(gate.GateRefused, match="pins o/m@f"):
        run(root, other, tree.make_lock("o/m", "f" * 40, lock.files).tree_digest)


def test_a_hand_edited_lock_digest_is_refused(served):
    root, lock, lock_file, _state = served
    data = json.loads(lock_file.read_text())
    data["files"][0]["sha256"] = "0" * 64                      # the digest no longer fits
    lock_file.write_text(json.dumps(data))
    with pytest.raises(gate.GateRefused, match="malformed"):
        run(root, lock_file, lock.tree_digest)


def test_the_lock_is_read_exactly_once(served, monkeypatch):
    root, lock, lock_file, _state = served
    opened: list[str] = []
    real_open = os.open

    def counting(file, *a, **kw):
        if str(file) == str(lock_file):
            opened.append(str(file))
        return real_open(file, *a, **kw)

    monkeypatch.setattr(os, "open", counting)
    assert run(root, lock_file, lock.tree_digest).ok
    assert opened == [str(lock_file)]


def test_stamps_mode_rehashes_nothing_on_a_restart_and_catches_a_rewrite(served, monkeypatch):
    root, lock, lock_file, state = served
    first = run(root, lock_file, lock.tree_digest, mode="stamps", state_dir=str(state))
    assert first.ok and first.hashed_files == len(lock.files)
    again = run(root, lock_file, lock.tree_digest, mode="stamps", state_dir=str(state))
    assert again.ok and again.hashed_files == 0 and again.stamped_files == len(lock.files)
    tamper(root / "model-00003.safetensors")
    bad = run(root, lock_file, lock.tree_digest, mode="stamps", state_dir=str(state))
    assert [p.path for p in bad.problems] == ["model-00003.safetensors"]
    assert not (state / gate.RECORD_NAME).exists()             # a failed gate keeps no record


def test_stamps_mode_refuses_a_record_inside_the_tree(served):
    root, lock, lock_file, _state = served
    (root / "original").mkdir()
    with pytest.raises(gate.GateRefused, match="pod-private"):
        run(root, lock_file, lock.tree_digest, mode="stamps", state_dir=str(root / "original"))


def test_stamps_record_of_another_tree_is_not_used(served):
    root, lock, lock_file, state = served
    assert run(root, lock_file, lock.tree_digest, mode="stamps", state_dir=str(state)).ok
    record = json.loads((state / gate.RECORD_NAME).read_text())
    record["tree_digest"] = "sha256:" + "0" * 64
    (state / gate.RECORD_NAME).write_text(json.dumps(record))
    again = run(root, lock_file, lock.tree_digest, mode="stamps", state_dir=str(state))
    assert again.ok and again.hashed_files == len(lock.files)
