"""NetworkPolicies: default-deny ingress to the serving pods except the API port from the
configured sources; egress DNS only (plus the Hub for the prefetch Job and for node-local
serving pods). Checked on the builder and on the real render, whose pods they must select."""
from __future__ import annotations

import json

import pytest

from k3infra.config import ConfigError, parse_stack_config
from k3infra.receipt import load_receipt
from k3infra.operations import network as n
from k3infra.serving import manifests as m

from conftest import GOOD_REVISION, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
IMAGE = "registry.example.com/k3/vllm@sha256:" + "1" * 64
NAMES = m.ServingNames(m.APP, "k3")


def cfg(**keys):
    raw = {"k3:weightsRevision": GOOD_REVISION, "k3:apiKey": "x", "k3:engineImage": IMAGE}
    raw.update({f"k3:{k}": (json.dumps(v) if isinstance(v, (dict, list)) else v)
                for k, v in keys.items()})
    return parse_stack_config(raw, receipt=load_receipt())


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_default_render_contains_both_policies():
    r = render("existing", PIN)
    serving = manifest(r, "NetworkPolicy", "kimi-k3-serving")
    prefetch = manifest(r, "NetworkPolicy", "kimi-k3-weights-prefetch")
    assert serving["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert prefetch["spec"]["policyTypes"] == ["Ingress", "Egress"]


def test_serving_policy_selects_the_statefulset_pods_and_only_them():
    r = render("existing", PIN)
    policy = manifest(r, "NetworkPolicy", "kimi-k3-serving")["spec"]["podSelector"]
    sts_pod = manifest(r, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    job_pod = manifest(r, "Job", "kimi-k3-weights-prefetch")["spec"]["template"]["metadata"]["labels"]
    assert matches(policy, sts_pod)
    assert not matches(policy, job_pod)


def test_prefetch_policy_selects_the_job_pods_and_only_them():
    r = render("existing", PIN)
    policy = manifest(r, "NetworkPolicy", "kimi-k3-weights-prefetch")["spec"]["podSelector"]
    assert matches(policy, manifest(r, "Job", "kimi-k3-weights-prefetch")["spec"]["template"]["metadata"]["labels"])
    assert not matches(policy, manifest(r, "StatefulSet")["spec"]["template"]["metadata"]["labels"])


def test_only_the_proxys_api_and_metrics_ports_are_opened():
    r = render("existing", PIN, 'serving={"port": 8080}', 'network={"allowFromNamespaces": ["gw"]}')
    ingress = manifest(r, "NetworkPolicy", "kimi-k3-serving")["spec"]["ingress"]
    pod = manifest(r, "StatefulSet")["spec"]["template"]["spec"]
    assert [rule["ports"] for rule in ingress] == [[{"port": 8080, "protocol": "TCP"}],
                                                   [{"port": 9090, "protocol": "TCP"}]]
    proxy = next(c for c in pod["containers"] if c["name"] == "proxy")
    assert {p["name"]: p["containerPort"] for p in proxy["ports"]} == {
        "http": 8080, "metrics": 9090, "health": 8081}
    # vLLM listens on loopback: no container port, no rule for it or the health port
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert "ports" not in vllm


def test_by_default_only_the_scraper_gets_in_and_only_to_the_metrics_port():
    """Issue 21: the monitoring namespace was admitted to the API port (where /metrics
    also lived); now it reaches the proxy's metrics port and nothing else."""
    (rule,) = n.serving_policy(cfg(), NAMES, "k3")["spec"]["ingress"]
    assert rule == {"from": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}],
        "ports": [{"port": 9090, "protocol": "TCP"}]}


def test_configured_namespaces_and_labels_are_the_only_other_sources():
    c = cfg(network={"allowFromNamespaces": ["ingress-nginx", "gateway"],
                     "allowFromPodLabels": {"k3.example.com/client": "true"},
                     "scraperNamespace": "observability",
                     "scraperPodLabels": {"app.kubernetes.io/name": "prometheus"}})
    api, metrics = n.serving_policy(c, NAMES, "k3")["spec"]["ingress"]
    assert api["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}},
        {"podSelector": {"matchLabels": {"k3.example.com/client": "true"}}},
    ]
    assert api["ports"] == [{"port": 8000, "protocol": "TCP"}]
    # one peer with both selectors: pods with these labels IN that namespace
    assert metrics == {"from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
        "ports": [{"port": 9090, "protocol": "TCP"}]}


def test_labelled_clients_get_egress_to_dns_and_the_api_port_only():
    """The namespace's default deny leaves pods no egress: without this policy the serving
    policy's allowFromPodLabels rule admitted nobody (found by the enforced probes of
    tests/e2e/test_node_smoke.py: the labelled client's connection never opened)."""
    r = render("existing", PIN, 'network={"allowFromPodLabels": {"k3.example.com/client": "true"}}')
    assert manifest(r, "NetworkPolicy", "kimi-k3-clients")["spec"] == {
        "podSelector": {"matchLabels": {"k3.example.com/client": "true"}},
        "policyTypes": ["Egress"],
        "egress": [
            {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
             "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
            {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": "serving",
                                                     "app.kubernetes.io/instance": "kimi-k3",
                                                     "app.kubernetes.io/name": "kimi-k3"}}}],
             "ports": [{"port": 8000, "protocol": "TCP"}]}]}
    assert not [x for x in render("existing", PIN).manifests()
                if x["kind"] == "NetworkPolicy" and x["metadata"]["name"] == "kimi-k3-clients"]


def test_no_source_means_no_ingress_rule_at_all():
    spec = n.serving_policy(cfg(network={"scraperNamespace": None}), NAMES, "k3")["spec"]
    assert spec["ingress"] == [] and "Ingress" in spec["policyTypes"]


def test_benchmark_pods_are_let_in_only_when_the_benchmark_is_enabled():
    def pod_peers(r):
        ingress = manifest(r, "NetworkPolicy", "kimi-k3-serving")["spec"]["ingress"][0]["from"]
        return [p["podSelector"] for p in ingress if set(p) == {"podSelector"}]

    def bench_pod(r):
        return next(x for x in r.manifests() if x["kind"] == "Job" and x["spec"]["template"]
                    ["metadata"]["labels"]["app.kubernetes.io/component"] == "benchmark"
                    )["spec"]["template"]["metadata"]["labels"]

    assert pod_peers(render("existing", PIN)) == []
    r = render("existing", PIN, 'benchmark={"enabled": true}')
    assert [matches(p, bench_pod(r)) for p in pod_peers(r)] == [True]


def test_serving_egress_is_dns_only_in_shared_mode():
    egress = n.serving_policy(cfg(), NAMES, "k3")["spec"]["egress"]
    assert egress == [n.dns_egress(cfg())]
    ports = {(p["port"], p["protocol"]) for p in egress[0]["ports"]}
    assert ports == {(53, "UDP"), (53, "TCP")}
    assert egress[0]["to"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "kube-system"}}}]


def test_node_local_serving_pods_reach_no_hub_either():
    """Only the per-node prefetch Jobs fetch; the serving pods hold no HF token (issue 21)."""
    c = cfg(weights={"mode": "node-local"}, nodePool={"provider": "existing", "localNvmeGB": 30400})
    egress = n.serving_policy(c, NAMES, "k3")["spec"]["egress"]
    assert egress == [n.dns_egress(c)]


def test_prefetch_job_gets_no_ingress_and_reaches_dns_and_the_hub_on_https():
    spec = n.prefetch_policy(cfg(), NAMES, "k3")["spec"]
    assert spec["ingress"] == []
    dns, hub = spec["egress"]
    assert dns == n.dns_egress(cfg())
    assert hub["ports"] == [{"port": 443, "protocol": "TCP"}]
    # Issue 21: "the Hub" is never a pod, a Service, a node or the metadata service.
    assert hub["to"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12",
                                                     "192.168.0.0/16", "100.64.0.0/10",
                                                     "169.254.0.0/16"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}}]


def test_cluster_cidrs_are_configurable_and_link_local_always_cut():
    c = cfg(network={"clusterCidrs": ["203.0.113.0/24"]})
    _, hub = n.prefetch_policy(c, NAMES, "k3")["spec"]["egress"]
    assert hub["to"][0]["ipBlock"]["except"] == ["203.0.113.0/24", "169.254.0.0/16"]
    assert hub["to"][1]["ipBlock"]["except"] == ["fe80::/10"]


def test_every_namespace_the_stack_creates_starts_from_default_deny():
    r = render("existing", PIN)
    deny = manifest(r, "NetworkPolicy", "kimi-k3-default-deny")
    assert deny["metadata"]["namespace"] == "kimi-k3"
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                            "ingress": [], "egress": []}


def test_hub_and_dns_destinations_are_configurable():
    c = cfg(network={"hubCidrs": ["10.20.0.0/16"], "hubPorts": [3128],
                     "dnsCidrs": ["169.254.20.10/32"], "dnsNamespace": "dns"})
    dns, hub = n.prefetch_policy(c, NAMES, "k3")["spec"]["egress"]
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "dns"}}}, {"ipBlock": {"cidr": "169.254.20.10/32"}}]
    assert hub == {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
                   "ports": [{"port": 3128, "protocol": "TCP"}]}


@pytest.mark.parametrize("network,key", [
    ({"allowFromNamespaces": ["Not_A_Namespace"]}, "k3:network.allowFromNamespaces"),
    ({"allowFromPodLabels": {"app": "has space"}}, "k3:network.allowFromPodLabels"),
    ({"hubCidrs": ["10.0.0.1/8"]}, "k3:network.hubCidrs"),
    ({"hubCidrs": []}, "k3:network.hubCidrs"),
    ({"hubPorts": [70000]}, "k3:network.hubPorts"),
    ({"dnsCidrs": ["dns.example.com"]}, "k3:network.dnsCidrs"),
    ({"allowFrom": ["x"]}, "k3:network.allowFrom"),
])
def test_bad_network_settings_are_refused_naming_the_key(network, key):
    with pytest.raises(ConfigError) as exc:
        cfg(network=network)
    assert exc.value.key == key


# ---- link-local (the instance metadata service) through a CIDR a user lists -------------

METADATA_CUT = ["169.254.0.0/16"]


def test_a_user_cidr_that_contains_link_local_renders_with_it_cut_out():
    """Issue 48: 169.0.0.0/8 as k3:network.hubCidrs opened 169.254.169.254 to the prefetch;
    the rendered block now carries the link-local range in its `except`."""
    r = render("existing", PIN, 'network={"hubCidrs": ["169.0.0.0/8", "::/0"], '
               '"clusterCidrs": ["10.0.0.0/8"]}')
    hub = manifest(r, "NetworkPolicy", "kimi-k3-weights-prefetch")["spec"]["egress"][1]
    assert hub["to"] == [{"ipBlock": {"cidr": "169.0.0.0/8", "except": METADATA_CUT}},
                         {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}}]


def test_the_pickers_api_server_cidrs_never_reach_link_local():
    """The endpoint picker's API server rule took its CIDRs as typed: 0.0.0.0/0 there
    reached the metadata service. The cluster's own ranges stay (the API server is one)."""
    r = render("existing", "gateway.enabled=true", "gateway.className=eg", "replicas=3",
               'gateway.apiServerCidrs=["0.0.0.0/0", "10.0.0.1/32"]')
    api = manifest(r, "NetworkPolicy", "kimi-k3-epp")["spec"]["egress"][2]
    assert api["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0", "except": METADATA_CUT}},
                         {"ipBlock": {"cidr": "10.0.0.1/32"}}]


@pytest.mark.parametrize("cidr, cut", [
    ("0.0.0.0/0", ["169.254.0.0/16"]), ("169.0.0.0/8", ["169.254.0.0/16"]),
    ("::/0", ["fe80::/10"]), ("fe80::/9", ["fe80::/10"]), ("10.0.0.0/8", None),
    ("169.255.0.0/16", None),
])
def test_ip_peers_cut_every_link_local_range_a_block_contains(cidr, cut):
    from k3infra.netpol import ip_peers

    assert ip_peers([cidr]) == [{"ipBlock": {"cidr": cidr, **({"except": cut} if cut else {})}}]


@pytest.mark.parametrize("keys, key", [
    ({"network": {"hubCidrs": ["169.254.169.254/32"]}}, "k3:network.hubCidrs"),
    ({"network": {"hubCidrs": ["169.254.0.0/16"]}}, "k3:network.hubCidrs"),
    ({"network": {"hubCidrs": ["fe80::/64"]}}, "k3:network.hubCidrs"),
    ({"network": {"clusterCidrs": ["169.254.0.0/17"]}}, "k3:network.clusterCidrs"),
    ({"gateway": {"apiServerCidrs": ["169.254.169.254/32"]}}, "k3:gateway.apiServerCidrs"),
    ({"gateway": {"proxyCidrs": ["169.254.1.0/24"]}}, "k3:gateway.proxyCidrs"),
    ({"engine": {"registryCidrs": ["169.254.169.254/32"]}}, "k3:engine.registryCidrs"),
    ({"engine": {"apiServerCidrs": ["169.254.169.254/32"]}}, "k3:engine.apiServerCidrs"),
    ({"weights": {"store": {"url": "s3://weights/m", "cidrs": ["169.254.169.254/32"]}}},
     "k3:weights.store.cidrs"),
])
def test_a_user_cidr_inside_link_local_is_refused_in_one_line(keys, key):
    with pytest.raises(ConfigError) as exc:
        cfg(**keys)
    assert exc.value.key == key
    text = str(exc.value)
    assert len(text.splitlines()) == 1 and text.startswith(f"{key} = '"), text
    assert ": lies inside the link-local " in text
    assert "accepted: a CIDR outside 169.254.0.0/16 and fe80::/10" in text


def test_nodelocal_dns_is_the_one_link_local_cidr_accepted():
    c = cfg(network={"dnsCidrs": ["169.254.20.10/32"]})
    assert {"ipBlock": {"cidr": "169.254.20.10/32"}} in n.dns_egress(c)["to"]
    assert n.dns_egress(c)["ports"] == [{"port": 53, "protocol": "UDP"},
                                        {"port": 53, "protocol": "TCP"}]


def test_benchmark_pods_get_policies_only_when_the_benchmark_is_enabled():
    assert [p["metadata"]["name"] for p in n.network_policies(cfg(), NAMES, "k3")] == \
        ["kimi-k3-default-deny", "kimi-k3-serving", "kimi-k3-weights-prefetch"]
    r = render("existing", PIN, 'benchmark={"enabled": true}')
    job = next(x for x in r.manifests() if x["kind"] == "Job"
               and x["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
               == "benchmark")
    bench = manifest(r, "NetworkPolicy", "kimi-k3-benchmark")["spec"]
    assert matches(bench["podSelector"], job["spec"]["template"]["metadata"]["labels"])
    assert bench["ingress"] == []
    dns, to_serving = bench["egress"]
    assert dns == n.dns_egress(cfg())
    sts_pod = manifest(r, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    (peer,) = to_serving["to"]
    assert matches(peer["podSelector"], sts_pod)
    assert to_serving["ports"] == [{"port": 8000, "protocol": "TCP"}]


def test_the_bench_reader_pod_gets_no_network_at_all():
    from k3infra.bench import manifests as b

    pod = b.reader_pod("kimi-k3-bench-reader", "k3", "kimi-k3-bench-results",
                       "img@sha256:" + "1" * 64, {})
    r = render("existing", PIN, 'benchmark={"enabled": true}')
    reader = manifest(r, "NetworkPolicy", "kimi-k3-benchmark-reader")["spec"]
    assert matches(reader["podSelector"], pod["metadata"]["labels"])
    assert reader["ingress"] == [] and reader["egress"] == []
    assert reader["policyTypes"] == ["Ingress", "Egress"]


def test_weights_audit_pods_are_left_to_the_default_deny():
    r = render("existing", PIN)
    cron = manifest(r, "CronJob", "kimi-k3-audit")
    labels = cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    selecting = [p["metadata"]["name"] for p in r.manifests() if p["kind"] == "NetworkPolicy"
                 and p["metadata"]["namespace"] == cron["metadata"]["namespace"]
                 and matches({"matchLabels": {}, **p["spec"]["podSelector"]}, labels)]
    assert selecting == ["kimi-k3-default-deny"]
