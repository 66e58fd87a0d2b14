"""The rendered vLLM StatefulSet carries exactly the receipt's configuration: asserted
against the receipt (the source of truth) and, for the seven measured settings, against
the literal flags of shared/K3_FACTS.md."""
import pytest

from k3infra.config import parse_stack_config
from k3infra.plan import ENDPOINT_PROPAGATION_SECONDS
from k3infra.receipt import load_receipt
from k3infra.serving import manifests as m

from conftest import GOOD_REVISION, PREBUILT, container, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"


def test_args_are_model_dir_then_receipt_engine_args_then_surface(receipt):
    r = render("existing", PIN)
    c = container(r)
    # The weights gate, then `exec vllm serve` (k3infra/weights/manifests.py GATE_SCRIPT).
    assert c["command"][:2] == ["sh", "-c"] and c["command"][-2:] == ["vllm", "serve"]
    n = len(receipt.serve.engine_arg_tokens())
    assert c["args"][0] == f"/weights/moonshotai--Kimi-K3/{GOOD_REVISION}"
    assert c["args"][1:1 + n] == receipt.serve.engine_arg_tokens()
    # vLLM on loopback only: the proxy is the pod's one listener (issue 21).
    assert c["args"][1 + n:] == ["--served-model-name", "kimi-k3", "--host", "127.0.0.1",
                                 "--port", "8001"]
    surface = {a.flag for a in receipt.serve.surface.args}
    assert {t for t in c["args"][1 + n:] if t.startswith("--")} <= surface


def test_the_seven_measured_settings_literally():
    c = container(render("existing", PIN))
    args = " ".join(c["args"])
    for setting in ("--tensor-parallel-size 8 --enable-expert-parallel", "--max-model-len 40960",
                    "--moe-backend marlin", "--kda-prefill-backend triton",
                    "--disable-custom-all-reduce", "--block-size 128"):
        assert setting in args
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_env_is_receipt_env_plus_allow_listed_surface(receipt):
    c = container(render("existing", PIN))
    names = [e["name"] for e in c["env"]]
    engine = list(receipt.serve.engine_env_map())
    assert names[:len(engine)] == engine
    gate = [n for n in names if n.startswith("K3_")]          # the weights gate's own env
    assert names[-len(gate):] == gate
    assert set(names[len(engine):-len(gate)]) <= set(receipt.serve.surface.env)
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_HUB_OFFLINE"]["value"] == "1"
    assert env["VLLM_API_KEY"] == {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {
        "name": "kimi-k3-api-key", "key": "api-key"}}}
    # The engine's own deadline: load 1561 + compile 1800 + profiling 270 (docs/coldstart.md).
    assert env["VLLM_ENGINE_READY_TIMEOUT_S"]["value"] == "3751"


def test_surface_settings_are_added_after_engine_args(receipt):
    c = container(render("existing", PIN, 'surface={"args": {"--tool-call-parser": "kimi_k2", '
                         '"--enable-auto-tool-choice": true}, "env": {"NCCL_DEBUG": "WARN"}}'))
    assert c["args"][-3:] == ["--tool-call-parser", "kimi_k2", "--enable-auto-tool-choice"]
    assert {"name": "NCCL_DEBUG", "value": "WARN"} in c["env"]


def test_gpus_resources_shm_and_probes(receipt):
    r = render("existing", PIN)
    c = container(r)
    gpus = str(receipt.measured_gpu.gpus_per_node)
    assert c["resources"]["requests"]["nvidia.com/gpu"] == gpus == c["resources"]["limits"]["nvidia.com/gpu"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind])
    pod = manifest(r, "StatefulSet")["spec"]["template"]["spec"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"] == "64Gi"
    probe = c["startupProbe"]
    # vLLM's own /health on loopback, from inside its container (no proxy in the way)
    health = "http://127.0.0.1:8001/health"
    assert health in probe["exec"]["command"][-1]
    # the gate's read and the engine's deadline, strictly (tests/test_coldstart.py)
    assert probe["periodSeconds"] * probe["failureThreshold"] == 4990
    assert health in c["readinessProbe"]["exec"]["command"][-1]
    assert health in c["livenessProbe"]["exec"]["command"][-1]
    assert "ports" not in c
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] > 0
    assert pod["terminationGracePeriodSeconds"] >= receipt.measurement(8).p99_ms / 1000


def test_startup_budget_scales_with_storage_speed(receipt):
    slow = container(render("existing", PIN, "serving.storageReadGBps=0.5"))["startupProbe"]
    fast = container(render("existing", PIN))["startupProbe"]
    assert slow["failureThreshold"] > fast["failureThreshold"]


def test_placement_security_and_volumes(receipt):
    r = render("existing", PIN)
    sts = manifest(r, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expr = terms["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expr == {"key": "nvidia.com/gpu.product", "operator": "In",
                    "values": [receipt.hardware.gpu_product_label]}
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    c = container(r)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    mounts = {v["name"]: v for v in c["volumeMounts"]}
    assert mounts["weights"]["readOnly"] is True
    assert mounts["cache"]["mountPath"] == "/cache"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_CACHE_ROOT"].startswith("/cache/")
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["cache"]
    assert "initContainers" not in pod               # the gate is in the vllm container
    assert mounts["gate-state"]["mountPath"] == "/var/run/k3-gate"


def test_labels_annotations_services_pdb(receipt):
    r = render("existing", PIN)
    sts = manifest(r, "StatefulSet")
    ann = sts["metadata"]["annotations"]
    assert ann["k3infra.dev/receipt"] == receipt.id
    assert ann["k3infra.dev/engine-commit"] == receipt.engine.commit
    assert ann["k3infra.dev/weights-revision"] == GOOD_REVISION
    assert ann["k3infra.dev/tree-digest"] == receipt.model.tree_digest
    assert ann["k3infra.dev/measured-configuration"] == "true"
    assert sts["metadata"]["labels"]["app.kubernetes.io/name"] == "kimi-k3"
    assert manifest(r, "Service", "kimi-k3-headless")["spec"]["clusterIP"] == "None"
    svc = manifest(r, "Service", "kimi-k3")["spec"]
    assert svc["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert svc["type"] == "ClusterIP"
    assert manifest(r, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert sts["spec"]["serviceName"] == "kimi-k3-headless"


def test_custom_profile_is_labelled_not_measured(receipt):
    r = render("existing", PIN, "profile=custom", 'custom={"args": ["--max-num-seqs", "64"]}')
    sts = manifest(r, "StatefulSet")
    assert sts["metadata"]["annotations"]["k3infra.dev/measured-configuration"] == "false"
    assert "NOT the measured" in sts["metadata"]["annotations"]["k3infra.dev/warning"]
    assert "--max-num-seqs" in container(r)["args"]
    assert any("NOT the measured configuration" in w for w in r.warnings)
    assert r.outputs["profile"] == "custom"


def test_replicas_and_node_local_mode():
    r = render("existing", PIN, "replicas=3", "weights.mode=node-local")
    assert manifest(r, "StatefulSet")["spec"]["replicas"] == 3
    for i in range(3):                  # one Job per replica's local volume
        job = manifest(r, "Job", f"kimi-k3-weights-prefetch-{i}")
        vol = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "weights")
        assert vol["persistentVolumeClaim"]["claimName"] == f"weights-kimi-k3-{i}"
    claims = {m["metadata"]["name"] for m in r.manifests() if m["kind"] == "PersistentVolumeClaim"}
    # The three local volumes, and the rollout gate's results claim (k3:rollout.gate).
    assert claims == {"weights-kimi-k3-0", "weights-kimi-k3-1", "weights-kimi-k3-2",
                      "kimi-k3-gate-results"}
    ns = manifest(r, "Namespace", "kimi-k3")["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "restricted"


def test_serve_command_line_matches_container(receipt):
    r = render("existing", PIN)
    c = container(r)
    cfg = parse_stack_config({"k3:weightsRevision": GOOD_REVISION, "k3:apiKey": "x",
                              "k3:engineImage": "r@sha256:" + "1" * 64}, receipt=load_receipt())
    assert m.serve_command_line(receipt, cfg, c["args"][0]) == " ".join(c["command"][-2:] + c["args"])


def test_drain_outlasts_the_slowest_measured_request(receipt):
    c = container(render("existing", PIN))
    drain = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    slowest_s = max(mm.p99_ms for mm in receipt.measured) / 1000
    assert drain >= slowest_s + ENDPOINT_PROPAGATION_SECONDS
    grace = manifest(render("existing", PIN), "StatefulSet")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    assert grace >= drain + m.SHUTDOWN_SECONDS


def test_the_proxy_drains_as_long_as_the_engine():
    """The proxy is the pod's one listener: it keeps answering through the drain (nginx
    stops at once on SIGTERM), or a replaced replica refuses requests its engine would
    still serve (found by the node tier's two-replica roll)."""
    pod = manifest(render("existing", PIN), "StatefulSet")["spec"]["template"]["spec"]
    vllm, proxy = pod["containers"]
    assert proxy["name"] == "proxy"
    assert proxy["lifecycle"] == vllm["lifecycle"] == {"preStop": {"sleep": {"seconds": 29}}}


def test_grace_shorter_than_drain_is_refused(tmp_path, capsys):
    from k3infra.cli import main

    assert main(["render", "--stack", "existing", "--config", PIN, "--config",
                 "serving.terminationGraceSeconds=40", "--out", str(tmp_path)]) == 2
    assert "k3:serving.terminationGraceSeconds = 40" in capsys.readouterr().err


def test_update_strategy_partition_and_timeouts(receipt):
    r = render("existing", PIN, "replicas=3", "serving.updatePartition=2")
    sts = manifest(r, "StatefulSet")
    assert sts["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                             "rollingUpdate": {"partition": 2}}
    res = next(x for x in r.resources if x["type"] == "kubernetes:apps/v1:StatefulSet")
    create, update = (int(res["customTimeouts"][k][:-1]) for k in ("create", "update"))
    assert update > 2 * create                      # one startup per replica on update
    r = render("existing", PIN, "serving.updateStrategy=OnDelete")
    assert manifest(r, "StatefulSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_partition_above_replicas_is_refused():
    from k3infra.config import ConfigError

    with pytest.raises(ConfigError, match="k3:serving.updatePartition = 3"):
        parse_stack_config({"k3:weightsRevision": GOOD_REVISION, "k3:apiKey": "x",
                            "k3:engineImage": "r@sha256:" + "1" * 64,
                            "k3:serving": '{"updatePartition": 3}'}, receipt=load_receipt())


def test_upstream_pods_do_not_claim_the_receipt_engine(receipt):
    r = render("existing", PIN, "profile=upstream", *PREBUILT, "engine.upstreamVersion=0.33.0")
    ann = manifest(r, "StatefulSet")["metadata"]["annotations"]
    assert "k3infra.dev/engine-commit" not in ann
    assert ann["k3infra.dev/engine-version"] == "0.33.0"
    assert "not the measured engine" in ann["k3infra.dev/engine"]
    assert ann["k3infra.dev/measured-configuration"] == "false"
    ann = manifest(render("existing", PIN), "StatefulSet")["metadata"]["annotations"]
    assert ann["k3infra.dev/engine-commit"] == receipt.engine.commit


def test_pull_secrets_reach_every_pod_running_the_engine_image():
    r = render("existing", PIN, 'engine.pullSecrets=["regcred"]', "benchmark.enabled=true")
    # every pod that runs the engine image (the in-cluster build Job runs BuildKit)
    engine_pods = [m for m in r.manifests() if m["kind"] in ("StatefulSet", "Job")
                   and m["metadata"]["labels"].get("app.kubernetes.io/component") != "engine-build"]
    assert len(engine_pods) >= 3           # serving, weights prefetch, benchmark
    for obj in engine_pods:
        assert obj["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}], \
            obj["metadata"]["name"]
    assert "imagePullSecrets" not in manifest(render("existing", PIN), "StatefulSet")[
        "spec"]["template"]["spec"]


def test_pods_run_as_the_engine_images_user():
    """The uid in podsecurity is the user images/Dockerfile creates and switches to."""
    import re

    from conftest import ROOT
    from k3infra.podsecurity import ENGINE_GID, ENGINE_UID

    dockerfile = (ROOT / "images" / "Dockerfile").read_text()
    assert re.search(rf"useradd --uid {ENGINE_UID} --gid {ENGINE_GID}\b", dockerfile)
    assert re.search(rf"^USER {ENGINE_UID}:{ENGINE_GID}$", dockerfile, re.M)
    sc = container(render("existing", PIN))["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"]) == (ENGINE_UID, ENGINE_GID)


def test_the_proxy_is_the_pods_only_listener():
    """Issue 21, item 2: nginx in the pod on the API, metrics and health ports; its
    config and key map come from the API-key Secret; a config change rolls the pods."""
    from k3infra.serving import proxy

    r = render("existing", PIN)
    sts = manifest(r, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    p = container(r, "proxy")
    assert p["image"] == ("nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:" + "0" * 64)
    assert p["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
                          {"name": "health", "containerPort": 8081, "protocol": "TCP"}]
    assert p["command"] == ["nginx", "-e", "stderr", "-c", "/etc/k3-proxy/nginx.conf",
                            "-g", "daemon off;"]
    assert p["readinessProbe"]["httpGet"] == {"path": "/health", "port": "health"}
    assert p["livenessProbe"]["httpGet"] == {"path": "/proxy-live", "port": "health"}
    sc = p["securityContext"]
    assert sc["runAsUser"] == 10101 and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    vols = {v["name"]: v for v in pod["volumes"]}
    # nginx.conf from a ConfigMap (no secret in it), the key map from the API-key Secret
    assert vols["proxy"] == {"name": "proxy", "projected": {"defaultMode": 0o440, "sources": [
        {"configMap": {"name": "kimi-k3-proxy",
                       "items": [{"key": "nginx.conf", "path": "nginx.conf"}]}},
        {"secret": {"name": "kimi-k3-api-key",
                    "items": [{"key": "keys.map", "path": "keys.map"}]}}]}}
    ann = sts["spec"]["template"]["metadata"]["annotations"]
    assert ann["k3infra.dev/proxy-config"].startswith("sha256:")
    secret = manifest(r, "Secret", "kimi-k3-api-key")
    assert secret["stringData"] == {"api-key": "[secret]", "keys.map": "[secret]"}
    # a user reads the proxy's config in a render (issue 27)
    rendered = manifest(r, "ConfigMap", "kimi-k3-proxy")["data"]["nginx.conf"]
    assert "listen 8000;" in rendered and "include /etc/k3-proxy/keys.map;" in rendered
    assert ann["k3infra.dev/proxy-config"] == (
        "sha256:" + __import__("hashlib").sha256(rendered.encode()).hexdigest())
    conf = proxy.nginx_conf(r.config if hasattr(r, "config") else parse_stack_config(
        {"weightsRevision": GOOD_REVISION, "apiKey": "k", "engineImage": "r/v@sha256:" + "1" * 64}, receipt=load_receipt()))
    assert "listen 8000;" in conf and "server 127.0.0.1:8001;" in conf
    assert "listen 9090;" in conf and "listen 8081;" in conf
    assert proxy.keys_map("[secret]") == "# [secret]\n"     # an offline render holds no key
    other = render("existing", PIN, "serving.metricsPort=9400")
    assert (manifest(other, "StatefulSet")["spec"]["template"]["metadata"]["annotations"]
            ["k3infra.dev/proxy-config"] != ann["k3infra.dev/proxy-config"])
    assert proxy.keys_map("k.e+y") == '"~^Bearer k\\.e\\+y$" 1;\n'


@pytest.mark.parametrize("flag", ["--host", "--port"])
def test_surface_cannot_move_vllm_off_loopback(flag):
    from k3infra.config import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "k",
                            "engineImage": "r/v@sha256:" + "1" * 64,
                            "surface": {"args": {flag: "0.0.0.0"}}}, receipt=load_receipt())
    assert err.value.key == f"k3:surface.args.{flag}" and "proxy" in str(err.value)


@pytest.mark.parametrize("key", ["has space", 'quo"te', "semi;colon", "dollar$", "new\nline"])
def test_an_api_key_the_proxy_cannot_match_exactly_is_refused(key):
    from k3infra.config import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": key,
                            "engineImage": "r/v@sha256:" + "1" * 64}, receipt=load_receipt())
    assert err.value.key == "k3:apiKey" and key not in str(err.value)


def test_proxy_ports_must_differ():
    from k3infra.config import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "k",
                            "engineImage": "r/v@sha256:" + "1" * 64,
                            "serving": {"metricsPort": 8000}}, receipt=load_receipt())
    assert err.value.key == "k3:serving"


def test_statefulset_takes_its_fields_back_from_other_managers():
    """Drift restored by `pulumi up`: a serve flag changed with `kubectl edit` is another
    field manager's; without patchForce server-side apply refuses with a conflict (the
    real API server showed it, tests/e2e/test_apiserver_stack.py)."""
    sts = manifest(render(), "StatefulSet")
    assert sts["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"


def test_nginx_workers_follow_the_proxys_cpu_limit():
    """Issue 27: `worker_processes 4` under a 2-CPU limit; one worker per CPU of the limit."""
    r = render("existing", PIN)
    conf = manifest(r, "ConfigMap", "kimi-k3-proxy")["data"]["nginx.conf"]
    assert "\nworker_processes 2;\n" in conf
    assert container(r, "proxy")["resources"] == {
        "requests": {"cpu": "1", "memory": "256Mi", "ephemeral-storage": "256Mi"},
        "limits": {"cpu": "2", "memory": "512Mi", "ephemeral-storage": "1280Mi"}}
    small = render("existing", PIN, "serving.proxyResources.cpu=0.25",
                   "serving.proxyResources.cpuLimit=0.5",
                   "serving.proxyResources.memoryGi=0.0625")
    assert "\nworker_processes 1;\n" in manifest(small, "ConfigMap", "kimi-k3-proxy")["data"][
        "nginx.conf"]
    assert container(small, "proxy")["resources"] == {
        "requests": {"cpu": "250m", "memory": "64Mi", "ephemeral-storage": "256Mi"},
        "limits": {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "1280Mi"}}
    from k3infra.weights import source_server

    assert source_server.NGINX_RESOURCES["limits"]["cpu"] == "8"


def test_a_request_above_its_limit_is_refused_with_the_key():
    from k3infra.config import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "k",
                            "engineImage": "r/v@sha256:" + "1" * 64,
                            "serving": {"proxyResources": {"cpu": 3}}}, receipt=load_receipt())
    assert "k3:serving.proxyResources" in str(err.value)
    assert "cpu 3 is above cpuLimit 2" in str(err.value)


def test_the_engines_tmp_is_a_stack_key():
    """Issue 27: a 16Gi /tmp emptyDir is more than a small test node's disk may spare."""
    def tmp(r):
        vols = manifest(r, "StatefulSet")["spec"]["template"]["spec"]["volumes"]
        return next(v for v in vols if v["name"] == "tmp")

    assert tmp(render("existing", PIN)) == {"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}}
    assert tmp(render("existing", PIN, "serving.tmpSizeGi=2")) == {
        "name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}}
