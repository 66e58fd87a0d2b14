"""ServiceMonitor, metrics Service and PrometheusRule: created only when k3:monitoring says
the CRDs are there; shapes checked by test (kubernetes-validate has no schema for CRDs);
every threshold read from the receipt or the config, never a literal."""
from __future__ import annotations

import json
import re

import pytest

from k3infra.config import ConfigError, parse_stack_config
from k3infra.operations import monitoring as mon
from k3infra.plan import reference_latency, resolve_plan
from k3infra.receipt import load_receipt, parse_receipt
from k3infra.serving import manifests as m

from conftest import GOOD_REVISION, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
ALL = 'monitoring={"serviceMonitor": true, "prometheusRule": true, "dashboard": true}'
IMAGE = "registry.example.com/k3/vllm@sha256:" + "1" * 64
NAMES = m.ServingNames(m.APP, "k3")
EXPECTED_ALERTS = {"KimiK3EngineDown", "KimiK3EngineNotScraped", "KimiK3EngineUnhealthy",
                   "KimiK3EngineRestarted", "KimiK3KvCacheNearlyFull", "KimiK3QueueGrowing",
                   "KimiK3P99LatencyAboveReceipt", "KimiK3Preempting", "KimiK3GpuCountLow",
                   "KimiK3NodeGpusUnallocatable"}
DURATION = re.compile(r"^[0-9]+[smh]$")


def cfg(**keys):
    raw = {"k3:weightsRevision": GOOD_REVISION, "k3:apiKey": "x", "k3:engineImage": IMAGE}
    raw.update({f"k3:{k}": (json.dumps(v) if isinstance(v, (dict, list)) else v)
                for k, v in keys.items()})
    return parse_stack_config(raw, receipt=load_receipt())


def rules(c=None, receipt=None) -> dict[str, dict]:
    c = c or cfg()
    plan = resolve_plan(receipt or load_receipt(), c)
    return {r["alert"]: r for r in mon.alert_rules(plan, c, NAMES)}


def receipt_with_p99(p99_ms: float):
    data = load_receipt().model_dump(by_alias=True)
    data["measured"] = [{**x, "p99_ms": p99_ms} for x in data["measured"]]
    return parse_receipt(data)


# --- created only when asked -----------------------------------------------------------

def test_default_render_has_no_prometheus_operator_objects():
    kinds = [x["kind"] for x in render("existing", PIN).manifests()]
    assert "ServiceMonitor" not in kinds and "PrometheusRule" not in kinds
    assert not [x for x in render("existing", PIN).manifests()
                if x["kind"] == "ConfigMap" and x["metadata"]["name"].endswith("-dashboard")]


def test_monitoring_render_contains_servicemonitor_rule_and_dashboard():
    r = render("existing", PIN, ALL)
    assert manifest(r, "ServiceMonitor")["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest(r, "PrometheusRule")["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest(r, "ConfigMap", "kimi-k3-dashboard")["metadata"]["labels"][
        "grafana_dashboard"] == "1"
    assert manifest(r, "Service", "kimi-k3-metrics")


@pytest.mark.parametrize("flags,kinds", [
    ({"serviceMonitor": True}, {"ServiceMonitor", "Service"}),
    ({"prometheusRule": True}, {"PrometheusRule"}),
    ({"dashboard": True}, set()),            # the ConfigMap comes from dashboard.py
])
def test_each_flag_adds_only_its_objects(flags, kinds):
    c = cfg(monitoring=flags)
    assert {o["kind"] for o in mon.monitoring_objects(resolve_plan(load_receipt(), c), c,
                                                      NAMES, "k3")} == kinds


def test_operations_component_parents_its_objects():
    r = render("existing", PIN, ALL)
    comp = next(x for x in r.resources if x["type"] == "k3infra:index:ServingOperations")
    stack = next(x for x in r.resources if x["type"] == "k3infra:index:K3ServingStack")
    assert comp["parent"] == stack["urn"]
    children = [x for x in r.resources if x["parent"] == comp["urn"]]
    assert sorted(c["inputs"]["kind"] for c in children) == sorted(
        ["ConfigMap", "NetworkPolicy", "NetworkPolicy", "NetworkPolicy", "PrometheusRule",
         "Service", "ServiceMonitor"])
    ns = next(x for x in r.resources if x["name"] == "kimi-k3-namespace")
    # Each object records the namespace itself (not only its component).
    for child in children:
        assert ns["urn"] in child["dependsOn"], child["name"]


# --- ServiceMonitor and metrics Service --------------------------------------------------

def test_servicemonitor_selects_the_metrics_service_only_and_it_selects_the_pods():
    r = render("existing", PIN, ALL)
    sm = manifest(r, "ServiceMonitor")["spec"]
    services = [x for x in r.manifests() if x["kind"] == "Service"]
    selected = [s["metadata"]["name"] for s in services
                if all(s["metadata"]["labels"].get(k) == v
                       for k, v in sm["selector"]["matchLabels"].items())]
    assert selected == ["kimi-k3-metrics"]            # not the API Services: no double scrape
    svc = manifest(r, "Service", "kimi-k3-metrics")["spec"]
    pod_labels = manifest(r, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in svc["selector"].items())
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
    assert sm["namespaceSelector"] == {"matchNames": ["kimi-k3"]}
    (endpoint,) = sm["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["port"] == svc["ports"][0]["name"]
    # The proxy's metrics port: the only one the scraper may reach (issue 21).
    proxy = next(c for c in manifest(r, "StatefulSet")["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "proxy")
    metrics = next(p for p in proxy["ports"] if p["name"] == svc["ports"][0]["targetPort"])
    assert metrics["containerPort"] == svc["ports"][0]["port"] == 9090


def test_servicemonitor_and_rule_carry_the_configured_selector_labels():
    c = cfg(monitoring={"serviceMonitor": True, "prometheusRule": True,
                        "labels": {"release": "kube-prometheus-stack"}})
    for obj in mon.monitoring_objects(resolve_plan(load_receipt(), c), c, NAMES, "k3"):
        if obj["kind"] in ("ServiceMonitor", "PrometheusRule"):
            assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"


@pytest.mark.parametrize("interval,timeout", [("30s", "10s"), ("15s", "5s"), ("3s", "1s"),
                                              ("2m", "10s")])
def test_scrape_timeout_never_exceeds_the_interval(interval, timeout):
    sm = mon.service_monitor(cfg(monitoring={"scrapeInterval": interval}), NAMES, "k3")
    assert sm["spec"]["endpoints"][0]["interval"] == interval
    assert sm["spec"]["endpoints"][0]["scrapeTimeout"] == timeout


# --- PrometheusRule shape ----------------------------------------------------------------

def test_prometheusrule_shape():
    c = cfg()
    rule = mon.prometheus_rule(resolve_plan(load_receipt(), c), c, NAMES, "k3")
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert rule["metadata"]["namespace"] == "k3"
    (group,) = rule["spec"]["groups"]
    assert group["name"] and set(group) == {"name", "rules"}
    assert {r["alert"] for r in group["rules"]} == EXPECTED_ALERTS
    for r in group["rules"]:
        assert set(r) == {"alert", "expr", "for", "labels", "annotations"}
        assert re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", r["alert"])
        assert DURATION.match(r["for"]), r["for"]
        assert r["labels"]["severity"] in ("critical", "warning")
        assert r["annotations"]["summary"] and r["annotations"]["description"]
        assert r["expr"].count("(") == r["expr"].count(")")
        assert r["expr"].count("{") == r["expr"].count("}")


def test_every_serving_query_is_scoped_to_the_stacks_pods():
    c = cfg(namespace="llm")
    names = m.ServingNames(m.APP, "llm")
    for r in mon.alert_rules(resolve_plan(load_receipt(), c), c, names):
        if r["alert"] == "KimiK3NodeGpusUnallocatable":
            assert 'kube_pod_info{namespace="llm", pod=~"kimi-k3-[0-9]+"}' in r["expr"]
            continue
        assert 'namespace="llm"' in r["expr"], r["alert"]
        assert 'pod=~"kimi-k3-[0-9]+"' in r["expr"], r["alert"]


# --- thresholds come from the receipt and the config -------------------------------------

def test_p99_threshold_is_the_receipts_p99_plus_the_configured_margin(receipt):
    ref = reference_latency(receipt)
    assert ref.metric == "e2el" and ref.concurrency == max(
        x.concurrency for x in receipt.measured if x.metric == "e2el")
    for margin in (0, 10, 25):
        expr = rules(cfg(monitoring={"p99MarginPct": margin}))["KimiK3P99LatencyAboveReceipt"]["expr"]
        threshold = float(expr.rsplit(">", 1)[1])
        assert threshold == pytest.approx(ref.p99_ms / 1000 * (1 + margin / 100), abs=1e-3)
        assert "vllm:e2e_request_latency_seconds_bucket" in expr and "0.99" in expr


def test_p99_threshold_follows_a_different_receipt():
    other = receipt_with_p99(30000)
    expr = rules(receipt=other)["KimiK3P99LatencyAboveReceipt"]["expr"]
    assert float(expr.rsplit(">", 1)[1]) == pytest.approx(30.0 * 1.1, abs=1e-3)
    assert "30000 ms" in rules(receipt=other)["KimiK3P99LatencyAboveReceipt"]["annotations"][
        "description"]


def test_receipt_without_an_e2el_figure_is_refused():
    data = load_receipt().model_dump(by_alias=True)
    data["measured"] = [{**x, "metric": "ttft"} for x in data["measured"]]
    with pytest.raises(ValueError, match="no e2el measurement"):
        reference_latency(parse_receipt(data))


def test_gpu_count_alert_uses_the_receipts_gpus_per_node(receipt):
    gpus = receipt.measured_gpu.gpus_per_node
    expr = rules()["KimiK3GpuCountLow"]["expr"]
    assert expr.startswith("count by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{")
    assert expr.endswith(f"< {gpus}")
    assert rules()["KimiK3NodeGpusUnallocatable"]["expr"].startswith(
        f'(kube_node_status_allocatable{{resource="nvidia_com_gpu"}} < {gpus})')


def test_gpu_count_alert_follows_exported_dcgm_labels():
    expr = rules(cfg(monitoring={"dcgmExportedLabels": True}))["KimiK3GpuCountLow"]["expr"]
    assert "count by (exported_namespace, exported_pod)" in expr
    assert 'exported_namespace="k3", exported_pod=~"kimi-k3-[0-9]+"' in expr


def test_kv_and_queue_thresholds_come_from_config():
    r = rules(cfg(monitoring={"kvCacheUsageThreshold": 0.97, "waitingRequestsThreshold": 4}))
    assert r["KimiK3KvCacheNearlyFull"]["expr"].endswith("> 0.97")
    assert "vllm:kv_cache_usage_perc" in r["KimiK3KvCacheNearlyFull"]["expr"]
    assert "gpu_cache_usage_perc" not in r["KimiK3KvCacheNearlyFull"]["expr"]
    assert ") > 4) and (" in r["KimiK3QueueGrowing"]["expr"]
    assert "deriv(vllm:num_requests_waiting" in r["KimiK3QueueGrowing"]["expr"]


def test_engine_down_and_unhealthy_are_silent_during_the_startup_budget(receipt):
    c = cfg(serving={"storageReadGBps": 0.5})
    # The startupProbe's allowance: 10 s x ceil((4683 gate + 3751 engine + 60) / 10).
    budget = 8500
    r = rules(c)
    for alert in ("KimiK3EngineDown", "KimiK3EngineUnhealthy"):
        expr = r[alert]["expr"]
        assert "unless on (namespace, pod)" in expr
        assert (f'time() - kube_pod_container_state_started{{namespace="k3", '
                f'pod=~"kimi-k3-[0-9]+", container="vllm"}} < {budget})') in expr
    assert r["KimiK3EngineDown"]["expr"].startswith('(up{namespace="k3", pod=~"kimi-k3-[0-9]+"} == 0)')
    assert 'condition="true"} == 0)' in r["KimiK3EngineUnhealthy"]["expr"]
    assert r["KimiK3EngineNotScraped"]["expr"] == 'absent(up{namespace="k3", pod=~"kimi-k3-[0-9]+"})'


def test_preemption_alert_counts_the_preemption_counter():
    expr = rules()["KimiK3Preempting"]["expr"]
    assert "increase(vllm:num_preemptions_total{" in expr and expr.endswith("> 0")


@pytest.mark.parametrize("monitoring,key", [
    ({"kvCacheUsageThreshold": 1.5}, "k3:monitoring.kvCacheUsageThreshold"),
    ({"p99MarginPct": -5}, "k3:monitoring.p99MarginPct"),
    ({"scrapeInterval": "30"}, "k3:monitoring.scrapeInterval"),
    ({"labels": {"bad key!": "x"}}, "k3:monitoring.labels"),
    ({"dashboardNamespace": "Grafana"}, "k3:monitoring.dashboardNamespace"),
    ({"serviceMonitors": True}, "k3:monitoring.serviceMonitors"),
])
def test_bad_monitoring_settings_are_refused_naming_the_key(monitoring, key):
    with pytest.raises(ConfigError) as exc:
        cfg(monitoring=monitoring)
    assert exc.value.key == key
