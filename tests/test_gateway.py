"""The inference gateway (k3:gateway) and queue-depth autoscaling (k3:autoscaling) in an
offline render: the objects, the serving pods' front door, the refusals, the warnings."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from k3infra.cli import main
from k3infra.config import ConfigError
from k3infra.policies.runner import check_plan

from conftest import manifest, render

ROOT = Path(__file__).resolve().parent.parent
GW = ("gateway.enabled=true", "gateway.className=eg", "replicas=3")
GATE_PEER = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kimi-k3",
                                             "app.kubernetes.io/instance": "kimi-k3",
                                             "app.kubernetes.io/component": "rollout-gate"}}}
SCALING = 'autoscaling={"enabled": true, "min": 2, "max": 4, "prometheusUrl": "http://prometheus.monitoring.svc:9090"}'
SERVING_SELECTOR = {"app.kubernetes.io/name": "kimi-k3", "app.kubernetes.io/instance": "kimi-k3",
                    "app.kubernetes.io/component": "serving"}


@pytest.fixture(scope="module")
def gw():
    return render("existing", *GW)


def kinds(r) -> list[str]:
    return [m["kind"] for m in r.manifests()]


def test_off_by_default():
    r = render("existing")
    assert not {"InferencePool", "Gateway", "HTTPRoute", "SecurityPolicy", "Deployment",
                "ScaledObject"} & set(kinds(r))
    assert manifest(r, "StatefulSet")["spec"]["replicas"] == 1


def test_inference_pool_selects_the_serving_pods_on_the_proxy_port(gw):
    pool = manifest(gw, "InferencePool", "kimi-k3")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"] == {"selector": {"matchLabels": SERVING_SELECTOR},
                            "targetPorts": [{"number": 8000}],
                            "endpointPickerRef": {"kind": "Service", "name": "kimi-k3-epp",
                                                  "port": {"number": 9002},
                                                  "failureMode": "FailOpen"}}
    sts = manifest(gw, "StatefulSet")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["selector"]["matchLabels"] == SERVING_SELECTOR


def test_endpoint_picker_is_configured_for_prefix_and_queue_scoring(gw):
    config = yaml.safe_load(manifest(gw, "ConfigMap", "kimi-k3-epp")["data"]["epp.yaml"])
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    assert config["schedulingProfiles"] == [{"name": "default", "plugins": [
        {"pluginRef": "queue-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        {"pluginRef": "prefix-cache-scorer", "weight": 3}]}]
    source = next(p for p in config["plugins"] if p["type"] == "metrics-data-source")
    assert source["parameters"] == {"scheme": "http", "path": "/metrics", "port": 9090}

    dep = manifest(gw, "Deployment", "kimi-k3-epp")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0@sha256:" + "0" * 64
    args = c["args"]
    assert args[args.index("--pool-name") + 1] == "kimi-k3"
    assert args[args.index("--pool-namespace") + 1] == "kimi-k3"
    assert args[args.index("--config-file") + 1] == "/config/epp.yaml"
    assert pod["serviceAccountName"] == "kimi-k3-epp"
    assert c["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    svc = manifest(gw, "Service", "kimi-k3-epp")
    assert svc["spec"]["ports"] == [{"name": "grpc-ext-proc", "port": 9002, "targetPort": 9002,
                                     "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"}]
    role = manifest(gw, "Role", "kimi-k3-epp")
    assert all(r["verbs"] == ["get", "watch", "list"] for r in role["rules"])


def test_gateway_and_route_pass_only_the_openai_routes(gw):
    g = manifest(gw, "Gateway", "kimi-k3")
    assert g["spec"] == {"gatewayClassName": "eg", "listeners": [{
        "name": "http", "protocol": "HTTP", "port": 80,
        "allowedRoutes": {"namespaces": {"from": "Same"},
                          "kinds": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}]}}]}
    route = manifest(gw, "HTTPRoute", "kimi-k3")
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [
        {"path": {"type": "Exact", "value": "/v1/chat/completions"}, "method": "POST"},
        {"path": {"type": "Exact", "value": "/v1/completions"}, "method": "POST"},
        {"path": {"type": "Exact", "value": "/v1/models"}, "method": "GET"}]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io",
                                    "kind": "InferencePool", "name": "kimi-k3"}]
    assert rule["timeouts"] == {"request": "3600s"}


def test_https_listener_with_a_tls_secret():
    r = render("existing", *GW, "gateway.tlsSecret=kimi-tls", "gateway.port=443")
    (listener,) = manifest(r, "Gateway")["spec"]["listeners"]
    assert listener["protocol"] == "HTTPS" and listener["port"] == 443
    assert listener["tls"] == {"mode": "Terminate",
                               "certificateRefs": [{"kind": "Secret", "name": "kimi-tls"}]}


def test_key_policy_reads_its_own_secret_of_the_same_key(gw):
    pol = manifest(gw, "SecurityPolicy", "kimi-k3-gateway-key")
    assert pol["apiVersion"] == "gateway.envoyproxy.io/v1alpha1"
    assert pol["spec"] == {
        "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "kimi-k3"}],
        "apiKeyAuth": {"credentialRefs": [{"group": "", "kind": "Secret",
                                           "name": "kimi-k3-gateway-keys"}],
                       "extractFrom": [{"headers": ["Authorization"]}]}}
    keys = manifest(gw, "Secret", "kimi-k3-gateway-keys")
    assert keys["stringData"] == {"k3infra": "[secret]"}
    # The route is created only after the key policy.
    urns = {r["name"]: r["urn"] for r in gw.resources}
    route = next(r for r in gw.resources if r["name"] == "kimi-k3-gateway-route")
    assert urns["kimi-k3-gateway-key-policy"] in route["dependsOn"]


def test_other_implementations_render_no_key_policy_and_say_so():
    r = render("existing", *GW, "gateway.implementation=istio")
    assert "SecurityPolicy" not in kinds(r)
    assert any(w.startswith("k3:gateway.implementation: istio: k3infra renders no gateway key "
                            "policy") for w in r.warnings)


def _serving_policy(r) -> dict:
    return manifest(r, "NetworkPolicy", "kimi-k3-serving")


def test_serving_pods_admit_clients_only_from_the_gateway(gw):
    ingress = _serving_policy(gw)["spec"]["ingress"]
    api = [rule for rule in ingress if rule["ports"] == [{"port": 8000, "protocol": "TCP"}]]
    # The gateway's proxies, and the rollout gate's Job (3 replicas: k3:rollout.gate is on),
    # which benchmarks one canary pod by its own name, never through the gateway.
    assert api == [{"from": [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "envoy-gateway-system"}},
        "podSelector": {"matchLabels": {"gateway.envoyproxy.io/owning-gateway-name": "kimi-k3",
                                        "gateway.envoyproxy.io/owning-gateway-namespace": "kimi-k3"}}},
        GATE_PEER], "ports": [{"port": 8000, "protocol": "TCP"}]}]
    metrics = next(rule for rule in ingress if rule["ports"] == [{"port": 9090, "protocol": "TCP"}])
    assert {"podSelector": {"matchLabels": {**SERVING_SELECTOR,
                                            "app.kubernetes.io/component": "endpoint-picker"}}} \
        in metrics["from"]
    assert manifest(gw, "Service", "kimi-k3")["spec"]["type"] == "ClusterIP"


def test_istio_and_gke_proxy_peers():
    istio = render("existing", *GW, "gateway.implementation=istio")
    api = _serving_policy(istio)["spec"]["ingress"][0]
    assert api["from"] == [{"podSelector": {"matchLabels": {
        "gateway.networking.k8s.io/gateway-name": "kimi-k3"}}}, GATE_PEER]
    gke = render("existing", *GW, "gateway.implementation=gke",
                 'gateway.proxyCidrs=["10.129.0.0/23"]')
    assert _serving_policy(gke)["spec"]["ingress"][0]["from"] == [
        {"ipBlock": {"cidr": "10.129.0.0/23"}}, GATE_PEER]


def test_picker_policy(gw):
    pol = manifest(gw, "NetworkPolicy", "kimi-k3-epp")
    assert pol["spec"]["ingress"][0]["ports"] == [{"port": 9002, "protocol": "TCP"}]
    to_serving = pol["spec"]["egress"][1]
    assert to_serving == {"to": [{"podSelector": {"matchLabels": SERVING_SELECTOR}}],
                          "ports": [{"port": 9090, "protocol": "TCP"}]}
    assert len(pol["spec"]["egress"]) == 2          # no API server CIDRs given: gated
    r = render("existing", *GW, 'gateway.apiServerCidrs=["10.0.0.1/32"]')
    api = manifest(r, "NetworkPolicy", "kimi-k3-epp")["spec"]["egress"][2]
    assert api["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]


def test_placeholders_warn_in_a_render(gw):
    assert any(w.startswith("k3:gateway.eppImage: ghcr.io/llm-d/llm-d-router-endpoint-picker:"
                            "v0.10.0@sha256:0000") for w in gw.warnings)
    assert any(w.startswith("k3:gateway.apiServerCidrs: is empty") for w in gw.warnings)


def test_placeholder_epp_image_is_refused_by_pulumi_up():
    from k3infra.config import parse_stack_config
    from k3infra.gates import GateError, enforce
    from k3infra.gateway.picker import picker_gates
    from k3infra.receipt import load_receipt

    cfg = parse_stack_config({"weightsRevision": "3f1c2b4a5d6e7f8091a2b3c4d5e6f708192a3b4c",
                              "apiKey": "k", "engineImage": "r.example/v@sha256:" + "5e" * 32,
                              "gateway": {"enabled": True, "className": "eg",
                                          "apiServerCidrs": ["10.0.0.1/32"]}},
                             receipt=load_receipt())
    gates = picker_gates(cfg)
    assert [g.key for g in gates] == ["k3:gateway.eppImage"]
    with pytest.raises(GateError, match="k3:gateway.eppImage"):
        enforce(gates, offline_render=False)


@pytest.mark.parametrize("overrides,key", [
    (('gateway={"enabled": true}',), "k3:gateway.className"),
    ((*GW, 'network={"allowFromNamespaces": ["clients"]}'), "k3:network.allowFromNamespaces"),
    ((*GW, "gateway.implementation=gke"), "k3:gateway.proxyCidrs"),
    ((*GW, "gateway.eppImage=ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"), "k3:gateway.eppImage"),
    (('autoscaling={"enabled": true, "prometheusUrl": "http://p:9090"}',), "k3:autoscaling.max"),
    (('autoscaling={"enabled": true, "max": 4}',), "k3:autoscaling.prometheusUrl"),
    (("replicas=2", 'autoscaling={"enabled": true, "min": 1, "max": 4, "prometheusUrl": "http://p:9090"}'),
     "k3:autoscaling.min"),
    (("replicas=5", SCALING), "k3:replicas"),
])
def test_refusals_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as exc:
        render("existing", *overrides)
    assert str(exc.value).startswith(f"{key} = ")


def test_the_issue_command(tmp_path):
    """`k3infra render --config gateway.enabled=true --config replicas=3`, word for word
    (here into tmp_path): render defaults to the existing stack, whose example file names
    the GatewayClass (eg), so nothing else is needed."""
    assert main(["render", "--config", "gateway.enabled=true", "--config", "replicas=3",
                 "--out", str(tmp_path)]) == 0
    names = {p.name for p in (tmp_path / "manifests").iterdir()}
    for expected in ("inferencepool-kimi-k3", "deployment-kimi-k3-epp", "gateway-kimi-k3",
                     "httproute-kimi-k3", "securitypolicy-kimi-k3-gateway-key"):
        assert any(n.endswith(f"-{expected}.yaml") for n in names), expected


def test_gateway_render_passes_the_policy_pack(gw):
    assert check_plan(gw.plan()).mandatory == []


# --- k3:autoscaling ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def scaled():
    return render("existing", "replicas=3", SCALING)


def test_scaled_object_on_queue_depth(scaled):
    so = manifest(scaled, "ScaledObject", "kimi-k3")
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                      "name": "kimi-k3"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 4)
    (trigger,) = spec["triggers"]
    assert trigger == {"type": "prometheus", "metadata": {
        "serverAddress": "http://prometheus.monitoring.svc:9090",
        "query": 'sum(vllm:num_requests_waiting{namespace="kimi-k3", pod=~"kimi-k3-[0-9]+"})',
        "threshold": "4"}}
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    # A new replica's budget is 5890 s (image pull 900 s + the startupProbe's 4990 s,
    # docs/serving.md, docs/coldstart.md); the HPA caps the window at 3600 s.
    assert behavior["scaleDown"] == {"stabilizationWindowSeconds": 3600,
                                     "policies": [{"type": "Pods", "value": 1, "periodSeconds": 1800}]}
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    # The HPA owns the replica count; the PDB still lets one node go at a time.
    assert "replicas" not in manifest(scaled, "StatefulSet")["spec"]
    assert manifest(scaled, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_scaling_cost_warning(scaled):
    text = " ".join(scaled.warnings)
    assert ("k3:autoscaling.max: 4: the autoscaler may run up to 4 replicas, each a whole "
            "8-GPU node (32 GPUs) billed while it runs") in text
    assert "cold start of up to 5890 s" in text
    assert "k3:autoscaling.scaleDownStabilizationSeconds: 3600 s is shorter than the startup " \
           "budget (5890 s) (the HPA's maximum)" in text
    r = render("existing", "replicas=3", SCALING, "monitoring.nodeRateUsdPerHour=98.5")
    assert "about 394 USD/hour at max" in " ".join(r.warnings)


def test_versions_match_the_e2e_crd_pins():
    from k3infra.gateway import versions

    build = (ROOT / "tools/testbed/gatewaycrds/build.sh").read_text()
    pins = set(re.findall(r"^(\S+) (v\S+) \S+\.yaml \S+$", build, re.MULTILINE))
    assert pins == {versions.GATEWAY_API, versions.INFERENCE_EXTENSION, versions.ENVOY_GATEWAY,
                    versions.KEDA}


# --- real validators ----------------------------------------------------------------------

GATEWAY_BUILTINS = {("Deployment", "kimi-k3-epp"), ("Service", "kimi-k3-epp"),
                    ("ConfigMap", "kimi-k3-epp"), ("ServiceAccount", "kimi-k3-epp"),
                    ("Role", "kimi-k3-epp"), ("RoleBinding", "kimi-k3-epp"),
                    ("NetworkPolicy", "kimi-k3-epp"), ("NetworkPolicy", "kimi-k3-serving"),
                    ("Secret", "kimi-k3-gateway-keys")}


def test_builtin_kinds_validate_strictly(gw):
    import kubernetes_validate

    objs = [o for o in gw.manifests() if (o["kind"], o["metadata"]["name"]) in GATEWAY_BUILTINS]
    assert len(objs) == len(GATEWAY_BUILTINS)
    for obj in objs:
        kubernetes_validate.validate(obj, kubernetes_validate.utils.latest_version(), strict=True)


def test_checkov_finds_nothing_on_the_gateway_objects(gw, tmp_path):
    from k3infra.render import write_render
    from test_operations_scan import _scan

    write_render(gw, tmp_path)
    results = _scan(tmp_path / "manifests")
    ours = [f"{c['check_id']} {c['resource']}" for c in results["failed"]
            if "kimi-k3-epp" in c["resource"] or "gateway" in c["resource"]]
    assert ours == []
    passed = {c["check_id"] for c in results["passed"] if "Deployment.kimi-k3.kimi-k3-epp" in c["resource"]}
    assert {"CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_28", "CKV_K8S_43"} <= passed
