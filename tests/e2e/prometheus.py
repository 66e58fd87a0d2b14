"""A real Prometheus for the node tier: it scrapes the targets of the rendered
ServiceMonitor, evaluates the rendered PrometheusRule, and answers PromQL, so a test can
show each rule's series, the alerts' states and the dashboard's queries on what a real
engine exports.

Debian's `prometheus` 2.42 (with promtool; .ci/run installs it): a package, not a build
(a Prometheus from its Go module would add minutes to a cold CI for the same engine).

What differs from the Prometheus Operator, and why (listed in docs/e2e.md):
- no Operator, and no Kubernetes service discovery: Debian builds Prometheus without it
  ("field kubernetes_sd_configs not found"). The harness discovers what the Operator's
  generated job would (`Discovery`): the Services in the ServiceMonitor's namespaces
  with its matchLabels, their EndpointSlices, the endpoint port of its name, every
  endpoint (ready or not, as the endpointslice role does), with the target labels the
  Operator sets (`namespace`, `service`, `pod`, `container`, `endpoint`, `job` the
  Service's name); it writes them to a file_sd file each second, so a rollout's new pod
  IPs are scraped as they appear. Only the fields k3infra renders are translated
  (matchLabels, namespaceSelector.matchNames, endpoints' port, path, scheme, timeout);
  the PrometheusRule's groups are loaded as they are;
- Prometheus runs as a process of the node (inside the test's network namespace, on the
  node's address), not as a pod of the scraper's namespace: its scrapes come from the
  node, which NetworkPolicies never hold (the scraper namespace's access is probed from
  a pod, tests/e2e/policy_probes.py);
- the scrape and evaluation intervals are `interval` (default 2 s), not the
  ServiceMonitor's, so a test sees series within seconds; rule windows and `for` are
  unchanged (an alert whose expression holds is `pending` until its `for` has passed:
  tests/test_operations_promtool.py tests the `for`s), but where a test edits its copy
  and says so (the stack module's p99 alert, `for` 2 s, to be seen firing).

    with prometheus.run(workdir, node.ip, node.cluster, [service_monitor],
                        [prometheus_rule]) as prom:
        prom.wait_for_targets(1)
        for alert, selector, count in prom.rule_series(prometheus_rule): ...
        prom.alert_states()   # {"KimiK3EngineDown": "pending", ...}
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import promql_parser
import yaml

from apiserver import Cluster, _free_port
from node import wait_for

PROMETHEUS = shutil.which("prometheus")
START_TIMEOUT_S = 60.0
DISCOVERY_PERIOD_S = 1.0


def scrape_config(monitor: dict, sd_dir: Path, interval: str) -> list[dict]:
    """The scrape jobs of a ServiceMonitor, one per endpoint, each reading its targets
    from the file `Discovery` writes for it."""
    meta = monitor["metadata"]
    jobs = []
    for i, endpoint in enumerate(monitor["spec"]["endpoints"]):
        timeout = endpoint.get("scrapeTimeout", interval)
        jobs.append({
            "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}",
            "scrape_interval": interval,
            # Prometheus refuses a timeout above the interval: the shorter of the two.
            "scrape_timeout": min(timeout, interval, key=_seconds),
            "metrics_path": endpoint.get("path", "/metrics"),
            "scheme": endpoint.get("scheme", "http"),
            "file_sd_configs": [{"files": [str(sd_file(sd_dir, monitor, i))]}],
        })
    return jobs


def sd_file(sd_dir: Path, monitor: dict, index: int) -> Path:
    meta = monitor["metadata"]
    return sd_dir / f"{meta['namespace']}-{meta['name']}-{index}.json"


def targets(core, monitor: dict, index: int) -> list[dict]:
    """The file_sd groups the Operator's job for endpoint `index` of `monitor` would
    scrape now: one per endpoint of each selected Service's EndpointSlices."""
    spec = monitor["spec"]
    endpoint = spec["endpoints"][index]
    selector = ",".join(f"{k}={v}" for k, v in spec["selector"]["matchLabels"].items())
    from kubernetes import client

    groups = []
    for ns in spec["namespaceSelector"]["matchNames"]:
        for svc in core.list_namespaced_service(ns, label_selector=selector).items:
            slices = client.DiscoveryV1Api(core.api_client).list_namespaced_endpoint_slice(
                ns, label_selector=f"kubernetes.io/service-name={svc.metadata.name}").items
            for sl in slices:
                port = next((p.port for p in sl.ports or [] if p.name == endpoint["port"]), None)
                if port is None:
                    continue
                for ep in sl.endpoints or []:
                    pod = ep.target_ref.name if ep.target_ref and ep.target_ref.kind == "Pod" else ""
                    for address in ep.addresses:
                        groups.append({"targets": [f"{address}:{port}"], "labels": {
                            "namespace": ns, "service": svc.metadata.name, "pod": pod,
                            "container": _container(core, ns, pod, port),
                            "endpoint": endpoint["port"], "job": svc.metadata.name}})
    return sorted(groups, key=lambda g: g["targets"])


def _container(core, namespace: str, pod: str, port: int) -> str:
    """The container that declares `port` (the Operator's `container` label)."""
    if not pod:
        return ""
    from kubernetes.client.exceptions import ApiException

    try:
        spec = core.read_namespaced_pod(pod, namespace).spec
    except ApiException:
        return ""
    return next((c.name for c in spec.containers
                 for p in c.ports or [] if p.container_port == port), "")


class Discovery:
    """Rewrites every monitor's file_sd files each DISCOVERY_PERIOD_S while running
    (atomically: Prometheus watches the files)."""

    def __init__(self, cluster: Cluster, monitors: list[dict], sd_dir: Path) -> None:
        self.cluster, self.monitors, self.sd_dir = cluster, monitors, sd_dir
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.error: Exception | None = None

    def refresh(self) -> None:
        from kubernetes import client

        with self.cluster.api_client() as api:
            core = client.CoreV1Api(api)
            for monitor in self.monitors:
                for i in range(len(monitor["spec"]["endpoints"])):
                    path = sd_file(self.sd_dir, monitor, i)
                    text = json.dumps(targets(core, monitor, i), indent=1)
                    if not path.exists() or path.read_text() != text:
                        tmp = path.with_suffix(".tmp")
                        tmp.write_text(text)
                        os.replace(tmp, path)

    def _loop(self) -> None:
        while not self._stop.wait(DISCOVERY_PERIOD_S):
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - kept for the test to see
                self.error = exc

    def __enter__(self) -> "Discovery":
        self.sd_dir.mkdir(parents=True, exist_ok=True)
        self.refresh()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _seconds(duration: str) -> float:
    return float(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


def rule_file(rule: dict) -> dict:
    return {"groups": rule["spec"]["groups"]}


def selectors(expr: str) -> list[str]:
    """The vector selectors of a PromQL expression (the parsed syntax tree), as PromQL."""
    found: list[str] = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.append(str(node))
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def dashboard_queries(board: dict, namespace: str, pods: str,
                      rate_interval: str = "1m") -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL) of every panel query of a Grafana dashboard, with the
    variables substituted as Grafana does before a query reaches Prometheus (`pods` a
    regex: a multi-value variable becomes an alternation)."""
    values = {"$__rate_interval": rate_interval, "$namespace": namespace, "$pod": pods}
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in values.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], target["refId"], expr))
    return out


@dataclass
class Prometheus:
    url: str
    workdir: Path

    def api(self, path: str, **params: str) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """The instant vector `expr` evaluates to now (a list of {metric, value})."""
        data = self.api("query", query=expr)
        return data["result"] if data["resultType"] == "vector" else [data["result"]]

    def targets(self) -> list[dict]:
        return self.api("targets")["activeTargets"]

    def wait_for_targets(self, count: int, timeout: float = 60.0) -> list[dict]:
        """Until `count` targets were scraped successfully (health "up")."""
        deadline = time.monotonic() + timeout
        while True:
            up = [t for t in self.targets() if t["health"] == "up"]
            if len(up) >= count:
                return up
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(up)} of {count} targets up after {timeout:.0f} s: "
                                     f"{self.targets()}")
            time.sleep(1)

    def alert_states(self) -> dict[str, str]:
        """Each loaded alerting rule's state: inactive, pending or firing."""
        return {r["name"]: r["state"] for g in self.api("rules", type="alert")["groups"]
                for r in g["rules"]}

    def rule_series(self, rule: dict) -> list[tuple[str, str, int]]:
        """(alert, selector, series count) for every vector selector of every rule of a
        PrometheusRule: which of the metrics each rule reads exist, with its labels."""
        out = []
        for group in rule["spec"]["groups"]:
            for r in group["rules"]:
                name = r.get("alert") or r.get("record")
                out += [(name, sel, len(self.query(sel))) for sel in selectors(r["expr"])]
        return out


@contextlib.contextmanager
def run(workdir: Path, host: str, cluster: Cluster, monitors: list[dict], rules: list[dict],
        interval: str = "2s") -> Iterator[Prometheus]:
    """Prometheus on `host` (a free port) with the scrape jobs of `monitors` (their targets
    discovered through `cluster`'s API) and the groups of `rules`; stopped (and its data
    removed) on exit."""
    if not PROMETHEUS:
        raise RuntimeError("prometheus is not installed (Debian: apt-get install prometheus; "
                           ".ci/run installs it)")
    workdir.mkdir(parents=True, exist_ok=True)
    rule_files = []
    for i, rule in enumerate(rules):
        path = workdir / f"rules-{i}.yaml"
        path.write_text(yaml.safe_dump(rule_file(rule), sort_keys=False))
        rule_files.append(str(path))
    sd_dir = workdir / "targets"
    config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
              "rule_files": rule_files,
              "scrape_configs": [job for m in monitors for job in scrape_config(m, sd_dir, interval)]}
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = _free_port()
    with Discovery(cluster, monitors, sd_dir), open(workdir / "prometheus.log", "ab") as log:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address={host}:{port}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
            start_new_session=True)
        prom = Prometheus(f"http://{host}:{port}", workdir)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"prometheus exited {proc.returncode}:\n"
                                       + (workdir / "prometheus.log").read_text()[-3000:])
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2):
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"prometheus not ready after {START_TIMEOUT_S:.0f} s")
                time.sleep(0.5)
            yield prom
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            shutil.rmtree(workdir / "data", ignore_errors=True)


# Read by no exporter that runs on the node (kube-state-metrics, dcgm-exporter).
EXPORTER_SERIES = {"kube_pod_container_state_started", "kube_pod_status_ready",
                   "kube_pod_container_status_restarts_total", "DCGM_FI_DEV_GPU_UTIL",
                   "kube_node_status_allocatable", "kube_pod_info"}


def check_rules_and_dashboard(prom: "Prometheus", rule: dict, namespace: str, pods: str,
                              dashboard: Path) -> None:
    """After three scrapes of `namespace`: every rule's vLLM and `up` selectors return
    series and only the exporters' none; every alert turns inactive (absent(up) holds at
    an evaluation before the first scrape); every dashboard query returns data but the
    cold-start panel's two (kube-state-metrics alone). Printed as it goes."""
    wait_for("three scrapes", lambda: prom.query(
        f'count_over_time(up{{namespace="{namespace}"}}[1m]) >= 3'), timeout=60)
    report = prom.rule_series(rule)
    for alert, selector, count in report:
        print(f"  {alert}: {selector} -> {count} series")
    vllm_or_up = [(a, sel, n) for a, sel, n in report if sel.startswith(("vllm:", "up{"))]
    assert vllm_or_up and all(n > 0 for _a, _s, n in vllm_or_up), vllm_or_up
    assert {sel.split("{")[0] for _a, sel, n in report if n == 0} <= EXPORTER_SERIES
    states = wait_for("every alert inactive", lambda: (
        lambda st: st if set(st.values()) == {"inactive"} else None)(prom.alert_states()),
        timeout=60)
    print(f"  alert states: {states}")
    board = json.loads(dashboard.read_text())
    empty = []
    for title, ref, expr in dashboard_queries(board, namespace, pods):
        count = len(prom.query(expr))
        print(f"  dashboard {title!r} {ref}: {count} series")
        if count == 0:
            empty.append(title)
    assert empty == ["Cold start: time to Ready", "Cold start: time to Ready"], empty
