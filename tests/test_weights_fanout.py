"""The Hub once per cluster in the render: which copy fills from where (K3_WEIGHTS_SOURCES),
the in-cluster sources (Deployment + Service per serving copy), the Pulumi order and
timeouts, the NetworkPolicy that admits only prefetch pods, and the plan render prints.
Expected figures are literals from the receipt (1561.0 GB) and the stated defaults
(downloadGBps 0.5, clusterGBps 2, storageReadGBps 2)."""
from __future__ import annotations

import pytest

from k3infra.config import ConfigError, parse_stack_config
from k3infra.plan import resolve_plan
from k3infra.receipt import load_receipt
from k3infra.summary import summary_rows

from conftest import GOOD_REVISION, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
NODE_LOCAL = ("weights.mode=node-local",)
SRC0 = "http://kimi-k3-weights-source-0.kimi-k3.svc:8080"
SRC1 = "http://kimi-k3-weights-source-1.kimi-k3.svc:8080"


def rows(r) -> dict:
    receipt = load_receipt()
    cfg = parse_stack_config(r.raw_config, tuple(r.secret_keys), receipt=receipt)
    return dict(summary_rows(cfg, r, resolve_plan(receipt, cfg)))


def sources_of(r, i: int) -> str:
    job = manifest(r, "Job", f"kimi-k3-weights-prefetch-{i}")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    return next(e["value"] for e in c["env"] if e["name"] == "K3_WEIGHTS_SOURCES")


def resource(r, name: str) -> dict:
    (found,) = [x for x in r.resources if x["name"] == name]
    return found


def kinds(r, kind: str) -> list[str]:
    return sorted(m["metadata"]["name"] for m in r.manifests() if m["kind"] == kind)


def test_three_replicas_one_hub_pull_two_in_cluster_fills():
    """The issue's "done when": cluster-then-hub, 3 replicas, node-local."""
    r = render("existing", PIN, *NODE_LOCAL, "replicas=3", "weights.source=cluster-then-hub")
    assert rows(r)["weights fill"] == (
        "k3:weights.source cluster-then-hub: 1 Hub pull(s) (copy 0), 2 in-cluster fill(s): "
        "copy 1 from copy 0 then the Hub, copy 2 from copy 0 then the Hub; expected Hub bytes "
        "1561.0 GB = 1x the tree; every copy from the Hub would be 3x = 4683.0 GB; fill time "
        "for 3 copies ~5464 s at Hub 0.5 GB/s, in-cluster 2 GB/s, source start check 2 GB/s "
        "(every copy from the Hub: ~3122 s, if the Hub gives each node 0.5 GB/s)")
    assert [sources_of(r, i) for i in range(3)] == ["hub", f"{SRC0},hub", f"{SRC0},hub"]
    assert kinds(r, "Deployment") == ["kimi-k3-weights-source-0"]
    svc = manifest(r, "Service", "kimi-k3-weights-source-0")
    dep = manifest(r, "Deployment", "kimi-k3-weights-source-0")
    pod = dep["spec"]["template"]
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items())
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http",
                                     "protocol": "TCP"}]
    claim = next(v for v in pod["spec"]["volumes"] if v["name"] == "weights")
    assert claim["persistentVolumeClaim"] == {"claimName": "weights-kimi-k3-0", "readOnly": True}
    (nginx,) = pod["spec"]["containers"]
    assert nginx["image"].startswith("nginxinc/nginx-unprivileged:")     # k3:serving.proxyImage
    assert all(m["readOnly"] for m in nginx["volumeMounts"] if m["name"] == "weights")
    (check,) = pod["spec"]["initContainers"]
    assert "--require-marker" in check["command"][2] and "gate" in check["command"][2]


def test_default_source_is_cluster_then_hub():
    r = render("existing", PIN, *NODE_LOCAL, "replicas=3")
    assert rows(r)["weights fill"].startswith("k3:weights.source cluster-then-hub: 1 Hub pull(s)")


def test_pulumi_order_first_fill_then_source_then_the_others():
    r = render("existing", PIN, *NODE_LOCAL, "replicas=4")
    job = {i: resource(r, f"kimi-k3-weights-job-{i}") for i in range(4)}
    dep = {i: resource(r, f"kimi-k3-weights-source-{i}") for i in (0, 1)}
    svc = {i: resource(r, f"kimi-k3-weights-source-svc-{i}") for i in (0, 1)}
    sources = {x["urn"] for x in r.resources if "weights-source" in x["name"]}
    assert not sources & set(job[0]["dependsOn"])                 # copy 0: the Hub, first
    assert job[0]["urn"] in dep[0]["dependsOn"]                   # its source once verified
    assert dep[0]["urn"] in svc[0]["dependsOn"]
    for i, parent in ((1, 0), (2, 0), (3, 1)):                    # binary tree: (i - 1) // 2
        assert {dep[parent]["urn"], svc[parent]["urn"]} <= set(job[i]["dependsOn"]), i
    assert job[1]["urn"] in dep[1]["dependsOn"]
    assert [sources_of(r, i) for i in range(4)] == [
        "hub", f"{SRC0},hub", f"{SRC0},hub", f"{SRC1},{SRC0},hub"]
    # Timeouts from size and rates: the Hub's 2 x 1561 GB / 0.5 GB/s + 30 min = 8044 s;
    # cluster-then-hub fills keep the Hub's (the fallback must fit); a source's start
    # re-verifies 1561 GB at 2 GB/s, twice over, + 10 min = 2161 s.
    assert job[0]["customTimeouts"] == {"create": "134m", "update": "134m"}
    assert job[3]["customTimeouts"] == {"create": "134m", "update": "134m"}
    assert dep[0]["customTimeouts"] == {"create": "36m", "update": "36m"}
    # Serving waits for every copy's Job, as before.
    sts = resource(r, "kimi-k3-serving-statefulset")
    assert {job[i]["urn"] for i in range(4)} <= set(sts["dependsOn"])


def test_cluster_only_never_falls_back_to_the_hub_and_its_timeout_follows_the_cluster_rate():
    r = render("existing", PIN, *NODE_LOCAL, "replicas=3", "weights.source=cluster",
               "weights.clusterGBps=4")
    assert [sources_of(r, i) for i in range(3)] == ["hub", SRC0, SRC0]
    # 2 children x 1561 GB / 4 GB/s, twice over, + 30 min = 3361 s
    assert resource(r, "kimi-k3-weights-job-1")["customTimeouts"]["create"] == "56m"
    assert "in-cluster 4 GB/s" in rows(r)["weights fill"]


def test_hub_mode_and_shared_mode_create_no_source():
    r = render("existing", PIN, *NODE_LOCAL, "replicas=3", "weights.source=hub")
    assert kinds(r, "Deployment") == []
    assert [sources_of(r, i) for i in range(3)] == ["hub"] * 3
    assert rows(r)["weights fill"].startswith(
        "k3:weights.source hub: 3 Hub pull(s) (copy 0, 1, 2), 0 in-cluster fill(s); expected "
        "Hub bytes 4683.0 GB = 3x the tree; fill time for 3 copies ~3122 s")
    r = render("existing", PIN, "weights.mode=shared", "replicas=3")
    assert kinds(r, "Deployment") == [] and "kimi-k3-weights-source" not in kinds(r, "NetworkPolicy")
    assert rows(r)["weights fill"].startswith(
        "k3:weights.source cluster-then-hub: 1 Hub pull(s) (copy 0), 0 in-cluster fill(s); "
        "expected Hub bytes 1561.0 GB = 1x the tree")


def test_a_bad_source_is_refused_with_the_key():
    with pytest.raises(ConfigError) as info:
        render("existing", PIN, *NODE_LOCAL, "weights.source=peers")
    assert "source" in str(info.value) and "cluster-then-hub" in str(info.value)


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_the_source_admits_only_prefetch_pods_on_its_port():
    r = render("existing", PIN, *NODE_LOCAL, "replicas=3", "benchmark.enabled=true")
    pol = manifest(r, "NetworkPolicy", "kimi-k3-weights-source")
    source_pod = manifest(r, "Deployment", "kimi-k3-weights-source-0")["spec"]["template"]["metadata"]["labels"]
    assert matches(pol["spec"]["podSelector"], source_pod)
    assert pol["spec"]["policyTypes"] == ["Ingress", "Egress"] and pol["spec"]["egress"] == []
    (rule,) = pol["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}                          # this namespace only
    pods = {m["metadata"]["name"]: m["spec"]["template"]["metadata"]["labels"]
            for m in r.manifests() if m["kind"] in ("Job", "StatefulSet", "Deployment")}
    admitted = {name for name, labels in pods.items() if matches(peer["podSelector"], labels)}
    assert admitted == {f"kimi-k3-weights-prefetch-{i}" for i in range(3)}
    # No other policy opens the source pods: only the default deny and this one select them.
    selecting = {m["metadata"]["name"] for m in r.manifests() if m["kind"] == "NetworkPolicy"
                 and m["metadata"]["namespace"] == "kimi-k3"
                 and (not m["spec"]["podSelector"] or matches(m["spec"]["podSelector"], source_pod))}
    assert selecting == {"kimi-k3-default-deny", "kimi-k3-weights-source"}
    # The prefetch pods may reach the sources, on that port only.
    egress = manifest(r, "NetworkPolicy", "kimi-k3-weights-prefetch")["spec"]["egress"]
    to_source = [e for e in egress if any(matches(p.get("podSelector", {"matchLabels": {"x": "y"}}),
                                                  source_pod) for p in e["to"])]
    assert [e["ports"] for e in to_source] == [[{"port": 8080, "protocol": "TCP"}]]


def test_the_rendered_nginx_conf_serves_the_hub_layout_and_hides_the_marker():
    from k3infra.weights import source_server
    from k3infra.weights.manifests import WeightsLayout

    conf = source_server.nginx_conf(WeightsLayout("moonshotai/Kimi-K3", GOOD_REVISION))
    resolve = f"/moonshotai/Kimi-K3/resolve/{GOOD_REVISION}/"
    assert f"location ^~ {resolve} {{" in conf
    assert f"alias /weights/moonshotai--Kimi-K3/{GOOD_REVISION}/;" in conf
    assert f"add_header X-Repo-Commit {GOOD_REVISION} always;" in conf
    assert f"location ^~ {resolve}.k3- {{ return 404; }}" in conf
    assert "disable_symlinks on;" in conf and "autoindex off;" in conf
    assert "limit_except GET { deny all; }" in conf
