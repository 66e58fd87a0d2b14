"""The AccuracySmoke Job through the real stack program under mocks: off by default,
ordered after serving, the key from the Secret, the shipped tasks, placed like the
benchmark, strict schemas, checkov clean, refused on `pulumi up` with the placeholder."""
import kubernetes_validate
import pytest

from k3infra import gates
from k3infra.accuracy import manifests as a
from k3infra.cli import main
from k3infra.config import parse_stack_config

from conftest import GOOD_REVISION, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
ON = "accuracy.enabled=true"
IMAGE = "registry.example/k3-accuracy@sha256:" + "a" * 64


def _arg(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def test_off_by_default():
    r = render("existing", PIN)
    assert not r.by_type("k3infra:index:AccuracySmoke")
    assert not [m for m in r.manifests() if m["metadata"]["name"].startswith("kimi-k3-accuracy")]


def test_job_runs_after_serving_with_the_shipped_tasks():
    r = render("existing", PIN, ON)
    by_name = {res["name"]: res for res in r.resources}
    comp = r.by_type("k3infra:index:AccuracySmoke")
    assert len(comp) == 1 and comp[0]["parent"] == by_name["kimi-k3"]["urn"]
    job = by_name["kimi-k3-accuracy-job"]
    assert job["parent"] == comp[0]["urn"]
    assert by_name["kimi-k3-serving-statefulset"]["urn"] in job["dependsOn"]
    assert by_name["kimi-k3-accuracy-runtime"]["urn"] in job["dependsOn"]
    assert by_name["kimi-k3-accuracy-results"]["urn"] in job["dependsOn"]
    assert job["customTimeouts"]["create"] == "70m"          # 60 min deadline + 10
    kinds = [(m["kind"], m["metadata"]["name"]) for m in r.manifests()]
    assert kinds.index(("StatefulSet", "kimi-k3")) < kinds.index(("Job", "kimi-k3-accuracy"))
    j = manifest(r, "Job", "kimi-k3-accuracy")
    assert j["metadata"]["annotations"]["k3infra.dev/label"] == "smoke test"
    c = j["spec"]["template"]["spec"]["containers"][0]
    cmd = c["command"]
    assert cmd[:2] == ["python3", "/etc/k3/accuracy/runner.py"]
    assert _arg(cmd, "--tasks") == "k3_smoke_gsm8k,k3_smoke_arc"
    assert _arg(cmd, "--limit") == "100" and _arg(cmd, "--max-tokens") == "1024"
    assert _arg(cmd, "--seed") == "0" and _arg(cmd, "--tasks-dir") == "/etc/k3/accuracy/tasks"
    assert _arg(cmd, "--endpoint") == r.outputs["endpoint"]
    assert _arg(cmd, "--model") == r.outputs["servedModelName"]
    # The image's datasets cache is read-only: lm-eval works on a copy in the scratch volume.
    assert _arg(cmd, "--datasets-copy") == "/tmp/hf-datasets"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "/tmp" in mounts and not mounts["/tmp"].get("readOnly")
    env = {e["name"]: e for e in c["env"]}
    assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "kimi-k3-api-key"
    assert env["HF_DATASETS_OFFLINE"]["value"] == "1" and env["HF_HUB_OFFLINE"]["value"] == "1"
    assert j["spec"]["backoffLimit"] == 0


def test_api_key_never_in_the_manifests():
    r = render("existing", PIN, ON, "apiKey=sk-accuracy-DO-NOT-LEAK")
    assert "sk-accuracy-DO-NOT-LEAK" not in str(manifest(r, "Job", "kimi-k3-accuracy"))


def test_placed_beside_serving_like_the_benchmark():
    r = render("existing", PIN, ON, "benchmark.enabled=true")
    acc = manifest(r, "Job", "kimi-k3-accuracy")["spec"]["template"]["spec"]
    bench = manifest(r, "Job", "kimi-k3-bench")["spec"]["template"]["spec"]
    assert acc["affinity"] == bench["affinity"] and acc["tolerations"] == bench["tolerations"]
    assert "nvidia.com/gpu" not in str(acc["containers"][0]["resources"])
    pol = manifest(r, "NetworkPolicy", "kimi-k3-accuracy-smoke")
    assert pol["spec"]["ingress"] == []
    sts = manifest(r, "StatefulSet")
    port = next(p for p in pol["spec"]["egress"] if "ports" in p and "to" in p
                and "podSelector" in p["to"][0])
    assert port["to"][0]["podSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]


def test_runtime_configmap_ships_runner_and_tasks():
    r = render("existing", PIN, ON)
    cm = manifest(r, "ConfigMap", "kimi-k3-accuracy-runtime")
    assert set(cm["data"]) == {"runner.py", "k3_smoke_gsm8k.yaml", "k3_smoke_arc.yaml"}
    assert "import pulumi" not in cm["data"]["runner.py"]
    items = manifest(r, "Job", "kimi-k3-accuracy")["spec"]["template"]["spec"]["volumes"][0]
    assert {i["path"] for i in items["configMap"]["items"]} == {
        "runner.py", "tasks/k3_smoke_gsm8k.yaml", "tasks/k3_smoke_arc.yaml"}


def test_config_changes_and_bad_values_name_the_key(tmp_path, capsys):
    r = render("existing", PIN, ON, f"accuracy.image={IMAGE}", "accuracy.limit=20",
               "accuracy.tasks=[\"k3_smoke_gsm8k\"]", "accuracy.maxTokens=512")
    c = manifest(r, "Job", "kimi-k3-accuracy")["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == IMAGE
    assert _arg(c["command"], "--tasks") == "k3_smoke_gsm8k"
    assert _arg(c["command"], "--limit") == "20" and _arg(c["command"], "--max-tokens") == "512"
    for override, key in (("accuracy.image=python:3.11", "k3:accuracy.image"),
                          ("accuracy.tasks=[\"mmlu\"]", "k3:accuracy.tasks"),
                          ("accuracy.limit=0", "k3:accuracy.limit")):
        rc = main(["render", "--stack", "existing", "--config", PIN, "--config", ON,
                   "--config", override, "--out", str(tmp_path)])
        assert rc != 0
        assert key in capsys.readouterr().err


def test_placeholder_image_is_a_refusing_gate():
    from k3infra.receipt import load_receipt

    base = {"weightsRevision": GOOD_REVISION, "apiKey": "k", "engineImage": IMAGE}
    cfg = parse_stack_config({**base, "accuracy": {"enabled": True}}, receipt=load_receipt())
    found = [g for g in gates.deployment_gates(load_receipt(), cfg) if g.key == "k3:accuracy.image"]
    assert len(found) == 1 and found[0].refuses
    cfg = parse_stack_config({**base, "accuracy": {"enabled": True, "image": IMAGE}},
                             receipt=load_receipt())
    assert not [g for g in gates.deployment_gates(load_receipt(), cfg)
                if g.key == "k3:accuracy.image"]


def test_strict_schemas_and_checkov(tmp_path):
    import yaml

    from test_scanners import run_checkov

    r = render("existing", PIN, ON)
    objs = [manifest(r, "Job", "kimi-k3-accuracy"),
            manifest(r, "PersistentVolumeClaim", "kimi-k3-accuracy-results"),
            manifest(r, "ConfigMap", "kimi-k3-accuracy-runtime"),
            manifest(r, "NetworkPolicy", "kimi-k3-accuracy-smoke")]
    for version in ("1.33", kubernetes_validate.latest_version()):
        for obj in objs:
            kubernetes_validate.validate(obj, version, strict=True)
    for i, obj in enumerate(objs):
        (tmp_path / f"{i}.yaml").write_text(yaml.safe_dump(obj))
    report = run_checkov(tmp_path)
    assert report["results"]["failed_checks"] == []
    assert sorted(c["check_id"] for c in report["results"]["skipped_checks"]) == [
        "CKV_K8S_35", "CKV_K8S_40"]


def test_job_size_is_a_stack_key_for_a_small_node():
    """Issue 27: 2/4 CPU and 8/16 Gi fit no 2-CPU node; k3:accuracy.resources."""
    def job_container(r):
        return manifest(r, "Job", "kimi-k3-accuracy")["spec"]["template"]["spec"]["containers"][0]

    assert job_container(render("existing", PIN, ON))["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi", "ephemeral-storage": "1Gi"},
        "limits": {"cpu": "4", "memory": "16Gi", "ephemeral-storage": "4352Mi"}}
    small = render("existing", PIN, ON, "accuracy.resources.cpu=0.5",
                   "accuracy.resources.cpuLimit=1", "accuracy.resources.memoryGi=1",
                   "accuracy.resources.memoryLimitGi=2")
    assert job_container(small)["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"},
        "limits": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "4352Mi"}}
