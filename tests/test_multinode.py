"""k3:topology = multi-node (issue 17): one replica across two 4-GPU trays of an NVL72 rack,
a LeaderWorkerSet and a ComputeDomain per replica, labelled NOT the measured
configuration. Rendered output is checked against literal expectations from the receipt
and against the pinned CRDs' schemas (tests/workload_crds.py)."""
from __future__ import annotations

import json

import kubernetes_validate
import pytest

from k3infra.cli import main
from k3infra.config import ConfigError
from k3infra.policies.runner import check_plan
from k3infra.preflight import PreflightError, preflight_report

from conftest import render
from policy_corpus import MULTI_NODE_CORPUS, MULTI_NODE_OVERRIDES
from nodepool_harness import stack_config
import workload_crds

MULTI = MULTI_NODE_OVERRIDES
# The receipt's serve line, literally (k3infra/receipt/*.yaml), then the surface flags.
RECEIPT_FLAGS = ["--tensor-parallel-size", "8", "--enable-expert-parallel",
                 "--max-model-len", "40960", "--moe-backend", "marlin",
                 "--kda-prefill-backend", "triton", "--disable-custom-all-reduce",
                 "--block-size", "128"]
SURFACE = ["--served-model-name", "kimi-k3", "--host", "127.0.0.1", "--port", "8001"]
LEADER_TAIL = ["--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "0",
               "--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", "29501"]
WORKER_TAIL = ["--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "1",
               "--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", "29501", "--headless"]


def objects(r, kind: str) -> list[dict]:
    return [m for m in r.manifests() if m["kind"] == kind]


@pytest.fixture(scope="module")
def multi():
    return render("existing", *MULTI)


def template(lws: dict, role: str) -> dict:
    return lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]


def vllm_of(pod: dict) -> dict:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")


# --- the render the issue names ------------------------------------------------------------

def test_one_leader_worker_set_of_two_four_gpu_pods_with_a_compute_domain(multi):
    (lws,) = objects(multi, "LeaderWorkerSet")
    (cd,) = objects(multi, "ComputeDomain")
    assert objects(multi, "StatefulSet") == []
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["metadata"]["name"] == "kimi-k3-r0" and lws["spec"]["replicas"] == 1
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert cd["apiVersion"] == "resource.nvidia.com/v1beta1"
    assert cd["metadata"]["name"] == "kimi-k3-r0-domain"
    assert cd["spec"] == {"numNodes": 2, "channel": {
        "resourceClaimTemplate": {"name": "kimi-k3-r0-imex"}, "allocationMode": "Single"}}
    for role in ("leader", "worker"):
        pod = template(lws, role)
        c = vllm_of(pod)
        assert c["resources"]["requests"]["nvidia.com/gpu"] == "4"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert c["resources"]["claims"] == [{"name": "imex-channel"}]
        assert pod["spec"]["resourceClaims"] == [
            {"name": "imex-channel", "resourceClaimTemplateName": "kimi-k3-r0-imex"}]
        assert c["image"] == vllm_of(template(lws, "leader"))["image"]
    assert [c["name"] for c in template(lws, "leader")["spec"]["containers"]] == ["vllm", "proxy"]
    assert [c["name"] for c in template(lws, "worker")["spec"]["containers"]] == ["vllm"]


def test_leader_and_worker_run_the_receipts_flags_then_the_multi_node_ones(multi):
    (lws,) = objects(multi, "LeaderWorkerSet")
    for role, tail in (("leader", LEADER_TAIL), ("worker", WORKER_TAIL)):
        c = vllm_of(template(lws, role))
        assert c["args"][1:] == RECEIPT_FLAGS + SURFACE + tail
        assert c["command"][-2:] == ["vllm", "serve"] and c["command"][0] == "sh"  # gate first
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        # The engine's own deadline is a node's: startup 120 + load 1561 + compile 1800 +
        # profiling 270 s.
        assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == "3751"
        assert env["K3_EXPECT_TREE_DIGEST"] == (
            "sha256:ebf0b1a75a29ab5e01f319252302c418d0e8f9340e402950497094a6fc64aced")
    # Both pods' gates read the tree at once: 2 x 1561.0 GB / 2 GB/s x 1.5 tail = 2342 s
    # (one node: 1171 s); the probe: 2342 + 3751 + 60 s, in whole 10 s periods.
    budget = json.loads(template(lws, "leader")["metadata"]["annotations"][
        "k3infra.dev/startup-budget"])
    assert budget["gate"] == 2342 and budget["engine"] == 3751 and budget["probe"] == 6160
    leader = vllm_of(template(lws, "leader"))
    assert leader["startupProbe"]["failureThreshold"] == 616
    assert leader["startupProbe"]["periodSeconds"] == 10
    assert "startupProbe" not in vllm_of(template(lws, "worker"))


def test_both_pods_stay_in_one_nvlink_domain(multi):
    (lws,) = objects(multi, "LeaderWorkerSet")
    for role in ("leader", "worker"):
        aff = template(lws, role)["spec"]["affinity"]
        (term,) = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert {"key": "nvidia.com/gpu.product", "operator": "In",
                "values": ["NVIDIA-GB300"]} in term["matchExpressions"]
        assert {"key": "nvidia.com/gpu.clique", "operator": "Exists"} in term["matchExpressions"]
        assert aff["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
            "topologyKey"] == "kubernetes.io/hostname"
    (beside,) = template(lws, "worker")["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert beside == {"labelSelector": {"matchLabels": {
        "leaderworkerset.sigs.k8s.io/name": "kimi-k3-r0",
        "leaderworkerset.sigs.k8s.io/worker-index": "0"}},
        "topologyKey": "nvidia.com/gpu.clique"}


def test_every_object_says_not_the_measured_configuration(multi):
    for obj in multi.manifests():
        meta = obj["metadata"]
        assert meta["annotations"]["k3infra.dev/measured-configuration"] == "false", obj["kind"]
        assert "not the measured configuration" in meta["annotations"][
            "k3infra.dev/warning"].lower(), obj["kind"]
        assert meta["labels"]["k3infra.dev/topology"] == "multi-node", obj["kind"]
    (lws,) = objects(multi, "LeaderWorkerSet")
    for role in ("leader", "worker"):
        ann = template(lws, role)["metadata"]["annotations"]
        assert ann["k3infra.dev/measured-configuration"] == "false"
    assert "not the measured configuration" in multi.outputs["topology"].lower()
    assert any("not the measured configuration" in w.lower() for w in multi.warnings)


def test_single_node_renders_are_untouched():
    r = render("existing")
    assert objects(r, "LeaderWorkerSet") == [] and objects(r, "ComputeDomain") == []
    for obj in r.manifests():
        assert "k3infra.dev/topology" not in (obj["metadata"].get("labels") or {})
    assert r.outputs["topology"].startswith("single-node")


def test_services_point_at_the_leader_and_the_group_talks_inside_itself(multi):
    for svc in objects(multi, "Service"):
        if svc["metadata"]["name"] in ("kimi-k3", "kimi-k3-headless"):
            assert svc["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    (pol,) = [p for p in objects(multi, "NetworkPolicy")
              if p["metadata"]["name"] == "kimi-k3-serving"]
    serving = {"matchLabels": {"app.kubernetes.io/name": "kimi-k3",
                               "app.kubernetes.io/instance": "kimi-k3",
                               "app.kubernetes.io/component": "serving"}}
    ports = [{"port": 1024, "endPort": 65535, "protocol": "TCP"}]
    assert {"from": [{"podSelector": serving}], "ports": ports} in pol["spec"]["ingress"]
    assert {"to": [{"podSelector": serving}], "ports": ports} in pol["spec"]["egress"]


def test_metrics_select_the_leader_and_alerts_match_the_group():
    r = render("existing", *MULTI, 'monitoring={"serviceMonitor": true, "prometheusRule": true}')
    (svc,) = [s for s in objects(r, "Service") if s["metadata"]["name"] == "kimi-k3-metrics"]
    assert svc["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    (rule,) = objects(r, "PrometheusRule")
    exprs = " ".join(x["expr"] for g in rule["spec"]["groups"] for x in g["rules"])
    assert 'pod=~"kimi-k3-r[0-9]+-0(-[0-9]+)?"' in exprs


def test_two_replicas_are_two_groups_each_with_its_own_domain():
    r = render("existing", *MULTI, "replicas=2")
    assert sorted(o["metadata"]["name"] for o in objects(r, "LeaderWorkerSet")) == [
        "kimi-k3-r0", "kimi-k3-r1"]
    assert sorted(o["spec"]["channel"]["resourceClaimTemplate"]["name"]
                  for o in objects(r, "ComputeDomain")) == ["kimi-k3-r0-imex", "kimi-k3-r1-imex"]


def test_benchmark_records_the_topology():
    r = render("existing", *MULTI, 'benchmark={"enabled": true}')
    (job,) = [j for j in objects(r, "Job") if j["metadata"]["name"] == "kimi-k3-bench"]
    args = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[args.index("--topology") + 1] == "multi-node"


# --- the pinned CRDs ---------------------------------------------------------------------------

def test_renders_validate_against_the_pinned_crds(multi):
    for kind in ("LeaderWorkerSet", "ComputeDomain"):
        for obj in objects(multi, kind):
            assert workload_crds.schema_errors(obj) == [], kind


def test_the_schema_check_catches_a_pruned_field(multi):
    (lws,) = objects(multi, "LeaderWorkerSet")
    broken = json.loads(json.dumps(lws))
    broken["spec"]["leaderWorkerTemplate"]["groupSize"] = 2
    template(broken, "worker")["spec"]["containers"][0]["startupProbes"] = {}
    errors = workload_crds.schema_errors(broken)
    assert any("groupSize" in e for e in errors) and any("startupProbes" in e for e in errors)
    broken = json.loads(json.dumps(objects(multi, "ComputeDomain")[0]))
    broken["spec"]["channel"]["allocationMode"] = "Some"
    assert any("allocationMode" in e for e in workload_crds.schema_errors(broken))


@pytest.mark.parametrize("role", ["leader", "worker"])
def test_pod_templates_are_valid_v1_33_pods(multi, role):
    (lws,) = objects(multi, "LeaderWorkerSet")
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "kimi-k3-r0-0", "namespace": "kimi-k3"},
           "spec": template(lws, role)["spec"]}
    for version in ("1.33.0", kubernetes_validate.utils.latest_version()):
        kubernetes_validate.validate(pod, version, strict=True)


# --- refusals: the key, the value, what is accepted ---------------------------------------------

def refusal(receipt, **keys) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        stack_config({"provider": "existing"}, **keys)
    return info.value


def test_a_group_of_three_is_refused(receipt):
    err = refusal(receipt, topology="multi-node", gpuProduct="NVIDIA-GB300", gpuMemoryGib=267.69,
                  multiNode={"nodesPerReplica": 3})
    assert err.key == "k3:multiNode.nodesPerReplica" and err.value == 3
    assert "accepted: 2" in str(err) and "--tensor-parallel-size 8" in str(err)


def test_eight_gpu_trays_are_refused(receipt):
    err = refusal(receipt, topology="multi-node", multiNode={"gpusPerNode": 8})
    assert err.key == "k3:multiNode.gpusPerNode" and "accepted: 4" in str(err)


def test_four_gpu_nodes_with_single_node_are_refused(receipt):
    from k3infra.preflight import check_hbm

    cfg = stack_config({"provider": "existing"}, gpuProduct="NVIDIA-GB300")
    with pytest.raises(PreflightError) as info:
        check_hbm(cfg, receipt)
    assert info.value.key == "k3:gpuProduct" and info.value.value == "NVIDIA-GB300"
    assert "k3:topology = multi-node" in str(info.value)


@pytest.mark.parametrize("label", ["", "not a label!"])
def test_a_missing_domain_label_is_refused(receipt, label):
    err = refusal(receipt, topology="multi-node", gpuProduct="NVIDIA-GB300", gpuMemoryGib=267.69,
                  multiNode={"domainLabel": label})
    assert err.key == "k3:multiNode.domainLabel" and err.value == label
    assert "nvidia.com/gpu.clique" in str(err)


def test_multi_node_keys_need_multi_node(receipt):
    err = refusal(receipt, multiNode={"gpusPerNode": 4})
    assert err.key == "k3:multiNode" and "k3:topology = multi-node" in str(err)


@pytest.mark.parametrize("keys,key", [
    ({"weights": {"mode": "node-local"}}, "k3:weights.mode"),
    ({"serving": {"updateStrategy": "OnDelete"}}, "k3:serving.updateStrategy"),
    ({"profile": "custom"}, "k3:profile"),
    ({"gateway": {"enabled": True}}, "k3:gateway.enabled"),
    ({"autoscaling": {"enabled": True}}, "k3:autoscaling.enabled"),
])
def test_what_a_group_cannot_do_is_refused(receipt, keys, key):
    err = refusal(receipt, topology="multi-node", gpuProduct="NVIDIA-GB300", gpuMemoryGib=267.69,
                  **keys)
    assert err.key == key


def test_cloud_pools_are_refused_with_multi_node(receipt):
    from k3infra.topology import check_config

    cfg = stack_config({"provider": "existing"})
    cfg = cfg.model_copy(update={"topology": "multi-node", "node_pool": cfg.node_pool.model_copy(
        update={"provider": "aws"})})
    with pytest.raises(ConfigError) as info:
        check_config(cfg, receipt)
    assert info.value.key == "k3:nodePool.provider" and "existing" in str(info.value)


def test_b200_on_four_gpu_trays_does_not_fit_with_the_figures(receipt):
    cfg = stack_config({"provider": "existing"}, topology="multi-node", gpuProduct="NVIDIA-B200")
    with pytest.raises(PreflightError) as info:
        preflight_report(cfg, receipt)
    msg = str(info.value)
    assert info.value.key == "k3:gpuProduct" and info.value.value == "NVIDIA-B200"
    for figure in ("8 x 175.75 GiB free of 178.35 GiB", "1406.00 GiB",
                   "8 x (175.40 GiB of weights per GPU at TP8+EP + 4 GiB headroom) = 1435.20 GiB",
                   "179.40 GiB"):
        assert figure in msg, figure


def test_a_product_below_the_floor_is_refused(receipt):
    cfg = stack_config({"provider": "existing"}, topology="multi-node",
                       gpuProduct="NVIDIA-GB200", gpuMemoryGib=173.2)
    with pytest.raises(PreflightError) as info:
        preflight_report(cfg, receipt)
    assert info.value.key == "k3:gpuMemoryGib" and info.value.value == 173.2
    assert "8 x 173.20 GiB per GPU (1385.60 GiB in the domain)" in str(info.value)


def test_an_unknown_product_needs_its_memory(receipt):
    cfg = stack_config({"provider": "existing"}, topology="multi-node", gpuProduct="NVIDIA-GB300")
    with pytest.raises(PreflightError) as info:
        preflight_report(cfg, receipt)
    assert info.value.key == "k3:gpuMemoryGib" and "288 GB" in str(info.value)


def test_preflight_sums_the_domain_and_names_the_versions(receipt):
    cfg = stack_config({"provider": "existing"}, topology="multi-node",
                       gpuProduct="NVIDIA-GB300", gpuMemoryGib=267.69)
    text = "\n".join(preflight_report(cfg, receipt))
    assert ("NVIDIA-GB300: 2 nodes x 4 GPUs in one NVLink domain, 8 x 267.69 GiB = 2141.52 GiB; "
            "weights 175.40 GiB per GPU at TP8+EP (1403.20 GiB) -> 92.29 GiB headroom per GPU") in text
    for pin in ("R580+", "GPU Operator 25.10.0+", "DRA driver for GPUs v25.8.1",
                "resource.nvidia.com/v1beta1", "LeaderWorkerSet v0.8.0",
                "NOT the measured configuration"):
        assert pin in text, pin


# --- policies ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan(multi) -> dict:
    return multi.plan()


def test_the_multi_node_render_passes_the_pack(plan):
    assert check_plan(plan).mandatory == []


@pytest.mark.parametrize("variant", MULTI_NODE_CORPUS, ids=lambda v: v.id)
def test_multi_node_variant_is_caught_by_its_policy(plan, variant):
    report = check_plan(variant.apply(plan))
    caught = report.by_policy(variant.policy)
    assert caught and all(f.level == "mandatory" and not f.could_not_run for f in caught)


def test_policy_check_cli_names_the_domain_policy(plan, tmp_path, capsys):
    broken = next(v for v in MULTI_NODE_CORPUS if v.id == "domain_label_missing").apply(plan)
    (tmp_path / "plan.json").write_text(json.dumps(broken))
    assert main(["policy", "check", str(tmp_path)]) == 1
    assert "k3-nvlink-domain" in capsys.readouterr().out


# --- the CLI render, word for word -------------------------------------------------------------

def test_render_cli_word_for_word(tmp_path, capsys):
    assert main(["render", "--stack", "existing", "--config", "topology=multi-node",
                 "--config", "gpuProduct=NVIDIA-GB300", "--config", "gpuMemoryGib=267.69",
                 "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "NOT the measured configuration" in out
    assert "--node-rank 1" in out and "--headless" in out
    kinds = [p.name.split("-", 2)[1] for p in (tmp_path / "manifests").glob("*.yaml")]
    assert kinds.count("leaderworkerset") == 1 and kinds.count("computedomain") == 1


# --- bench compare: cross-topology -------------------------------------------------------------

def _bench_file(receipt, tmp_path, topology=None):
    from bench_results import receipt_latencies_ms, result_dict, write_result
    from k3infra.bench.workload import WORKLOAD_ID

    m = next(m for m in receipt.measured if m.metric == "e2el")
    w = receipt.workload_a
    meta = {"k3_workload": WORKLOAD_ID, "k3_role": "measured", "k3_ignore_eos": "true",
            "k3_run": "1", **({"k3_topology": topology} if topology else {})}
    lat = receipt_latencies_ms(m.p50_ms, m.p99_ms)
    data = result_dict(lat, concurrency=m.concurrency, output_len=w.output_tokens_max,
                       metadata=meta,
                       input_lens=[(w.prompt_tokens_min + w.prompt_tokens_max) // 2] * len(lat))
    return write_result(tmp_path / "run1-c8-measured.json", data)


def test_bench_compare_marks_a_multi_node_result_cross_topology(receipt, tmp_path, capsys):
    path = _bench_file(receipt, tmp_path, "multi-node")
    assert main(["bench", "compare", str(path)]) == 0       # the figures are the receipt's
    out = " ".join(capsys.readouterr().out.split())
    assert "cross-topology comparison" in out and "NOT the measured configuration" in out


def test_bench_compare_topology_flag_marks_files_without_it(receipt, tmp_path, capsys):
    path = _bench_file(receipt, tmp_path)
    assert main(["bench", "compare", str(path)]) == 0
    assert "cross-topology" not in capsys.readouterr().out
    assert main(["bench", "compare", "--topology", "multi-node", str(path)]) == 0
    assert "cross-topology" in capsys.readouterr().out


# --- the not-measured label ------------------------------------------------------------------------

def test_the_label_transformation_keeps_an_objects_own_values_and_skips_cloud_resources():
    import pulumi

    from k3infra.kube import mark_every_object

    transform = mark_every_object({"k3infra.dev/measured-configuration": "false"},
                                  {"k3infra.dev/topology": "multi-node"})
    class Args:
        type_ = "kubernetes:apps/v1:Deployment"
        props = {"metadata": {"name": "x", "annotations": {"k3infra.dev/measured-configuration": "kept"}}}
        opts = pulumi.ResourceOptions()

    plain = transform(Args).props["metadata"]
    assert plain["annotations"] == {"k3infra.dev/measured-configuration": "kept"}
    assert plain["labels"] == {"k3infra.dev/topology": "multi-node"}

    class Cloud(Args):
        type_ = "aws:ec2/launchTemplate:LaunchTemplate"

    assert transform(Cloud) is None


def test_verify_rows_of_the_rendered_group_hold(multi, receipt):
    from k3infra.live import drift

    (lws,) = objects(multi, "LeaderWorkerSet")
    bad = [r.check for r in drift.group_drift(lws, receipt) if not r.ok]
    assert bad == ["ready replicas [kimi-k3-r0 leader]"]          # nothing runs offline
    assert drift.group_pods(lws) == ["kimi-k3-r0-0", "kimi-k3-r0-0-1"]
    assert drift.group_model_dir(lws).startswith("/weights/moonshotai--Kimi-K3/")


def test_a_wired_multi_node_stack_labels_every_object():
    """K3ServingStack in someone else's program with wired Inputs (their manifests are
    Outputs): every Kubernetes object still carries the not-measured label."""
    import pulumi
    import pulumi_kubernetes as k8s

    from k3infra.receipt import load_receipt
    from k3infra.stack import K3ServingStack

    from program_harness import record
    from test_component_api import PINNED, source

    def program():
        _, o = source("upstream", {"revision": "3f1c2b4a5d6e7f8091a2b3c4d5e6f708192a3b4c",
                                   "image": "registry.example.com/k3/vllm-k3@sha256:" + "5e" * 32})
        stack = K3ServingStack(
            "kimi-k3", {"weightsRevision": o["revision"], "engineImage": o["image"],
                        "apiKey": pulumi.Output.secret("sk-generated"),
                        "acceptModelLicense": True, **PINNED, "topology": "multi-node",
                        "gpuProduct": "NVIDIA-GB300", "gpuMemoryGib": 267.69,
                        "weights": {"storageClass": "rwx"}, "receipt": load_receipt()},
            pulumi.ResourceOptions(provider=k8s.Provider("target", kubeconfig="{}")))
        return pulumi.Output.all(*stack.outputs().values())

    rec = record(program)
    kube = rec.kubernetes()
    assert {r.type for r in kube} >= {"kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet",
                                      "kubernetes:resource.nvidia.com/v1beta1:ComputeDomain"}
    for r in kube:
        meta = r.inputs["metadata"]
        assert meta["annotations"]["k3infra.dev/measured-configuration"] == "false", r.name
        assert meta["labels"]["k3infra.dev/topology"] == "multi-node", r.name
    (lws,) = rec.of_type("kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet")
    leader = lws.inputs["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert leader["args"][0].endswith("/3f1c2b4a5d6e7f8091a2b3c4d5e6f708192a3b4c")
