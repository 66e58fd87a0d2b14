"""The benchmark Job through the real stack program under mocks: off by default, ordered
after the serving StatefulSet, the receipt's grid, the API key from its Secret, every
manifest valid against real Kubernetes schemas."""
import kubernetes_validate
import pytest

from k3infra.bench import manifests as b
from k3infra.bench import workload
from k3infra.cli import main

from conftest import GOOD_REVISION, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
ON = "benchmark.enabled=true"


def _arg(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_off_by_default():
    r = render("existing", PIN)
    assert not r.by_type("k3infra:index:Benchmark")
    assert not [m for m in r.manifests() if m["kind"] == "Job"
                and m["metadata"]["name"] == b.BenchmarkNames("kimi-k3").job]


def test_job_runs_after_the_serving_statefulset():
    r = render("existing", PIN, ON)
    by_name = {res["name"]: res for res in r.resources}
    comp = r.by_type("k3infra:index:Benchmark")
    assert len(comp) == 1 and comp[0]["parent"] == by_name["kimi-k3"]["urn"]
    job = by_name["kimi-k3-benchmark-job"]
    assert job["parent"] == comp[0]["urn"]
    assert by_name["kimi-k3-serving-statefulset"]["urn"] in job["dependsOn"]
    assert by_name["kimi-k3-benchmark-runtime"]["urn"] in job["dependsOn"]
    assert by_name["kimi-k3-benchmark-results"]["urn"] in job["dependsOn"]
    assert job["customTimeouts"]["create"] == f"{(90 * 60 + 600) // 60}m"
    # registration order too: the Job comes after the StatefulSet in the render
    kinds = [(m["kind"], m["metadata"]["name"]) for m in r.manifests()]
    assert kinds.index(("StatefulSet", "kimi-k3")) < kinds.index(("Job", "kimi-k3-bench"))


def test_job_carries_the_receipt_grid_and_the_serving_endpoint(receipt):
    r = render("existing", PIN, ON)
    job = manifest(r, "Job", "kimi-k3-bench")
    c = job["spec"]["template"]["spec"]["containers"][0]
    cmd = c["command"]
    assert cmd[:2] == ["python3", f"{b.RUNTIME_DIR}/pod_runner.py"]
    w = receipt.workload_a
    assert _arg(cmd, "--concurrencies") == ",".join(str(x) for x in w.concurrencies)
    assert _arg(cmd, "--warmups") == str(w.warmup_requests)
    assert _arg(cmd, "--measured") == str(w.measured_requests)
    assert _arg(cmd, "--min-tokens") == str(w.prompt_tokens_min)
    assert _arg(cmd, "--max-tokens") == str(w.prompt_tokens_max)
    assert _arg(cmd, "--output-tokens") == str(w.output_tokens_max)
    assert _arg(cmd, "--block-size") == next(a.value for a in receipt.serve.engine_args
                                             if a.flag == "--block-size")
    assert "--ignore-eos" in cmd
    base_url = _arg(cmd, "--base-url")
    assert base_url == r.outputs["endpoint"] and not base_url.rstrip("/").endswith("/v1")
    sts = manifest(r, "StatefulSet")
    vllm = sts["spec"]["template"]["spec"]["containers"][0]
    assert _arg(cmd, "--model-dir") == vllm["args"][0]          # the served model's dir
    assert _arg(cmd, "--served-model-name") == r.outputs["servedModelName"]
    assert _arg(cmd, "--receipt") == receipt.id
    assert c["image"] == vllm["image"]                            # the engine image


def test_with_two_replicas_the_job_measures_one_replica_alone():
    """A receipt's figures are one replica's: through the Service two replicas share the
    grid's concurrency (the node tier measured c=2 p50 421 ms through two, 880 ms on one).
    The Job measures the replica the rollout gate judges, by its own DNS name."""
    r = render("existing", PIN, ON, "replicas=2")
    cmd = manifest(r, "Job", "kimi-k3-bench")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert _arg(cmd, "--base-url") == "http://kimi-k3-1.kimi-k3-headless.kimi-k3.svc.cluster.local:8000"
    assert r.outputs["endpoint"] == "http://kimi-k3.kimi-k3.svc.cluster.local:8000"


def test_api_key_only_through_the_secret():
    r = render("existing", PIN, ON, "apiKey=sk-bench-DO-NOT-LEAK")
    job = manifest(r, "Job", "kimi-k3-bench")
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OPENAI_API_KEY"] == {"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": {
        "name": "kimi-k3-api-key", "key": "api-key"}}}
    assert "sk-bench-DO-NOT-LEAK" not in repr(r.manifests())


def test_volumes_placement_and_security():
    r = render("existing", PIN, ON)
    job = manifest(r, "Job", "kimi-k3-bench")
    spec = job["spec"]["template"]["spec"]
    c = spec["containers"][0]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    weights = next(m for m in mounts.values() if m["name"] == "weights")
    assert weights["readOnly"] is True
    assert mounts[b.RESULTS_DIR]["name"] == "results"
    assert mounts[b.RUNTIME_DIR]["readOnly"] is True
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["results"]["persistentVolumeClaim"]["claimName"] == "kimi-k3-bench-results"
    assert vols["weights"]["persistentVolumeClaim"]["claimName"] == "kimi-k3-weights"
    assert "nvidia.com/gpu" not in c["resources"]["requests"]     # client only, no GPU
    sts_spec = manifest(r, "StatefulSet")["spec"]["template"]["spec"]
    assert spec["affinity"]["nodeAffinity"] == sts_spec["affinity"]["nodeAffinity"]
    assert spec["tolerations"] == sts_spec["tolerations"]
    assert job["spec"]["backoffLimit"] == 0 and spec["restartPolicy"] == "Never"
    assert job["spec"]["activeDeadlineSeconds"] == 90 * 60
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "benchmark"


def test_the_benchmark_runs_gated_beside_a_serving_pod_without_remote_code():
    """Issue 21: the benchmark read the tokenizer from an unverified tree, could land on
    any GPU node and trusted remote code. Now the serving pods' weights gate runs first,
    the pod sits beside a serving pod, and nothing passes --trust-remote-code."""
    r = render("existing", PIN, ON)
    spec = manifest(r, "Job", "kimi-k3-bench")["spec"]["template"]["spec"]
    sts = manifest(r, "StatefulSet")["spec"]["template"]
    (gate,) = spec["initContainers"]
    assert gate["name"] == "weights-gate" and " gate " in gate["command"][2]
    vllm = next(c for c in sts["spec"]["containers"] if c["name"] == "vllm")
    pinned = {e["name"]: e.get("value") for e in vllm["env"]}
    env = {e["name"]: e.get("value") for e in gate["env"]}
    for key in ("K3_TREE", "K3_EXPECT_TREE_DIGEST", "K3_REVISION", "K3_RUNTIME_SHA256"):
        assert env[key] == pinned[key], key
    assert env["K3_GATE_MODE"] == "warm"
    assert next(m for m in gate["volumeMounts"] if m["name"] == "weights")["readOnly"] is True
    (beside,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert beside["topologyKey"] == "kubernetes.io/hostname"
    assert all(sts["metadata"]["labels"][k] == v
               for k, v in beside["labelSelector"]["matchLabels"].items())
    command = " ".join(spec["containers"][0]["command"])
    assert "trust-remote-code" not in command and "trust_remote_code" not in command
    runner = (b.__file__.rsplit("/", 1)[0] + "/pod_runner.py")
    text = open(runner).read()
    assert "trust_remote_code=False" in text and '"--trust-remote-code"' not in text


def test_node_local_weights_are_read_from_replica_0s_local_volume():
    r = render("existing", PIN, ON, "weights.mode=node-local")
    spec = manifest(r, "Job", "kimi-k3-bench")["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["weights"]["persistentVolumeClaim"] == {"claimName": "weights-kimi-k3-0",
                                                        "readOnly": True}


def test_config_changes_the_grid():
    r = render("existing", PIN, ON, "benchmark.concurrencies=[1,8,32]", "benchmark.runs=1",
               "benchmark.measuredRequests=32", "benchmark.ignoreEos=false",
               "benchmark.resultsSizeGi=5", "benchmark.resultsStorageClass=fast")
    cmd = manifest(r, "Job", "kimi-k3-bench")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert _arg(cmd, "--concurrencies") == "1,8,32"
    assert _arg(cmd, "--runs") == "1" and _arg(cmd, "--measured") == "32"
    assert "--ignore-eos" not in cmd
    pvc = manifest(r, "PersistentVolumeClaim", "kimi-k3-bench-results")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert pvc["spec"]["storageClassName"] == "fast"


@pytest.mark.parametrize("override, key", [
    ("benchmark.concurrencies=[0]", "k3:benchmark.concurrencies"),
    ("benchmark.concurrencies=[8,8]", "k3:benchmark.concurrencies"),
    ("benchmark.runs=0", "k3:benchmark.runs"),
    ("benchmark.tolerancePct=-1", "k3:benchmark.tolerancePct"),
    ("benchmark.timeoutMinutes=1", "k3:benchmark.timeoutMinutes"),
    ("benchmark.warmups=2", "k3:benchmark.warmups"),
])
def test_bad_benchmark_config_names_the_key(tmp_path, capsys, override, key):
    rc = main(["render", "--stack", "existing", "--config", PIN, "--config", ON,
               "--config", override, "--out", str(tmp_path)])
    assert rc != 0
    assert key in capsys.readouterr().err


def test_runtime_configmap_ships_the_pod_files():
    r = render("existing", PIN, ON)
    cm = manifest(r, "ConfigMap", "kimi-k3-bench-runtime")
    from importlib import resources
    pkg = resources.files("k3infra.bench")
    assert set(cm["data"]) == {*b.POD_FILES, *b.SHARED_FILES}
    for name in b.POD_FILES:
        assert cm["data"][name] == pkg.joinpath(name).read_text()
    assert "import pulumi" not in cm["data"]["workload.py"]        # stdlib-only in pods
    assert f'WORKLOAD_ID = "{workload.WORKLOAD_ID}"' in cm["data"]["workload.py"]


def test_reader_pod_mounts_results_read_only():
    r = render("existing", PIN, ON)
    job = manifest(r, "Job", "kimi-k3-bench")
    pod = b.reader_pod("kimi-k3-bench-reader-x", "k3", "kimi-k3-bench-results",
                       job["spec"]["template"]["spec"]["containers"][0]["image"],
                       job["spec"]["template"]["spec"])
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] is True
    assert pod["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] is True
    assert pod["spec"]["affinity"] == job["spec"]["template"]["spec"]["affinity"]
    for version in ("1.33", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(pod, version, strict=True)


def test_benchmark_manifests_pass_strict_schema_validation():
    r = render("existing", PIN, ON)
    objs = [manifest(r, "Job", "kimi-k3-bench"),
            manifest(r, "PersistentVolumeClaim", "kimi-k3-bench-results"),
            manifest(r, "ConfigMap", "kimi-k3-bench-runtime")]
    for version in ("1.33", kubernetes_validate.latest_version()):
        for obj in objs:
            kubernetes_validate.validate(obj, version, strict=True)


def test_checkov_finds_nothing_on_the_benchmark_objects(tmp_path):
    """The scanner CI runs over shipped stacks (benchmark off) also passes with it on;
    the two skips are annotated on the Job with their reasons."""
    import yaml

    from test_scanners import run_checkov

    r = render("existing", PIN, ON)
    for i, obj in enumerate([manifest(r, "Job", "kimi-k3-bench"),
                             manifest(r, "PersistentVolumeClaim", "kimi-k3-bench-results"),
                             manifest(r, "ConfigMap", "kimi-k3-bench-runtime"),
                             # the operations part's policy for benchmark pods (CKV2_K8S_6)
                             manifest(r, "NetworkPolicy", "kimi-k3-benchmark")]):
        (tmp_path / f"{i}.yaml").write_text(yaml.safe_dump(obj))
    report = run_checkov(tmp_path)
    assert report["results"]["failed_checks"] == []
    assert sorted(c["check_id"] for c in report["results"]["skipped_checks"]) == [
        "CKV_K8S_35", "CKV_K8S_40"]
    assert report["summary"]["passed"] > 0


def test_wide_sweep_is_a_named_option(receipt):
    r = render("existing", PIN, ON, "benchmark.sweep=wide")
    cmd = manifest(r, "Job", "kimi-k3-bench")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert _arg(cmd, "--concurrencies") == "32,128"       # receipt workload_a.wide_sweep
    assert _arg(cmd, "--output-tokens") == "2048"
    assert _arg(cmd, "--measured") == "256"               # two waves of 128
    r = render("existing", PIN, ON, "benchmark.sweep=wide", "benchmark.measuredRequests=512")
    cmd = manifest(r, "Job", "kimi-k3-bench")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert _arg(cmd, "--measured") == "512"


def test_unknown_sweep_names_the_key(tmp_path, capsys):
    rc = main(["render", "--stack", "existing", "--config", PIN, "--config", ON,
               "--config", "benchmark.sweep=huge", "--out", str(tmp_path)])
    assert rc != 0
    err = capsys.readouterr().err
    assert "k3:benchmark.sweep" in err and "'huge'" in err and "wide" in err


def test_job_size_is_a_stack_key_for_a_small_node():
    """Issue 27: 4/8 CPU and 16/32 Gi fit no 2-CPU node; k3:benchmark.resources."""
    def job_container(r):
        return manifest(r, "Job", "kimi-k3-bench")["spec"]["template"]["spec"]["containers"][0]

    assert job_container(render("existing", PIN, ON))["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi", "ephemeral-storage": "1Gi"},
        "limits": {"cpu": "8", "memory": "32Gi", "ephemeral-storage": "8448Mi"}}
    small = render("existing", PIN, ON, "benchmark.resources.cpu=0.5",
                   "benchmark.resources.cpuLimit=1", "benchmark.resources.memoryGi=1.5",
                   "benchmark.resources.memoryLimitGi=3")
    assert job_container(small)["resources"] == {
        "requests": {"cpu": "500m", "memory": "1536Mi", "ephemeral-storage": "1Gi"},
        "limits": {"cpu": "1", "memory": "3Gi", "ephemeral-storage": "8448Mi"}}
