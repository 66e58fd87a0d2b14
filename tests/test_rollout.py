"""The benchmark gate of a roll (k3:rollout, k3infra/serving/rollout.py): the partition that
holds the canary, the gate Job named by the pod template's digest and aimed at the canary
pod alone, the promotion that depends on it, the refusals, and the one verdict the Job and
`bench compare` share. The node tier runs it for real (tests/e2e/test_node_stack.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3infra.bench import pod_runner, verdict
from k3infra.config import ConfigError
from k3infra.serving.rollout import PROMOTED_ANNOTATION

from conftest import GOOD_REVISION, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
TWO = (PIN, "replicas=2")
CANDIDATE = "kimi-k3-8xb300-vllm-recipe-candidate"
IMAGE = "docker.io/vllm/vllm-openai:kimi-k3@sha256:" + "5e" * 32


def resources(r, typ: str) -> list[dict]:
    return [x for x in r.resources if x["type"] == typ]


def gate_job(r) -> dict:
    (job,) = [m for m in r.manifests() if m["kind"] == "Job"
              and m["metadata"]["labels"]["app.kubernetes.io/component"] == "rollout-gate"]
    return job


def argv_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_one_replica_rolls_ungated_by_default():
    r = render("existing", PIN)
    sts = manifest(r, "StatefulSet")
    assert sts["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                             "rollingUpdate": {"partition": 0}}
    assert not resources(r, "k3infra:index:RolloutGate")
    assert not resources(r, "kubernetes:apps/v1:StatefulSetPatch")


def test_two_replicas_hold_all_but_the_canary_and_gate_it():
    r = render("existing", *TWO)
    sts = manifest(r, "StatefulSet")
    assert sts["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                             "rollingUpdate": {"partition": 1}}
    assert json.loads(sts["metadata"]["annotations"]["pulumi.com/waitFor"]) == [
        "jsonpath={$[?@.readyReplicas == 2 && @.updatedReplicas > 0]}"]
    job = gate_job(r)
    name = job["metadata"]["name"]
    assert name.startswith("kimi-k3-gate-") and len(name) == len("kimi-k3-gate-") + 12
    argv = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv_value(argv, "--base-url") == (
        "http://kimi-k3-1.kimi-k3-headless.kimi-k3.svc.cluster.local:8000")
    assert json.loads(argv_value(argv, "--gate")) == {
        "receipt": "kimi-k3-8xb300-2026-07-29", "tolerance_pct": 10.0,
        "figures": [{"concurrency": 8, "p50_ms": 18695.0, "p99_ms": 18766.0}]}
    assert job["metadata"]["annotations"]["k3infra.dev/results-claim"] == "kimi-k3-gate-results"
    # The Job waits for the StatefulSet; the promotion for the Job.
    (job_res,) = [x for x in resources(r, "kubernetes:batch/v1:Job")
                  if x["name"] == "kimi-k3-rollout-job"]
    (sts_res,) = resources(r, "kubernetes:apps/v1:StatefulSet")
    assert sts_res["urn"] in job_res["dependsOn"]
    (patch,) = resources(r, "kubernetes:apps/v1:StatefulSetPatch")
    assert job_res["urn"] in patch["dependsOn"]
    assert patch["inputs"]["spec"] == {"updateStrategy": {"type": "RollingUpdate",
                                                          "rollingUpdate": {"partition": 0}}}
    assert patch["inputs"]["metadata"]["name"] == "kimi-k3"
    # Its own await: every replica ready on the new template (the StatefulSet's, which the
    # provider would read otherwise, is the canary's: `up` returned with replica 0 old).
    assert patch["inputs"]["metadata"]["annotations"] == {
        PROMOTED_ANNOTATION: name.rsplit("-", 1)[1], "pulumi.com/patchForce": "true",
        "pulumi.com/waitFor": '["jsonpath={$[?@.readyReplicas == 2 && @.updatedReplicas == 2]}"]'}
    assert patch["customTimeouts"] == sts_res["customTimeouts"]


def test_the_benchmark_and_accuracy_jobs_wait_for_the_promotion():
    r = render("existing", *TWO, 'benchmark={"enabled": true}')
    (patch,) = resources(r, "kubernetes:apps/v1:StatefulSetPatch")
    (bench,) = [x for x in resources(r, "kubernetes:batch/v1:Job")
                if x["name"] == "kimi-k3-benchmark-job"]
    assert patch["urn"] in bench["dependsOn"]


def test_a_new_template_is_a_new_gate_job_and_nothing_else_is():
    base = gate_job(render("existing", *TWO))["metadata"]["name"]
    flag = gate_job(render("existing", *TWO, "servedModelName=k3-b"))["metadata"]["name"]
    image = gate_job(render("existing", *TWO, 'engine={"build": "prebuilt"}',
                            "engineImage=registry.example.com/vllm@sha256:" + "5e" * 32))
    outside = gate_job(render("existing", *TWO, 'monitoring={"serviceMonitor": true}'))
    assert len({base, flag, image["metadata"]["name"]}) == 3
    assert outside["metadata"]["name"] == base       # not in the pod template: no new gate


def test_the_gate_pods_reach_the_serving_port_and_nothing_else():
    r = render("existing", *TWO)
    gate = manifest(r, "NetworkPolicy", "kimi-k3-rollout-gate")
    assert gate["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "rollout-gate"
    serving = manifest(r, "NetworkPolicy", "kimi-k3-serving")
    peers = [p for rule in serving["spec"]["ingress"] for p in rule["from"]]
    assert {"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "kimi-k3", "app.kubernetes.io/instance": "kimi-k3",
        "app.kubernetes.io/component": "rollout-gate"}}} in peers


def test_a_candidate_is_recorded_never_promoted():
    r = render("existing", *TWO, f"receipt={CANDIDATE}", f"engineImage={IMAGE}")
    argv = gate_job(r)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert json.loads(argv_value(argv, "--gate")) == {"receipt": CANDIDATE, "candidate": True}
    assert not resources(r, "kubernetes:apps/v1:StatefulSetPatch")


def test_one_replica_gated_on_request_runs_after_the_roll():
    r = render("existing", PIN, 'rollout={"gate": true}')
    sts = manifest(r, "StatefulSet")
    assert sts["spec"]["updateStrategy"]["rollingUpdate"] == {"partition": 0}
    argv = gate_job(r)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv_value(argv, "--base-url").startswith("http://kimi-k3-0.kimi-k3-headless.")


@pytest.mark.parametrize("override", [
    'serving={"updateStrategy": "OnDelete"}', 'serving={"updatePartition": 1}'])
def test_the_gate_refuses_what_owns_the_partition(override):
    with pytest.raises(ConfigError) as exc:
        render("existing", *TWO, 'rollout={"gate": true}', override)
    assert exc.value.key == "k3:rollout.gate"
    assert "cannot gate with" in str(exc.value)
    # Unset, the gate steps aside for them.
    assert not resources(render("existing", *TWO, override), "k3infra:index:RolloutGate")


# --- the verdict and the runner's judgement --------------------------------------------

def test_the_gate_table_and_bench_compare_share_one_verdict():
    rows = verdict.gate_rows([{"concurrency": 8, "p50_ms": 100.0, "p99_ms": 200.0}],
                             [(8, "p50", 105.0), (8, "p99", 260.0), (1, "p50", 50.0)], 10.0)
    assert rows == [(8, "p50", 100.0, 105.0, "pass"), (8, "p99", 200.0, 260.0, "FAIL"),
                    (1, "p50", None, 50.0, "new evidence")]
    assert not verdict.gate_passes(rows)
    assert verdict.gate_table("r1", 10.0, rows).splitlines() == [
        "gate: canary against receipt r1 (e2el, +-10 %)",
        "   c stat  receipt ms  measured ms     delta  verdict",
        "   8 p50          100          105    +5.0 %  pass",
        "   8 p99          200          260   +30.0 %  FAIL",
        "   1 p50            -           50         -  new evidence",
        "REFUSED: 1 of 2 point(s) outside the tolerance; the other replicas keep the previous "
        "template"]
    from k3infra.bench.compare import LatencyRow

    assert LatencyRow("f", 8, "p99", 200.0, 260.0, True).verdict(10.0) == "FAIL"
    assert LatencyRow("f", 8, "p50", 100.0, 89.0, True).verdict(10.0) == "FAIL"   # faster too


def _run(tmp_path: Path, p50: float, p99: float) -> tuple[Path, dict]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run1-c8-measured.json").write_text(json.dumps({"p50_e2el_ms": p50,
                                                               "p99_e2el_ms": p99}))
    index = {"run_id": "run", "sets": [
        {"name": "run1-c8-warmup", "concurrency": 8, "role": "warmup",
         "result": "run1-c8-warmup.json"},
        {"name": "run1-c8-measured", "concurrency": 8, "role": "measured",
         "result": "run1-c8-measured.json"}]}
    return run_dir, index


@pytest.mark.parametrize("p50, p99, status, last", [
    (18000.0, 18900.0, 0, "PASSED: 2 point(s) within the tolerance; promoting"),
    (9000.0, 9100.0, 1, "REFUSED: 2 of 2 point(s) outside the tolerance; the other replicas "
                        "keep the previous template")])
def test_the_runner_judges_the_canary_and_says_so_in_its_termination_message(
        tmp_path, p50, p99, status, last):
    run_dir, index = _run(tmp_path, p50, p99)
    spec = {"receipt": "kimi-k3-8xb300-2026-07-29", "tolerance_pct": 10.0,
            "figures": [{"concurrency": 8, "p50_ms": 18695.0, "p99_ms": 18766.0}]}
    log = tmp_path / "termination-log"
    args = pod_runner.parse_args([
        "--base-url", "http://x", "--served-model-name", "k", "--model-dir", "/m", "--results",
        str(tmp_path), "--receipt", "r", "--concurrencies", "8", "--runs", "1", "--warmups", "1",
        "--measured", "3", "--min-tokens", "1", "--max-tokens", "2", "--output-tokens", "1",
        "--block-size", "128", "--gate", json.dumps(spec), "--termination-log", str(log)])
    assert pod_runner.judge(args, run_dir, index) == status
    assert log.read_text().splitlines()[-1] == last
    recorded = json.loads((run_dir / "index.json").read_text())["gate"]
    assert recorded["passed"] is (status == 0) and recorded["table"] == log.read_text()


def test_the_runner_records_a_candidates_run_without_judging(tmp_path):
    run_dir, index = _run(tmp_path, 1.0, 2.0)
    log = tmp_path / "termination-log"
    args = pod_runner.parse_args([
        "--base-url", "http://x", "--served-model-name", "k", "--model-dir", "/m", "--results",
        str(tmp_path), "--receipt", "r", "--concurrencies", "8", "--runs", "1", "--warmups", "1",
        "--measured", "3", "--min-tokens", "1", "--max-tokens", "2", "--output-tokens", "1",
        "--block-size", "128", "--gate", json.dumps({"receipt": CANDIDATE, "candidate": True}),
        "--termination-log", str(log)])
    assert pod_runner.judge(args, run_dir, index) == 0
    assert log.read_text().splitlines()[-1].startswith(
        f"RECORDED: receipt {CANDIDATE} is a candidate, nothing to judge; run run is its first "
        "measurement")


def test_each_component_registers_its_outputs_once(monkeypatch):
    """The engine refuses a component's second registration of its outputs ("cannot
    complete a resource whose registration isn't pending", found by the node tier: the
    gate's Job and its promotion are one component); the SDK's mocks do not."""
    import pulumi

    from k3infra.render import render_stack

    from conftest import ROOT

    calls: list[str] = []
    original = pulumi.ComponentResource.register_outputs

    def record(self, outputs):
        calls.append(self._name)
        return original(self, outputs)

    monkeypatch.setattr(pulumi.ComponentResource, "register_outputs", record)
    render_stack("existing", [PIN, "replicas=2", 'benchmark={"enabled": true}'], ROOT)
    assert "kimi-k3-rollout" in calls and len(calls) == len(set(calls)), calls
