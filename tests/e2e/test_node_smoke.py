"""The node tier's own checks, before any k3infra object: the node is Ready with the
extended GPU resource, a pod from the loopback registry runs by digest as a non-root
user under the `restricted` Pod Security level, a ClusterIP Service answers through
kube-proxy, and CoreDNS resolves the Service's name from inside a pod.

The proxy image (Debian's nginx) serves as the workload: nginx answering on a Service is
what the serving pods' proxy does too.
"""
from __future__ import annotations

import time
import urllib.request

import pytest

from node import GPU_RESOURCE, GPUS, node_fixture, wait_for

pytest_plugins = ["apiserver"]
pytestmark = [pytest.mark.e2e, pytest.mark.node]

PRODUCT = "K3E2E-CPU"
node = node_fixture(PRODUCT, images=("proxy",))

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
