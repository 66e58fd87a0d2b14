"""The weights side of a rendered stack: the shipped lock (k3:weights.lockFile) is
checked at program start and reaches the pods unchanged; the prefetch Job, the gating
init container and the StatefulSet's dependency on the Job exist in both storage modes."""
import json

import pytest

from k3infra.config import ConfigError
from k3infra.weights import tree

from conftest import GOOD_REVISION, container, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"


def write_lock(path, revision=GOOD_REVISION, tamper=False):
    files = [tree.FileEntry(f"model-{i:05d}-of-00002.safetensors", 10 + i, f"{i:x}" * 64)
             for i in range(1, 3)]
    lock = tree.make_lock("moonshotai/Kimi-K3", revision, files)
    text = tree.lock_to_json(lock)
    if tamper:                                # a hand-edited digest
        data = json.loads(text)
        data["tree_digest"] = "sha256:" + "ab" * 32
        text = json.dumps(data)
    path.write_text(text)
    return lock


@pytest.mark.parametrize("mode", ["shared", "node-local"])
def test_each_mode_has_the_job_the_gate_and_the_dependency(mode):
    r = render("existing", PIN, f"weights.mode={mode}")
    job = manifest(r, "Job", "kimi-k3-weights-prefetch")
    assert "prefetch.sh" in job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    pod = manifest(r, "StatefulSet")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["weights-gate"]
    assert "gate.sh" in pod["initContainers"][0]["command"][-1]
    by_name = {x["name"]: x for x in r.resources}
    assert by_name["kimi-k3-weights-job"]["urn"] in by_name["kimi-k3-serving-statefulset"]["dependsOn"]
    env = {e["name"]: e.get("value") for e in pod["initContainers"][0]["env"]}
    assert env["K3_WEIGHTS_MODE"] == mode
    assert container(r)["env"][0]["name"] == "PYTORCH_CUDA_ALLOC_CONF"


def test_a_shipped_lock_of_another_tree_is_refused_unless_custom(tmp_path, receipt):
    path = tmp_path / "lock.json"
    lock = write_lock(path)
    with pytest.raises(ConfigError) as info:
        render("existing", PIN, f"weights.lockFile={path}")
    assert str(info.value).startswith("k3:weights.lockFile")
    assert "not the measured tree" in str(info.value) and receipt.model.tree_digest in str(info.value)
    r = render("existing", PIN, f"weights.lockFile={path}", "profile=custom")
    cm = manifest(r, "ConfigMap", "kimi-k3-weights-runtime")
    assert cm["data"]["lock.json"] == path.read_text()           # shipped unchanged
    assert json.loads(cm["data"]["lock.json"])["tree_digest"] == lock.tree_digest
    job_env = {e["name"] for e in manifest(r, "Job", "kimi-k3-weights-prefetch")["spec"][
        "template"]["spec"]["containers"][0]["env"]}
    assert "K3_EXPECT_TREE_DIGEST" not in job_env                 # custom: another tree


def test_a_lock_of_another_revision_is_refused(tmp_path):
    path = tmp_path / "lock.json"
    write_lock(path, revision="1" * 40)
    with pytest.raises(ConfigError, match="must be the same commit"):
        render("existing", PIN, f"weights.lockFile={path}", "profile=custom")


def test_a_hand_edited_lock_is_refused(tmp_path):
    path = tmp_path / "lock.json"
    write_lock(path, tamper=True)
    with pytest.raises(ConfigError, match="valid k3-tree-v1 lock"):
        render("existing", PIN, f"weights.lockFile={path}", "profile=custom")


def test_without_a_lock_the_pods_check_the_receipt_digest(receipt):
    r = render("existing", PIN)
    cm = manifest(r, "ConfigMap", "kimi-k3-weights-runtime")
    assert "lock.json" not in cm["data"]
    for obj in (manifest(r, "Job", "kimi-k3-weights-prefetch"), manifest(r, "StatefulSet")):
        spec = obj["spec"]["template"]["spec"]
        c = (spec.get("initContainers") or spec["containers"])[0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["K3_EXPECT_TREE_DIGEST"] == receipt.model.tree_digest
        assert env["K3_REVISION"] == GOOD_REVISION
