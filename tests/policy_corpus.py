"""A corpus of deliberately broken variants of a rendered plan, each one the kind of
mistake (or shortcut) the named policy exists to refuse. Each variant mutates a deep copy
of a real render's plan.json resources; nothing here is a hand-written manifest except
the objects a variant injects."""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Callable

from k3infra.receipt import load_receipt

R = load_receipt()
OTHER_REVISION = "0123456789abcdef0123456789abcdef01234567"


# --- navigating a plan ---------------------------------------------------------------------

def resources(plan: dict, kind: str) -> list[dict]:
    return [r for r in plan["resources"] if r["type"].rsplit(":", 1)[-1] == kind]


def inputs(plan: dict, kind: str) -> dict:
    found = resources(plan, kind)
    assert found, f"plan has no {kind}"
    return found[0]["inputs"]


def serving(plan: dict) -> dict:
    return inputs(plan, "StatefulSet")


def pod_spec(plan: dict, kind: str = "StatefulSet") -> dict:
    return inputs(plan, kind)["spec"]["template"]["spec"]


def prefetch(plan: dict) -> dict:
    """The weights prefetch Job (the Job whose containers carry K3_TREE)."""
    for r in resources(plan, "Job"):
        spec = r["inputs"]["spec"]["template"]["spec"]
        if any(e["name"] == "K3_TREE" for c in spec["containers"] for e in c.get("env", [])):
            return r
    raise AssertionError("plan has no prefetch Job")


def vllm(plan: dict) -> dict:
    return next(c for c in pod_spec(plan)["containers"] if c["name"] == "vllm")


def gate(plan: dict) -> dict:
    """The container that runs the weights gate: vLLM's own (the gate prefixes its command)."""
    return vllm(plan)


def set_env(container: dict, name: str, value: str | None) -> None:
    """Set (or, with None, delete) a literal env var, keeping its position."""
    env = container.setdefault("env", [])
    for i, e in enumerate(env):
        if e["name"] == name:
            if value is None:
                del env[i]
            else:
                env[i] = {"name": name, "value": value}
            return
    if value is not None:
        env.append({"name": name, "value": value})


def env_of(container: dict, name: str):
    return next((e.get("value") for e in container.get("env", []) if e["name"] == name), None)


def replace_arg(container: dict, flag: str, value: str) -> None:
    args = container["args"]
    args[args.index(flag) + 1] = value


def drop_resources(plan: dict, kind: str) -> None:
    plan["resources"] = [r for r in plan["resources"] if r["type"].rsplit(":", 1)[-1] != kind]


def affinity_values(plan: dict, products: list[str]) -> None:
    terms = pod_spec(plan)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for term in terms:
        for expr in term["matchExpressions"]:
            if expr["key"] == "nvidia.com/gpu.product":
                expr["values"] = products


# --- the corpus ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    id: str
    policy: str            # the policy that must catch it (mandatory)
    mutate: Callable[[dict], None]

    def apply(self, plan: dict) -> dict:
        broken = copy.deepcopy(plan)
        self.mutate(broken)
        assert broken != plan, f"variant {self.id} changed nothing"
        return broken


CORPUS: list[Variant] = []


def variant(policy: str):
    def register(fn: Callable[[dict], None]) -> Callable[[dict], None]:
        CORPUS.append(Variant(fn.__name__, policy, fn))
        return fn
    return register


def _engine_arg(flag: str):
    return next(a for a in R.serve.engine_args if a.flag == flag)


@variant("k3-serve-flags")
def shorter_context(plan):
    replace_arg(vllm(plan), "--max-model-len", str(int(_engine_arg("--max-model-len").value) // 2))


@variant("k3-serve-flags")
def custom_all_reduce_back_on(plan):
    vllm(plan)["args"].remove("--disable-custom-all-reduce")


@variant("k3-serve-flags")
def engine_flags_reordered(plan):
    engine = [a for a in R.serve.engine_args]
    args = vllm(plan)["args"]
    first, last = engine[0].tokens(), engine[-1].tokens()
    i, j = args.index(first[0]), args.index(last[0])
    args[j:j + len(last)] = first
    args[i:i + len(first)] = last


@variant("k3-serve-flags")
def unlisted_engine_flag(plan):
    vllm(plan)["args"].append("--enforce-eager")


@variant("k3-serve-flags")
def allocator_env_changed(plan):
    name = R.serve.engine_env[0].name
    set_env(vllm(plan), name, "expandable_segments:False")


@variant("k3-serve-flags")
def engine_env_injected(plan):
    set_env(vllm(plan), "VLLM_ATTENTION_BACKEND", "FLASHINFER")


@variant("k3-serve-flags")
def relabelled_custom_to_dodge(plan):
    # The pod claims profile custom while the stack config says measured: still mandatory.
    serving(plan)["spec"]["template"]["metadata"]["annotations"]["k3infra.dev/profile"] = "custom"
    vllm(plan)["args"].append("--enforce-eager")


@variant("k3-image-digest")
def engine_image_by_tag(plan):
    vllm(plan)["image"] = "vllm/vllm-openai:v0.33.0"


@variant("k3-image-digest")
def latest_tag_with_digest(plan):
    name, digest = vllm(plan)["image"].split("@")
    vllm(plan)["image"] = f"{name}:latest@{digest}"


@variant("k3-image-digest")
def prefetch_image_untagged(plan):
    prefetch(plan)["inputs"]["spec"]["template"]["spec"]["containers"][0]["image"] = "python"


@variant("k3-weights-revision")
def revision_is_a_branch(plan):
    set_env(prefetch(plan)["inputs"]["spec"]["template"]["spec"]["containers"][0],
            "K3_REVISION", "main")


@variant("k3-weights-revision")
def server_serves_another_revision(plan):
    args = vllm(plan)["args"]
    args[0] = args[0].rsplit("/", 1)[0] + "/" + OTHER_REVISION


@variant("k3-tree-digest")
def gate_expects_another_digest(plan):
    set_env(gate(plan), "K3_EXPECT_TREE_DIGEST", "sha256:" + "ab" * 32)


@variant("k3-tree-digest")
def prefetch_skips_digest_check(plan):
    set_env(prefetch(plan)["inputs"]["spec"]["template"]["spec"]["containers"][0],
            "K3_EXPECT_TREE_DIGEST", None)


@variant("k3-tree-digest")
def annotation_digest_altered(plan):
    serving(plan)["spec"]["template"]["metadata"]["annotations"]["k3infra.dev/tree-digest"] = (
        "sha256:" + "cd" * 32)


@variant("k3-receipt-annotations")
def claims_another_receipt(plan):
    serving(plan)["spec"]["template"]["metadata"]["annotations"]["k3infra.dev/receipt"] = (
        "someone-elses-run")


@variant("k3-receipt-annotations")
def claims_another_engine_commit(plan):
    serving(plan)["spec"]["template"]["metadata"]["annotations"]["k3infra.dev/engine-commit"] = (
        "0123456789abcdef0123456789abcdef01234567")


@variant("k3-receipt-annotations")
def claims_a_shorter_engine_commit(plan):
    serving(plan)["spec"]["template"]["metadata"]["annotations"]["k3infra.dev/engine-commit"] = (
        R.engine.commit[:7])


@variant("k3-gpu-count")
def half_the_gpus(plan):
    vllm(plan)["resources"]["limits"]["nvidia.com/gpu"] = str(R.measured_gpu.gpus_per_node // 2)


@variant("k3-gpu-count")
def gpus_not_requested(plan):
    del vllm(plan)["resources"]["requests"]["nvidia.com/gpu"]


@variant("k3-gpu-product")
def any_gpu_node(plan):
    del pod_spec(plan)["affinity"]["nodeAffinity"]


@variant("k3-gpu-product")
def b200_allowed_too(plan):
    affinity_values(plan, [R.hardware.gpu_product_label, "NVIDIA-B200"])


@variant("k3-hbm-fit")
def placed_on_b200(plan):
    affinity_values(plan, ["NVIDIA-B200"])


@variant("k3-hbm-fit")
def placed_on_gb300(plan):
    affinity_values(plan, ["NVIDIA-GB300"])


@variant("k3-dev-shm")
def shm_on_disk(plan):
    vol = next(v for v in pod_spec(plan)["volumes"] if v["name"] == "dshm")
    vol["emptyDir"].pop("medium")


@variant("k3-dev-shm")
def shm_not_mounted(plan):
    c = vllm(plan)
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/dev/shm"]


@variant("k3-startup-budget")
def probe_gives_up_early(plan):
    vllm(plan)["startupProbe"]["failureThreshold"] = 30


@variant("k3-startup-budget")
def engine_ready_timeout_default(plan):
    set_env(vllm(plan), "VLLM_ENGINE_READY_TIMEOUT_S", "600")


@variant("k3-startup-budget")
def no_startup_probe(plan):
    del vllm(plan)["startupProbe"]


@variant("k3-serving-gate")
def serving_does_not_wait(plan):
    sts = resources(plan, "StatefulSet")[0]
    job = prefetch(plan)["urn"]
    sts["dependsOn"] = [d for d in sts["dependsOn"] if d != job]


@variant("k3-serving-gate")
def vllm_starts_without_the_gate(plan):
    vllm(plan)["command"] = ["vllm", "serve"]


@variant("k3-serving-gate")
def gate_only_in_an_init_container(plan):
    """The old layout: a restart of the vLLM container would skip the gate."""
    c = vllm(plan)
    pod_spec(plan)["initContainers"] = [{**copy.deepcopy(c), "name": "weights-gate",
                                         "command": c["command"][:3] + ["k3-gate", "true"]}]
    c["command"] = ["vllm", "serve"]


@variant("k3-serving-gate")
def weights_mounted_writable(plan):
    next(m for m in vllm(plan)["volumeMounts"] if m["name"] == "weights")["readOnly"] = False


@variant("k3-serving-gate")
def prefetch_not_awaited(plan):
    meta = prefetch(plan)["inputs"]["metadata"]
    meta.setdefault("annotations", {})["pulumi.com/skipAwait"] = "true"


@variant("k3-no-literal-secrets")
def api_key_inline(plan):
    c = vllm(plan)
    c["env"] = [e for e in c["env"] if e["name"] != "VLLM_API_KEY"]
    c["env"].append({"name": "VLLM_API_KEY", "value": "correct-horse-battery-staple"})


@variant("k3-no-literal-secrets")
def hf_token_inline(plan):
    set_env(prefetch(plan)["inputs"]["spec"]["template"]["spec"]["containers"][0],
            "HF_TOKEN", "hf_" + "aB3dE5fG7h" * 4)


@variant("k3-no-literal-secrets")
def hf_token_in_configmap(plan):
    inputs(plan, "ConfigMap")["data"]["token.txt"] = "hf_" + "Zy9Xw8Vu7T" * 4


@variant("k3-pod-sandbox")
def privileged_server(plan):
    vllm(plan)["securityContext"]["privileged"] = True


@variant("k3-pod-sandbox")
def host_network(plan):
    pod_spec(plan)["hostNetwork"] = True


@variant("k3-pod-sandbox")
def ipc_lock_capability(plan):
    vllm(plan)["securityContext"]["capabilities"]["add"] = ["IPC_LOCK", "SYS_ADMIN"]


@variant("k3-pod-sandbox")
def host_ipc_on_prefetch(plan):
    prefetch(plan)["inputs"]["spec"]["template"]["spec"]["hostIPC"] = True


@variant("k3-host-path")
def docker_socket(plan):
    spec = prefetch(plan)["inputs"]["spec"]["template"]["spec"]
    spec["volumes"].append({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}})


@variant("k3-host-path")
def weights_on_host_in_shared_mode(plan):
    vol = next(v for v in pod_spec(plan)["volumes"] if v["name"] == "weights")
    vol.pop("persistentVolumeClaim", None)
    vol["hostPath"] = {"path": "/", "type": "Directory"}


@variant("k3-resources")
def unbounded_prefetch(plan):
    del prefetch(plan)["inputs"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]


@variant("k3-resources")
def gate_without_requests(plan):
    del gate(plan)["resources"]["requests"]


@variant("k3-resources")
def engine_without_a_disk_limit(plan):
    del vllm(plan)["resources"]["limits"]["ephemeral-storage"]


@variant("k3-network-policy")
def no_network_policy(plan):
    drop_resources(plan, "NetworkPolicy")


@variant("k3-network-policy")
def network_policy_allows_all(plan):
    for r in resources(plan, "NetworkPolicy"):
        r["inputs"]["spec"]["ingress"] = [{}]


@variant("k3-disruption-budget")
def no_disruption_budget(plan):
    drop_resources(plan, "PodDisruptionBudget")


@variant("k3-disruption-budget")
def budget_selects_nothing(plan):
    inputs(plan, "PodDisruptionBudget")["spec"]["selector"] = {
        "matchLabels": {"app.kubernetes.io/name": "not-k3"}}


# --- the inference gateway (k3:gateway): a gateway render replaces the plan ----------------

def _with_gateway(plan: dict) -> None:
    from conftest import render

    g = copy.deepcopy(render("existing", "gateway.enabled=true", "gateway.className=eg",
                             "replicas=3").plan())
    plan["resources"], plan["config"] = g["resources"], g["config"]


def _named(plan: dict, kind: str, name: str) -> dict:
    return next(r["inputs"] for r in resources(plan, kind) if r["inputs"]["metadata"]["name"] == name)


@variant("k3-gateway-front-door")
def gateway_serving_service_load_balancer(plan):
    _with_gateway(plan)
    _named(plan, "Service", "kimi-k3")["spec"]["type"] = "LoadBalancer"


@variant("k3-gateway-front-door")
def gateway_serving_service_external_ip(plan):
    _with_gateway(plan)
    _named(plan, "Service", "kimi-k3")["spec"]["externalIPs"] = ["203.0.113.7"]


@variant("k3-gateway-front-door")
def gateway_bypassed_from_another_namespace(plan):
    _with_gateway(plan)
    _named(plan, "NetworkPolicy", "kimi-k3-serving")["spec"]["ingress"][0]["from"].append(
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "clients"}}})


@variant("k3-gateway-front-door")
def gateway_proxy_peer_widened_to_its_namespace(plan):
    _with_gateway(plan)
    del _named(plan, "NetworkPolicy", "kimi-k3-serving")["spec"]["ingress"][0]["from"][0]["podSelector"]


# --- issue 28, point 5: behaviour, not shape ----------------------------------------------
# Each keeps what the shape checks look at (args, a `gate` word, the env names) and changes
# what runs or what reaches the engine.

def _script(plan) -> list:
    return vllm(plan)["command"]


def _edit_script(plan, old: str, new: str) -> None:
    command = _script(plan)
    assert old in command[2], old
    command[2] = command[2].replace(old, new)


def _inject(plan, kind: str, name: str, body: dict) -> dict:
    """A new object of `kind`, registered like the render's own (a copy of one of them)."""
    like = copy.deepcopy(resources(plan, kind)[0])
    like["name"] = name
    like["urn"] = like["urn"].rsplit("::", 1)[0] + "::" + name
    like["inputs"] = body
    plan["resources"].append(like)
    return like


def _namespace(plan) -> str:
    return serving(plan)["metadata"]["namespace"]


def _serving_labels(plan) -> dict:
    return dict(serving(plan)["spec"]["selector"]["matchLabels"])


_GATE_FAIL = "|| { k3_phase gate fail; exit 1; }"


@variant("k3-engine-command")
def gate_failure_ignored(plan):
    _edit_script(plan, _GATE_FAIL, "|| true")


@variant("k3-engine-command")
def gate_removed_phase_echoes_kept(plan):
    command = _script(plan)
    lines = command[2].split("\n")
    command[2] = "\n".join(line for line in lines if "K3_RUNTIME_BOOTSTRAP\" gate" not in line)
    assert len(command[2].split("\n")) == len(lines) - 1


@variant("k3-engine-command")
def gate_moved_to_an_init_container(plan):
    command = _script(plan)
    gate_line = next(line for line in command[2].split("\n")
                     if "K3_RUNTIME_BOOTSTRAP\" gate" in line)
    command[2] = command[2].replace(gate_line + "\n", "")
    init = copy.deepcopy(vllm(plan))
    init.update(name="weights-gate", command=["sh", "-c", gate_line.split(" || ")[0]], args=[])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe", "lifecycle"):
        init.pop(probe, None)
    pod_spec(plan).setdefault("initContainers", []).append(init)


@variant("k3-engine-command")
def gate_checks_another_directory(plan):
    _edit_script(plan, 'gate "$K3_TREE"', 'gate "/weights/elsewhere"')


@variant("k3-engine-command")
def gate_reads_another_lock(plan):
    set_env(gate(plan), "K3_GATE_LOCK", "/tmp/k3-gate/lock.json")


@variant("k3-engine-command")
def gate_runs_another_bootstrap(plan):
    set_env(gate(plan), "K3_RUNTIME_BOOTSTRAP", "import sys; sys.exit(0)")


@variant("k3-engine-command")
def gate_runtime_pins_rewritten(plan):
    c = gate(plan)
    pins = json.loads(env_of(c, "K3_RUNTIME_SHA256"))
    pins["k3weights/gate.py"] = "ab" * 32
    set_env(c, "K3_RUNTIME_SHA256", json.dumps(pins))


@variant("k3-engine-command")
def script_starts_vllm_with_other_flags(plan):
    # `args` still shows the receipt's flags; the script ignores them.
    _edit_script(plan, 'exec "$@"', 'exec vllm serve "$1" --enforce-eager --max-model-len 4096')


@variant("k3-engine-command")
def allocator_overridden_inside_the_script(plan):
    _edit_script(plan, 'exec "$@"',
                 'export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False; exec "$@"')


@variant("k3-engine-command")
def second_container_runs_vllm(plan):
    extra = copy.deepcopy(vllm(plan))
    extra.update(name="sidecar", command=["python3", "-m", "vllm.entrypoints.openai.api_server"],
                 args=["--model", "/weights/elsewhere", "--host", "127.0.0.1", "--port", "8002"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        extra.pop(probe, None)
    pod_spec(plan)["containers"].append(extra)


@variant("k3-engine-command")
def startup_probe_is_tcp_on_the_proxy(plan):
    probe = vllm(plan)["startupProbe"]
    probe.pop("exec")
    probe["tcpSocket"] = {"port": serving(plan)["spec"]["template"]["spec"]["containers"][1][
        "ports"][0]["containerPort"]}


@variant("k3-engine-exposure")
def engine_listens_on_every_interface(plan):
    replace_arg(vllm(plan), "--host", "0.0.0.0")


@variant("k3-engine-exposure")
def engine_port_published_on_the_node(plan):
    port = int(vllm(plan)["args"][vllm(plan)["args"].index("--port") + 1])
    vllm(plan)["ports"] = [{"containerPort": port, "hostPort": port, "protocol": "TCP"}]


@variant("k3-engine-exposure")
def service_aimed_at_the_engine(plan):
    port = int(vllm(plan)["args"][vllm(plan)["args"].index("--port") + 1])
    _inject(plan, "Service", "kimi-k3-engine-direct", {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kimi-k3-engine", "namespace": _namespace(plan)},
        "spec": {"type": "ClusterIP", "selector": _serving_labels(plan),
                 "ports": [{"name": "engine", "port": port, "targetPort": port}]}})


@variant("k3-engine-exposure")
def serving_service_made_a_load_balancer(plan):
    for r in resources(plan, "Service"):
        if r["inputs"]["spec"].get("type") == "ClusterIP":
            r["inputs"]["spec"]["type"] = "LoadBalancer"


@variant("k3-engine-exposure")
def extra_network_policy_opens_the_engine(plan):
    port = int(vllm(plan)["args"][vllm(plan)["args"].index("--port") + 1])
    _inject(plan, "NetworkPolicy", "kimi-k3-debug", {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "kimi-k3-debug", "namespace": _namespace(plan)},
        "spec": {"podSelector": {"matchLabels": _serving_labels(plan)},
                 "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"namespaceSelector": {}}],
                              "ports": [{"protocol": "TCP", "port": port}]}]}})


@variant("k3-engine-isolation")
def privileged_namespace_and_root_engine(plan):
    for r in resources(plan, "Namespace"):
        if r["inputs"]["metadata"]["name"] == _namespace(plan):
            r["inputs"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "privileged"
    ctx = vllm(plan)["securityContext"]
    ctx.update(runAsUser=0, runAsNonRoot=False)
    pod_spec(plan)["securityContext"].update(runAsUser=0, runAsNonRoot=False)


@variant("k3-engine-isolation")
def host_path_volume_through_the_weights_claim(plan):
    pvc = inputs(plan, "PersistentVolumeClaim")
    pvc["spec"]["volumeName"] = "kimi-k3-weights-hostpath"
    _inject(plan, "PersistentVolumeClaim", "kimi-k3-weights-hostpath", {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "kimi-k3-weights-hostpath"},
        "spec": {"capacity": {"storage": "1700Gi"}, "accessModes": ["ReadWriteMany"],
                 "hostPath": {"path": "/"},
                 "claimRef": {"name": pvc["metadata"]["name"],
                              "namespace": pvc["metadata"]["namespace"]}}})
    plan["resources"][-1]["type"] = "kubernetes:core/v1:PersistentVolume"


@variant("k3-disruption-budget")
def budget_allows_every_pod_down(plan):
    inputs(plan, "PodDisruptionBudget")["spec"]["maxUnavailable"] = "100%"


@variant("k3-disruption-budget")
def budget_protects_nothing(plan):
    spec = inputs(plan, "PodDisruptionBudget")["spec"]
    spec.pop("maxUnavailable")
    spec["minAvailable"] = 0


# --- a Docker host's containers (k3infra/host), injected into the plan ---------------------

def _host_resources() -> list[dict]:
    from conftest import GOOD_REVISION, PREBUILT_IMAGE, render

    r = render("host", f"weightsRevision={GOOD_REVISION}", f"engineImage={PREBUILT_IMAGE}")
    return copy.deepcopy([res for res in r.resources if res["type"].startswith("docker:")])


def _with_host(plan: dict, name: str, mutate: Callable[[dict], None]) -> None:
    injected = _host_resources()
    mutate(next(r for r in injected if r["name"] == name)["inputs"])
    plan["resources"] += injected


@variant("k3-host-image-digest")
def host_server_image_by_tag(plan):
    _with_host(plan, "kimi-k3-vllm", lambda i: i.update(image="registry.example.com/k3/vllm-k3:v1"))


@variant("k3-host-image-digest")
def host_pulls_a_tag(plan):
    _with_host(plan, "kimi-k3-proxy-image", lambda i: i.update(name="nginx:latest"))


@variant("k3-host-serve-flags")
def host_shorter_context(plan):
    def mutate(i):
        cmd = i["command"]
        cmd[cmd.index("--max-model-len") + 1] = "8192"
    _with_host(plan, "kimi-k3-vllm", mutate)


@variant("k3-host-serve-flags")
def host_engine_env_changed(plan):
    # What the real preview shows (the analyzer sees the secret list's values).
    _with_host(plan, "kimi-k3-vllm", lambda i: i.update(envs=[
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False", "HF_HUB_OFFLINE=1",
        "VLLM_API_KEY=x", "K3_TREE=/weights/t"]))


@variant("k3-host-container-safety")
def host_privileged(plan):
    _with_host(plan, "kimi-k3-vllm", lambda i: i.update(privileged=True))


@variant("k3-host-container-safety")
def host_network_unchosen(plan):
    _with_host(plan, "kimi-k3-vllm", lambda i: i.update(networkMode="host"))


@variant("k3-host-port-binding")
def host_port_on_every_interface(plan):
    def mutate(i):
        i["ports"][0]["ip"] = "0.0.0.0"
    _with_host(plan, "kimi-k3-proxy", mutate)


@variant("k3-host-port-binding")
def host_port_without_address(plan):
    def mutate(i):
        del i["ports"][0]["ip"]
    _with_host(plan, "kimi-k3-proxy", mutate)


# --- a multi-node replica (k3:topology = multi-node; tests/test_multinode.py) ------------------
# Variants of the multi-node render's plan (MULTI_NODE_OVERRIDES), in their own list: the
# corpus above mutates the single-node render.

MULTI_NODE_OVERRIDES = ("topology=multi-node", "gpuProduct=NVIDIA-GB300", "gpuMemoryGib=267.69")
MULTI_NODE_CORPUS: list[Variant] = []


def multi_node_variant(policy: str):
    def register(fn: Callable[[dict], None]) -> Callable[[dict], None]:
        MULTI_NODE_CORPUS.append(Variant(fn.__name__, policy, fn))
        return fn
    return register


def group_template(plan: dict, role: str) -> dict:
    """The LeaderWorkerSet's leaderTemplate / workerTemplate."""
    return inputs(plan, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"][f"{role}Template"]


def group_vllm(plan: dict, role: str) -> dict:
    return next(c for c in group_template(plan, role)["spec"]["containers"] if c["name"] == "vllm")


def _drop_domain_requirement(template: dict) -> None:
    for term in template["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]:
        term["matchExpressions"] = [e for e in term["matchExpressions"]
                                    if e["key"] != "nvidia.com/gpu.clique"]


@multi_node_variant("k3-nvlink-domain")
def domain_label_missing(plan):
    for role in ("leader", "worker"):
        _drop_domain_requirement(group_template(plan, role))


@multi_node_variant("k3-nvlink-domain")
def worker_free_of_its_leaders_domain(plan):
    del group_template(plan, "worker")["spec"]["affinity"]["podAffinity"]


@multi_node_variant("k3-nvlink-domain")
def no_imex_channel(plan):
    for role in ("leader", "worker"):
        del group_template(plan, role)["spec"]["resourceClaims"]


@multi_node_variant("k3-serve-flags-multi-node")
def worker_not_headless(plan):
    group_vllm(plan, "worker")["args"].remove("--headless")


@multi_node_variant("k3-serve-flags-multi-node")
def multi_node_shorter_context(plan):
    replace_arg(group_vllm(plan, "leader"), "--max-model-len",
                str(int(_engine_arg("--max-model-len").value) // 2))


@multi_node_variant("k3-serve-flags-multi-node")
def multi_node_pipeline_parallel_added(plan):
    group_vllm(plan, "leader")["args"][1:1] = ["--pipeline-parallel-size", "2"]


@multi_node_variant("k3-serve-flags-multi-node")
def worker_ranked_as_leader(plan):
    replace_arg(group_vllm(plan, "worker"), "--node-rank", "0")


@multi_node_variant("k3-gpu-count")
def group_of_three(plan):
    inputs(plan, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["size"] = 3


@multi_node_variant("k3-gpu-count")
def eight_gpus_per_tray(plan):
    res = group_vllm(plan, "leader")["resources"]
    res["requests"]["nvidia.com/gpu"] = res["limits"]["nvidia.com/gpu"] = "8"


@multi_node_variant("k3-gpu-product")
def multi_node_on_b300(plan):
    for role in ("leader", "worker"):
        for term in group_template(plan, role)["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]:
            for e in term["matchExpressions"]:
                if e["key"] == "nvidia.com/gpu.product":
                    e["values"] = ["NVIDIA-B200"]


@multi_node_variant("k3-receipt-annotations")
def group_labelled_measured(plan):
    group_template(plan, "leader")["metadata"]["annotations"][
        "k3infra.dev/measured-configuration"] = "true"


# --- issue 48, point 8: NetworkPolicies judged by what a pod may reach, not their shape ----
# Each keeps a NetworkPolicy that selects the serving pods and "restricts" ingress (every
# rule names peers), which is all k3-network-policy looks at; the effective exposure widens.

def _with_clients(plan: dict) -> None:
    """A render whose API port admits one client namespace (k3:network.allowFromNamespaces)."""
    from conftest import render

    g = copy.deepcopy(render("existing", 'network.allowFromNamespaces=["clients"]').plan())
    plan["resources"], plan["config"] = g["resources"], g["config"]


def _api_rule(plan: dict) -> dict:
    """The serving policy's rule for the API port (k3:serving.port, 8000)."""
    rules = _named(plan, "NetworkPolicy", "kimi-k3-serving")["spec"]["ingress"]
    return next(r for r in rules if any(p.get("port") == 8000 for p in r.get("ports", [])))


@variant("k3-network-exposure")
def api_rule_widened_to_every_namespace_and_the_internet(plan):
    _with_clients(plan)
    _api_rule(plan)["from"] = [{"namespaceSelector": {}}, {"ipBlock": {"cidr": "0.0.0.0/0"}}]


@variant("k3-network-exposure")
def api_rule_namespace_by_expression_everyone_but_one(plan):
    _with_clients(plan)
    _api_rule(plan)["from"] = [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}}]


@variant("k3-network-exposure")
def api_rule_on_every_port(plan):
    _with_clients(plan)
    del _api_rule(plan)["ports"]


@variant("k3-network-exposure")
def extra_policy_admits_a_wide_block(plan):
    _inject(plan, "NetworkPolicy", "kimi-k3-extra", {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "kimi-k3-extra", "namespace": _namespace(plan)},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                              "ports": [{"port": 9090, "protocol": "TCP"}]}]}})


@variant("k3-network-exposure")
def serving_egress_to_the_internet(plan):
    _named(plan, "NetworkPolicy", "kimi-k3-serving")["spec"]["egress"].append(
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443, "protocol": "TCP"}]})


@variant("k3-network-exposure")
def prefetch_egress_into_the_cluster(plan):
    hub = _named(plan, "NetworkPolicy", "kimi-k3-weights-prefetch")["spec"]["egress"][1]
    for peer in hub["to"]:
        peer["ipBlock"].pop("except", None)


@variant("k3-network-exposure")
def prefetch_egress_to_instance_metadata(plan):
    """A rule of its own for 169.254.169.254: the Hub's rule still cuts link-local."""
    _named(plan, "NetworkPolicy", "kimi-k3-weights-prefetch")["spec"]["egress"].append(
        {"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}], "ports": [{"port": 80, "protocol": "TCP"}]})


@variant("k3-network-exposure")
def prefetch_except_narrowed_past_instance_metadata(plan):
    """The same shape of rule, its `except` narrowed to a link-local /24 that leaves
    169.254.169.254 out: judged by the addresses the block admits, not by its shape."""
    hub = _named(plan, "NetworkPolicy", "kimi-k3-weights-prefetch")["spec"]["egress"][1]
    block = hub["to"][0]["ipBlock"]
    block["except"] = [c if c != "169.254.0.0/16" else "169.254.0.0/24" for c in block["except"]]


@variant("k3-network-exposure")
def serving_unisolated_by_dropping_its_policies(plan):
    """No NetworkPolicy selects the serving pods any more: everything reaches them. The
    benchmark's policy still "restricts" what it selects, but not the serving pods."""
    plan["resources"] = [r for r in plan["resources"]
                         if not (r["type"].endswith(":NetworkPolicy")
                                 and r["inputs"]["metadata"]["name"] in
                                 ("kimi-k3-serving", "kimi-k3-default-deny"))]
    _inject(plan, "NetworkPolicy", "kimi-k3-looks-restrictive", {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "kimi-k3-looks-restrictive", "namespace": _namespace(plan)},
        "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "serving",
                                                 "app.kubernetes.io/name": "kimi-k3"}},
                 "policyTypes": ["Egress"], "egress": []}})
