"""The Grafana dashboard for the vLLM engine, and the ConfigMap that ships it.

The dashboard is generated from the receipt (reference lines, GPUs per node) and the
checked metric list, so it cannot drift from either. `charts/dashboards/kimi-k3-vllm.json`
is this output, committed for importing by hand; a test holds the file to the builder.
Regenerate it with `python -m k3infra.operations.dashboard charts/dashboards/kimi-k3-vllm.json`.

The ConfigMap carries Grafana's sidecar label (`grafana_dashboard: "1"`, the default of
the grafana / kube-prometheus-stack charts' `sidecar.dashboards.label`).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

from k3infra import naming
from k3infra.config import StackConfig
from k3infra.operations.metric_names import series
from k3infra.operations.monitoring import VLLM_CONTAINER
from k3infra.plan import ServingPlan, reference_latency
from k3infra.receipt import NOTHING_MEASURED, Measurement, Receipt, load_receipt

UID = "kimi-k3-vllm"
FILE_NAME = f"{UID}.json"
SIDECAR_LABEL = {"grafana_dashboard": "1"}
SCHEMA_VERSION = 39
SEL = '{namespace="$namespace", pod=~"$pod"}'
RATE = "[$__rate_interval]"


def _seconds(ms: float) -> str:
    return repr(ms / 1000)


def _target(expr: str, legend: str, ref: str) -> dict:
    return {"datasource": {"type": "prometheus", "uid": "${datasource}"},
            "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def _quantiles(metric: str, by: str = "") -> list[tuple[str, str]]:
    """p50 and p99 of a histogram over the selected pods."""
    bucket = series(metric, "bucket")
    group = f"le{', ' + by if by else ''}"
    return [(f"histogram_quantile({q}, sum by ({group}) (rate({bucket}{SEL}{RATE})))", f"p{p}")
            for q, p in (("0.5", 50), ("0.99", 99))]


def _panel(title: str, queries: list[tuple[str, str]], unit: str, description: str = "",
           overrides: Optional[list[dict]] = None, max_value: Optional[float] = None) -> dict:
    defaults: dict[str, Any] = {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 0}}
    if max_value is not None:
        defaults["max"] = max_value
        defaults["min"] = 0
    return {"type": "timeseries", "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": {"legend": {"displayMode": "table", "placement": "bottom",
                                   "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "targets": [_target(expr, legend, chr(ord("A") + i))
                        for i, (expr, legend) in enumerate(queries)]}


def _reference_style(legend: str) -> dict:
    """Reference lines: dashed, so they read as a yardstick rather than a series."""
    return {"matcher": {"id": "byName", "options": legend},
            "properties": [{"id": "custom.lineStyle",
                            "value": {"fill": "dash", "dash": [10, 10]}},
                           {"id": "custom.lineWidth", "value": 2}]}


def reference_legends(receipt: Receipt, ref: Optional[Measurement]) -> dict[str, str]:
    if ref is None:          # a candidate: nothing measured yet, no reference lines
        return {}
    where = f"receipt {receipt.id}, concurrency {ref.concurrency}, workload A"
    return {"p50": f"receipt p50 ({where})", "p99": f"receipt p99 ({where})"}


def cost_panel(gen: str, node_rate_usd_per_hour: float) -> dict:
    """Live USD per million generated tokens per serving pod (= per node): the node rate
    per second over the pod's generation rate. Idle pods show no value, not infinity."""
    per_second = node_rate_usd_per_hour / 3600
    return _panel("USD per million generated tokens",
                  [(f"{per_second!r} * 1e6 / (sum by (pod) (rate({gen}{SEL}{RATE})) > 0)",
                    "{{pod}}")], "currencyUSD",
                  f"k3:monitoring.nodeRateUsdPerHour = {node_rate_usd_per_hour:g} USD per node-hour "
                  "/ 3600 / generated tokens per second of the node x 1e6. Output tokens only; "
                  "`k3infra bench cost` gives the same figure from benchmark results.")


def cold_start_panel() -> dict:
    """The last start of each serving pod, from kube-state-metrics' pod timestamps: from
    scheduling (image pull included) and from the vllm container's start (the weights
    gate, load, compile, profiling) to Ready. `k3infra startup` splits it into phases
    and compares each with the render's budget (docs/coldstart.md)."""
    ready = f"max by (pod) ({series('kube_pod_status_ready_time')}{SEL})"
    scheduled = f"max by (pod) ({series('kube_pod_status_scheduled_time')}{SEL})"
    started = (f"max by (pod) ({series('kube_pod_container_state_started')}"
               f'{{namespace="$namespace", pod=~"$pod", container="{VLLM_CONTAINER}"}})')
    return _panel("Cold start: time to Ready",
                  [(f"{ready} - {scheduled}", "scheduled -> Ready {{pod}}"),
                   (f"{ready} - {started}", "vllm start -> Ready {{pod}}")], "s",
                  "Seconds from the pod's scheduling (engine image pull included) and from the "
                  "vllm container's last start (weights gate, load, compile, profiling) to "
                  "Ready. `k3infra render` prints each phase's budget; `k3infra startup` prints "
                  "each phase of the last start against it.")


def dashboard(receipt: Receipt, ref: Optional[Measurement],
              node_rate_usd_per_hour: Optional[float] = None) -> dict:
    """`ref`: the receipt's reference latency (k3infra.plan.reference_latency)."""
    legends = reference_legends(receipt, ref)
    gpus = receipt.measured_gpu.gpus_per_node
    gen = series("vllm:generation_tokens")
    prompt = series("vllm:prompt_tokens")
    kv = f"({series('vllm:kv_cache_usage_perc')}{SEL})"
    workload = receipt.workload_a
    panels = [
        _panel("Requests per second",
               [(f"sum by (finished_reason) (rate({series('vllm:request_success')}{SEL}{RATE}))",
                 "{{finished_reason}}")], "reqps",
               "Finished requests by finish reason (stop, length, abort)."),
        _panel("Running and waiting requests",
               [(f"sum by (pod) ({series('vllm:num_requests_running')}{SEL})", "running {{pod}}"),
                (f"sum by (pod) ({series('vllm:num_requests_waiting')}{SEL})", "waiting {{pod}}")],
               "short", "The queue: waiting requests that keep growing mean too few replicas."),
        _panel("End-to-end request latency",
               [*_quantiles("vllm:e2e_request_latency_seconds"),
                (f"vector({_seconds(ref.p50_ms)})", legends["p50"]),
                (f"vector({_seconds(ref.p99_ms)})", legends["p99"])], "s",
               f"Dashed: what receipt {receipt.id} measured at concurrency {ref.concurrency} on "
               f"workload A ({workload.description}, at most {workload.output_tokens_max} output "
               "tokens). Other traffic has other latencies.",
               overrides=[_reference_style(legends["p50"]), _reference_style(legends["p99"])])
        if ref is not None else
        _panel("End-to-end request latency", _quantiles("vllm:e2e_request_latency_seconds"), "s",
               f"Receipt {receipt.id} is a candidate: {NOTHING_MEASURED}, so no reference "
               "lines."),
        _panel("Time to first token", _quantiles("vllm:time_to_first_token_seconds"), "s",
               "Prefill of ~35K-token prompts dominates TTFT for this model."),
        _panel("Inter-token latency", _quantiles("vllm:inter_token_latency_seconds"), "s"),
        _panel("Queue time", _quantiles("vllm:request_queue_time_seconds"), "s",
               "Time requests spend WAITING before the scheduler admits them."),
        _panel("Tokens/s per GPU",
               [(f"sum by (pod) (rate({gen}{SEL}{RATE})) / {gpus}", "generated {{pod}}"),
                (f"sum by (pod) (rate({prompt}{SEL}{RATE})) / {gpus}", "prompt {{pod}}")],
               "short", f"Node throughput / {gpus}: a replica is one {gpus}-GPU node running "
               f"tensor parallel {gpus}, so every GPU carries every token "
               f"(throughput unit of the receipt: {workload.throughput_unit})."),
        _panel("Tokens/s per node",
               [(f"sum by (pod) (rate({gen}{SEL}{RATE}))", "generated {{pod}}"),
                (f"sum by (pod) (rate({prompt}{SEL}{RATE}))", "prompt {{pod}}"),
                (f"sum (rate({gen}{SEL}{RATE}))", "generated, all replicas")],
               "short", "One serving pod is one node."),
        _panel("KV-cache usage", [(f"max by (pod) {kv}", "{{pod}}")], "percentunit",
               "1 = every KV block in use: new requests wait, running ones may be preempted.",
               max_value=1),
        _panel("Preemptions",
               [(f"sum by (pod) (increase({series('vllm:num_preemptions')}{SEL}{RATE}))",
                 "{{pod}}")], "short",
               "Requests evicted for lack of KV cache and recomputed later."),
        cold_start_panel(),
    ]
    if node_rate_usd_per_hour is not None:      # no configured rate: no panel, no made-up figure
        panels.append(cost_panel(gen, node_rate_usd_per_hour))
    for i, panel in enumerate(panels):
        panel["id"] = i + 1
        panel["gridPos"] = {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}
    running = series("vllm:num_requests_running")
    return {
        "uid": UID,
        "title": "Kimi K3 on vLLM (k3infra)",
        "description": f"vLLM serving {receipt.model.repo} as measured in receipt {receipt.id}; "
                       "generated by k3infra.operations.dashboard.",
        "tags": ["k3infra", "vllm", "kimi-k3"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            {"name": "namespace", "label": "Namespace", "type": "query",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": f"label_values({running}, namespace)", "refId": "namespace"},
             "definition": f"label_values({running}, namespace)",
             "refresh": 2, "current": {}, "hide": 0},
            {"name": "pod", "label": "Serving pod", "type": "query",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": f'label_values({running}{{namespace="$namespace"}}, pod)',
                       "refId": "pod"},
             "definition": f'label_values({running}{{namespace="$namespace"}}, pod)',
             "refresh": 2, "includeAll": True, "multi": True, "allValue": ".+",
             "current": {}, "hide": 0},
        ]},
        "panels": panels,
    }


def dashboard_json(receipt: Receipt, ref: Optional[Measurement],
                   node_rate_usd_per_hour: Optional[float] = None) -> str:
    return json.dumps(dashboard(receipt, ref, node_rate_usd_per_hour), indent=2) + "\n"


def dashboard_configmap(plan: ServingPlan, cfg: StackConfig, names: naming.ServingNames,
                        instance: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{names.base}-dashboard",
                         "namespace": cfg.monitoring.dashboard_namespace or names.namespace,
                         "labels": {**naming.labels(instance, "dashboard"), **SIDECAR_LABEL}},
            "data": {FILE_NAME: dashboard_json(plan.receipt, plan.reference,
                                                   cfg.monitoring.node_rate_usd_per_hour)}}


def main(argv: list[str]) -> int:
    """Write the dashboard JSON (the committed copy under charts/dashboards/)."""
    if len(argv) != 1:
        print("usage: python -m k3infra.operations.dashboard OUT.json", file=sys.stderr)
        return 2
    receipt = load_receipt()
    # An entry point of its own (no stack, no plan): the receipt's figure directly.
    Path(argv[0]).write_text(dashboard_json(receipt, reference_latency(receipt)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
