"""The weights side of a rendered stack: the shipped lock (k3:weights.lockFile) is
checked at program start and reaches the pods unchanged; the prefetch Job(s), the gate in
the serving container and the StatefulSet's dependency on the Job exist in both storage
modes; every weights container holds the tree to a pinned digest in every profile;
node-local mode uses local PersistentVolumes, so the namespace stays `restricted`."""
import json

import pytest

from k3infra.config import ConfigError
from k3infra.weights import tree

from conftest import GOOD_REVISION, container, manifest, render, runtime_configmap

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


def weights_containers(r):
    """Every container that holds the weights to a digest (K3_TREE in its env)."""
    out = []
    for m in r.manifests():
        spec = m.get("spec", {})
        spec = spec.get("jobTemplate", {}).get("spec", spec)
        pod = spec.get("template", {}).get("spec", {})
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            if any(e["name"] == "K3_TREE" for e in c.get("env", [])):
                out.append((m["kind"], m["metadata"]["name"], c))
    return out


def env_of(c):
    return {e["name"]: e.get("value") for e in c["env"]}


@pytest.mark.parametrize("mode,job", [("shared", "kimi-k3-weights-prefetch"),
                                      ("node-local", "kimi-k3-weights-prefetch-0")])
def test_each_mode_has_the_job_the_gate_and_the_dependency(mode, job):
    r = render("existing", PIN, f"weights.mode={mode}")
    job_m = manifest(r, "Job", job)
    assert "prefetch.sh" in job_m["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    pod = manifest(r, "StatefulSet")["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    vllm = container(r)
    # The gate is the serving container's own entrypoint: it runs on every start of the
    # container, liveness and OOM restarts included, then execs vLLM.
    assert vllm["command"][:2] == ["sh", "-c"] and vllm["command"][-2:] == ["vllm", "serve"]
    assert "gate" in vllm["command"][2] and vllm["command"][2].endswith('exec "$@"\n')
    env = env_of(vllm)
    assert env["K3_GATE_MODE"] == "warm" and env["K3_TREE"] == vllm["args"][0]
    weights = next(m for m in vllm["volumeMounts"] if m["name"] == "weights")
    assert weights["readOnly"] is True
    by_name = {x["name"]: x for x in r.resources}
    job_res = next(x for x in r.resources if x["type"].endswith("batch/v1:Job")
                   and x["name"].startswith("kimi-k3-weights-job"))
    assert job_res["urn"] in by_name["kimi-k3-serving-statefulset"]["dependsOn"]
    assert container(r)["env"][0]["name"] == "PYTORCH_CUDA_ALLOC_CONF"


def test_node_local_uses_local_volumes_and_keeps_the_namespace_restricted():
    r = render("existing", PIN, "weights.mode=node-local", "replicas=2")
    ns = manifest(r, "Namespace", "kimi-k3")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for m in r.manifests():
        assert "hostPath" not in json.dumps(m), f"{m['kind']} {m['metadata']['name']}"
    for i in range(2):
        pvc = manifest(r, "PersistentVolumeClaim", f"weights-kimi-k3-{i}")
        assert pvc["spec"]["storageClassName"] == "k3-local-nvme"
        assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
        job = manifest(r, "Job", f"kimi-k3-weights-prefetch-{i}")["spec"]["template"]["spec"]
        claim = next(v for v in job["volumes"] if v["name"] == "weights")
        assert claim["persistentVolumeClaim"]["claimName"] == f"weights-kimi-k3-{i}"
    sts = manifest(r, "StatefulSet")
    templates = {t["metadata"]["name"]: t for t in sts["spec"]["volumeClaimTemplates"]}
    assert templates["weights"]["spec"]["storageClassName"] == "k3-local-nvme"
    assert "weights" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}


def test_serving_pods_hold_no_hf_token_and_reach_no_hub_in_either_mode(tmp_path):
    for mode in ("shared", "node-local"):
        r = render("existing", PIN, f"weights.mode={mode}", "hfToken=hf_x")
        assert "HF_TOKEN" not in env_of(container(r))
        pol = manifest(r, "NetworkPolicy", "kimi-k3-serving")
        ports = {p["port"] for rule in pol["spec"]["egress"] for p in rule.get("ports", [])}
        assert 443 not in ports, mode
        jobs = [m for m in r.manifests() if m["kind"] == "Job"
                and m["metadata"]["name"].startswith("kimi-k3-weights-prefetch")]
        assert all("HF_TOKEN" in env_of(j["spec"]["template"]["spec"]["containers"][0])
                   for j in jobs)


@pytest.mark.parametrize("gate_mode", ["warm", "stamps"])
def test_render_shows_the_gate_mode(gate_mode):
    from k3infra.config import parse_stack_config
    from k3infra.plan import resolve_plan
    from k3infra.summary import summary_rows

    r = render("existing", PIN, f"weights.gateMode={gate_mode}")
    assert env_of(container(r))["K3_GATE_MODE"] == gate_mode
    from k3infra.receipt import load_receipt

    cfg = parse_stack_config(r.raw_config, tuple(r.secret_keys), receipt=load_receipt())
    rows = dict(summary_rows(cfg, r, resolve_plan(load_receipt(), cfg)))
    assert rows["weights gate"].startswith(f"{gate_mode}: full read-and-hash of 1561.0 GB")


def test_runtime_digests_in_the_pod_spec_are_those_of_the_configmap():
    import hashlib

    r = render("existing", PIN)
    cm = runtime_configmap(r)
    sts = manifest(r, "StatefulSet")
    vol = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "weights-runtime")
    pins = json.loads(env_of(container(r))["K3_RUNTIME_SHA256"])
    assert pins == {item["path"]: hashlib.sha256(cm["data"][item["key"]].encode()).hexdigest()
                    for item in vol["configMap"]["items"]}
    assert "K3_RUNTIME_BOOTSTRAP" not in json.dumps(cm)         # not editable with the ConfigMap
    assert cm["immutable"] is True
    tag = hashlib.sha256(env_of(container(r))["K3_RUNTIME_SHA256"].encode()).hexdigest()[:8]
    assert cm["metadata"]["name"] == f"kimi-k3-weights-runtime-{tag}"


def test_audit_cronjob_reads_read_only_and_can_be_disabled():
    r = render("existing", PIN)
    cron = manifest(r, "CronJob", "kimi-k3-audit")
    assert cron["spec"]["schedule"] == "30 4 * * 0"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "gate" in c["command"][2] and env_of(c)["K3_GATE_MODE"] == "warm"
    assert next(m for m in c["volumeMounts"] if m["name"] == "weights")["readOnly"] is True
    r = render("existing", PIN, "weights.auditSchedule=disabled")
    assert not [m for m in r.manifests() if m["kind"] == "CronJob"]


def test_a_shipped_lock_of_another_tree_is_refused_unless_custom(tmp_path, receipt):
    path = tmp_path / "lock.json"
    lock = write_lock(path)
    with pytest.raises(ConfigError) as info:
        render("existing", PIN, f"weights.lockFile={path}")
    assert str(info.value).startswith("k3:weights.lockFile")
    assert "not the measured tree" in str(info.value) and receipt.model.tree_digest in str(info.value)
    r = render("existing", PIN, f"weights.lockFile={path}", "profile=custom")
    cm = runtime_configmap(r)
    assert cm["data"]["lock.json"] == path.read_text()           # shipped unchanged
    assert json.loads(cm["data"]["lock.json"])["tree_digest"] == lock.tree_digest
    # custom serves another tree, but still the one the stack pins: its own lock's.
    found = weights_containers(r)
    assert {k for k, _n, _c in found} == {"Job", "StatefulSet", "CronJob"}
    for _kind, _name, c in found:
        assert env_of(c)["K3_EXPECT_TREE_DIGEST"] == lock.tree_digest


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
    cm = runtime_configmap(r)
    assert "lock.json" not in cm["data"]
    for profile in ("measured", "custom"):
        r = render("existing", PIN, f"profile={profile}")
        found = weights_containers(r)
        assert {k for k, _n, _c in found} == {"Job", "StatefulSet", "CronJob"}
        for _kind, _name, c in found:
            env = env_of(c)
            assert env["K3_EXPECT_TREE_DIGEST"] == receipt.model.tree_digest
            assert env["K3_REVISION"] == GOOD_REVISION


def test_the_gate_env_is_exactly_what_the_serve_flags_policy_lets_through():
    from k3infra.pod_env import PRE_ENGINE_ENV_NAMES

    names = {e["name"] for e in container(render("existing", PIN))["env"]}
    # The gate's inputs and the start script's engine image (k3infra/serving/start.py).
    assert {n for n in names if n.startswith("K3_")} == set(PRE_ENGINE_ENV_NAMES)


def test_a_hub_mirror_reaches_the_prefetch_only():
    """k3:weights.hubEndpoint is the prefetch's HF_ENDPOINT; no serving pod gets it."""
    r = render("existing", PIN, "weights.hubEndpoint=http://hub.internal.example:8080/")
    job = manifest(r, "Job", "kimi-k3-weights-prefetch")
    assert env_of(job["spec"]["template"]["spec"]["containers"][0])["HF_ENDPOINT"] == \
        "http://hub.internal.example:8080"
    assert "HF_ENDPOINT" not in env_of(container(r))
    assert "HF_ENDPOINT" not in env_of(
        manifest(render("existing", PIN), "Job", "kimi-k3-weights-prefetch")
        ["spec"]["template"]["spec"]["containers"][0])


def test_weights_pods_are_sized_by_stack_keys_for_a_small_node():
    """Issue 27: the prefetch Job (16/32 CPU, 32/64 Gi), the gate and audit (8/32 CPU,
    8/16 Gi) and 32 hashing workers fit no 2-CPU node; each is a key, these the defaults."""
    pin = f"weightsRevision={GOOD_REVISION}"
    r = render("existing", pin)
    by = {(kind, name, c["name"]): c for kind, name, c in weights_containers(r)}
    prefetch = next(c for (k, _, n), c in by.items() if k == "Job" and n == "prefetch")
    assert prefetch["resources"] == {"requests": {"cpu": "16", "memory": "32Gi", "ephemeral-storage": "1Gi"},
                                     "limits": {"cpu": "32", "memory": "64Gi", "ephemeral-storage": "12Gi"}}
    audit = next(c for (k, _, n), c in by.items() if k == "CronJob")
    assert audit["resources"] == {"requests": {"cpu": "8", "memory": "8Gi", "ephemeral-storage": "256Mi"},
                                  "limits": {"cpu": "32", "memory": "16Gi", "ephemeral-storage": "1Gi"}}
    assert {env_of(c)["K3_HASH_WORKERS"] for c in by.values()} == {"32"}
    small = render("existing", pin, "weights.prefetchResources.cpu=0.5",
                   "weights.prefetchResources.cpuLimit=2", "weights.prefetchResources.memoryGi=1",
                   "weights.prefetchResources.memoryLimitGi=2", "weights.gateResources.cpu=0.25",
                   "weights.gateResources.cpuLimit=1", "weights.gateResources.memoryGi=0.5",
                   "weights.gateResources.memoryLimitGi=1", "weights.hashWorkers=2")
    by = {(kind, name, c["name"]): c for kind, name, c in weights_containers(small)}
    prefetch = next(c for (k, _, n), c in by.items() if k == "Job" and n == "prefetch")
    assert prefetch["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"},
                                     "limits": {"cpu": "2", "memory": "2Gi", "ephemeral-storage": "12Gi"}}
    audit = next(c for (k, _, n), c in by.items() if k == "CronJob")
    assert audit["resources"] == {"requests": {"cpu": "250m", "memory": "512Mi", "ephemeral-storage": "256Mi"},
                                  "limits": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"}}
    assert {env_of(c)["K3_HASH_WORKERS"] for c in by.values()} == {"2"}


@pytest.mark.parametrize("assignment,accepted", [
    ("weights.hashWorkers=0", "greater than or equal to 1"),
    ("weights.prefetchResources.memoryGi=128", "memoryGi 128 is above memoryLimitGi 64"),
    ("weights.gateResources.cpu=0.0005", "greater than or equal to 0.01"),
    ("weights.gateResources.cpu=0.0125", "cpu 0.0125 is not a whole number of millicores"),
])
def test_a_weights_size_that_cannot_be_scheduled_is_refused(assignment, accepted):
    with pytest.raises(ConfigError) as err:
        render("existing", f"weightsRevision={GOOD_REVISION}", assignment)
    assert err.value.key.startswith("k3:" + assignment.split("=")[0].rsplit(".", 1)[0])
    assert accepted in str(err.value)
