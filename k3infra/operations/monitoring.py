"""Prometheus Operator objects for the vLLM engine: a metrics Service + ServiceMonitor for
`/metrics` and a PrometheusRule with the alerts that matter for this model.

Pure: (plan, config, names) -> manifest dicts (k3infra.plan: the receipt, the startup
budget, the reference latency and the p99 threshold, resolved once). Every metric name
goes through `metric_names.series()` (the checked list in metric_names.yaml); every figure
the rules compare against comes from the receipt or the stack config.

Label assumptions (docs/operations.md): vLLM series carry `namespace` and `pod` (what a
ServiceMonitor or PodMonitor attaches); kube-state-metrics series carry the pod's own
`namespace`/`pod` (kube-prometheus-stack scrapes it with honorLabels).
"""
from __future__ import annotations

from k3infra import naming, topology
from k3infra.config import StackConfig
from k3infra.operations.metric_names import series
from k3infra.plan import ServingPlan
from k3infra.receipt import Measurement, Receipt

METRICS_PATH = "/metrics"          # the proxy's metrics port, without the API key
METRICS_SERVICE_LABEL = "k3infra.dev/metrics"
VLLM_CONTAINER = "vllm"
RULE_GROUP = "kimi-k3-vllm"
# Windows the rules look back over. Long enough for a 256-token, ~19 s request to show
# up in several scrapes; short enough to page within a quarter of an hour.
LATENCY_WINDOW = "15m"
RATE_WINDOW = "10m"


def metrics_service_name(names: naming.ServingNames) -> str:
    return f"{names.base}-metrics"


def pod_regex(names: naming.ServingNames) -> str:
    """StatefulSet pods are `<name>-<ordinal>`; a multi-node group's leader
    `<base>-r<replica>-0` and its worker `<base>-r<replica>-0-<index>`."""
    if names.groups:
        return f"{names.base}-r[0-9]+-0(-[0-9]+)?"
    return f"{names.statefulset}-[0-9]+"


def selector(names: naming.ServingNames, **extra: str) -> str:
    """PromQL label matchers for the serving pods' series."""
    parts = [f'namespace="{names.namespace}"', f'pod=~"{pod_regex(names)}"']
    parts += [f'{k}="{v}"' for k, v in extra.items()]
    return "{" + ", ".join(parts) + "}"


def metrics_service_selector(instance: str) -> dict[str, str]:
    """The metrics Service's own labels the ServiceMonitor selects (not the API Services')."""
    return {"app.kubernetes.io/name": naming.APP, "app.kubernetes.io/instance": instance,
            METRICS_SERVICE_LABEL: "true"}


def metrics_service(names: naming.ServingNames, instance: str, port: int) -> dict:
    """A headless Service only for scraping: the API Services carry identical labels, so
    a ServiceMonitor selecting them would scrape every pod twice. It publishes pods that
    are not Ready too: an engine failing /health is exactly the one to look at."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": metrics_service_name(names), "namespace": names.namespace,
                         "labels": {**naming.labels(instance, "metrics"), METRICS_SERVICE_LABEL: "true"}},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     # A multi-node group's metrics are its leader's (the worker serves none).
                     "selector": ({**naming.selector_labels(instance),
                                   topology.LWS_WORKER_INDEX_LABEL: "0"} if names.groups
                                  else naming.selector_labels(instance)),
                     "ports": [{"name": "metrics", "port": port, "targetPort": "metrics",
                                "protocol": "TCP"}]}}


def service_monitor(cfg: StackConfig, names: naming.ServingNames, instance: str) -> dict:
    interval = cfg.monitoring.scrape_interval
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": names.base, "namespace": names.namespace,
                         "labels": {**naming.labels(instance, "metrics"), **cfg.monitoring.labels}},
            "spec": {"selector": {"matchLabels": metrics_service_selector(instance)},
                     "namespaceSelector": {"matchNames": [names.namespace]},
                     "endpoints": [{"port": "metrics", "path": METRICS_PATH, "scheme": "http",
                                    "interval": interval,
                                    "scrapeTimeout": _scrape_timeout(interval)}]}}


def _scrape_timeout(interval: str) -> str:
    """Prometheus refuses a timeout above the interval; a third of it, at most 10 s."""
    seconds = int(interval[:-1]) * (60 if interval.endswith("m") else 1)
    return f"{max(1, min(10, seconds // 3))}s"


def _rule(alert: str, expr: str, for_: str, severity: str, summary: str,
          description: str) -> dict:
    return {"alert": alert, "expr": expr, "for": for_,
            "labels": {"severity": severity, "component": "kimi-k3-serving"},
            "annotations": {"summary": summary, "description": description}}


def _starting(plan: ServingPlan, names: naming.ServingNames) -> str:
    """Pods whose vLLM container started within the startup budget: loading 1.5 TB and
    capturing graphs, not down. Used with `unless`, so without kube-state-metrics the
    alerts still fire (also during a start)."""
    budget = plan.budget.total_seconds
    started = series("kube_pod_container_state_started")
    return (f"(time() - {started}{selector(names, container=VLLM_CONTAINER)} < {budget})")


def _p99_rule(receipt: Receipt, cfg: StackConfig, names: naming.ServingNames,
              ref: Measurement, p99_s: float) -> dict:
    mon, sel, ns = cfg.monitoring, selector(names), names.namespace
    return _rule("KimiK3P99LatencyAboveReceipt",
                 f"histogram_quantile(0.99, sum by (namespace, le) (rate("
                 f"{series('vllm:e2e_request_latency_seconds', 'bucket')}{sel}[{LATENCY_WINDOW}])))"
                 f" > {p99_s:.3f}",
                 "15m", "warning",
                 f"p99 end-to-end latency in {ns} above the receipt's p99 + {mon.p99_margin_pct:g} %",
                 f"Receipt {receipt.id} measured p99 {ref.p99_ms:g} ms (p50 {ref.p50_ms:g} ms) at "
                 f"concurrency {ref.concurrency} on workload A ({receipt.workload_a.description}, "
                 f"at most {receipt.workload_a.output_tokens_max} output tokens); the alert fires "
                 f"above {p99_s:.3f} s. Other traffic has other latencies: set "
                 "k3:monitoring.p99MarginPct for yours.")


def alert_rules(plan: ServingPlan, cfg: StackConfig, names: naming.ServingNames) -> list[dict]:
    receipt = plan.receipt
    mon = cfg.monitoring
    sel = selector(names)
    ns = names.namespace
    starting = _starting(plan, names)
    budget = plan.budget.total_seconds
    ref, p99_s = plan.reference, plan.p99_threshold_seconds
    gpus = receipt.measured_gpu.gpus_per_node
    up = series("up")
    kv = f"({series('vllm:kv_cache_usage_perc')}{sel})"
    waiting = f"{series('vllm:num_requests_waiting')}{sel}"
    dcgm_ns, dcgm_pod = (("exported_namespace", "exported_pod") if mon.dcgm_exported_labels
                         else ("namespace", "pod"))
    dcgm_sel = f'{{{dcgm_ns}="{ns}", {dcgm_pod}=~"{pod_regex(names)}"}}'
    return [
        _rule("KimiK3EngineDown",
              f"({up}{sel} == 0) unless on (namespace, pod) {starting}",
              "5m", "critical",
              "vLLM on {{ $labels.pod }} does not answer /metrics",
              "Prometheus cannot scrape the engine of {{ $labels.namespace }}/{{ $labels.pod }} "
              f"and its container started more than the startup budget ({budget} s) ago. "
              "A dead engine takes its whole 8-GPU node with it."),
        _rule("KimiK3EngineNotScraped",
              f"absent({up}{sel})",
              "15m", "critical",
              f"No vLLM scrape target in namespace {ns}",
              "No serving pod is scraped at all: the StatefulSet has no pods, or the "
              "ServiceMonitor / NetworkPolicy does not let the scraper in."),
        _rule("KimiK3EngineUnhealthy",
              f"({series('kube_pod_status_ready')}{selector(names, condition='true')} == 0) "
              f"unless on (namespace, pod) {starting}",
              "5m", "critical",
              "vLLM on {{ $labels.pod }} fails /health",
              "The readiness probe (GET /health, 503 once the engine died) has failed for "
              "5 minutes after the startup budget: the pod is out of the Service."),
        _rule("KimiK3EngineRestarted",
              f"increase({series('kube_pod_container_status_restarts')}"
              f"{selector(names, container=VLLM_CONTAINER)}[1h]) > 0",
              "0m", "warning",
              "vLLM on {{ $labels.pod }} restarted",
              f"Every restart reloads the weights and recaptures graphs (startup budget {budget} s)."
              " Check `kubectl logs --previous` for the engine error."),
        _rule("KimiK3KvCacheNearlyFull",
              f"max by (namespace, pod) {kv} > {mon.kv_cache_usage_threshold:g}",
              "10m", "warning",
              "KV cache on {{ $labels.pod }} above "
              f"{mon.kv_cache_usage_threshold * 100:g} %",
              "New requests will wait or preempt running ones (k3:monitoring.kvCacheUsageThreshold)."),
        _rule("KimiK3QueueGrowing",
              f"(sum by (namespace, pod) ({waiting}) > {mon.waiting_requests_threshold}) and "
              f"(sum by (namespace, pod) (deriv({waiting}[{RATE_WINDOW}])) > 0)",
              "10m", "warning",
              "Waiting requests on {{ $labels.pod }} keep growing",
              "More requests arrive than the replica serves: add replicas (whole 8-GPU nodes) "
              "or shed load (k3:monitoring.waitingRequestsThreshold)."),
        *([] if ref is None else [_p99_rule(receipt, cfg, names, ref, p99_s)]),
        _rule("KimiK3Preempting",
              f"sum by (namespace, pod) (increase({series('vllm:num_preemptions')}{sel}"
              f"[{LATENCY_WINDOW}])) > 0",
              "5m", "warning",
              "vLLM on {{ $labels.pod }} preempts requests",
              "The KV cache ran out: preempted requests are recomputed, which shows up as "
              "latency spikes, never as errors."),
        _rule("KimiK3GpuCountLow",
              f"count by ({dcgm_ns}, {dcgm_pod}) ({series('DCGM_FI_DEV_GPU_UTIL')}{dcgm_sel})"
              f" < {gpus}",
              "5m", "critical",
              f"Fewer than {gpus} GPUs report for {{{{ $labels.{dcgm_pod} }}}}",
              f"A replica runs tensor parallel across all {gpus} GPUs of its node; DCGM now "
              "reports fewer (a GPU fell off the bus or has an XID error). Needs "
              "dcgm-exporter with pod attribution; silent without it."),
        _rule("KimiK3NodeGpusUnallocatable",
              f"({series('kube_node_status_allocatable')}{{resource=\"nvidia_com_gpu\"}} < {gpus})"
              f" and on (node) {series('kube_pod_info')}{sel}",
              "5m", "critical",
              f"Node {{{{ $labels.node }}}} of a serving pod has fewer than {gpus} healthy GPUs",
              "The NVIDIA device plugin marked a GPU unhealthy: the replica cannot restart on "
              "this node until it is repaired or replaced."),
    ]


def prometheus_rule(plan: ServingPlan, cfg: StackConfig, names: naming.ServingNames,
                    instance: str) -> dict:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": names.base, "namespace": names.namespace,
                         "labels": {**naming.labels(instance, "metrics"), **cfg.monitoring.labels}},
            "spec": {"groups": [{"name": RULE_GROUP,
                                 "rules": alert_rules(plan, cfg, names)}]}}


def monitoring_objects(plan: ServingPlan, cfg: StackConfig, names: naming.ServingNames,
                       instance: str) -> list[dict]:
    """What k3:monitoring asks for (the dashboard is in dashboard.py)."""
    out: list[dict] = []
    if cfg.monitoring.service_monitor:
        out += [metrics_service(names, instance, cfg.serving.metrics_port),
                service_monitor(cfg, names, instance)]
    if cfg.monitoring.prometheus_rule:
        out.append(prometheus_rule(plan, cfg, names, instance))
    return out
