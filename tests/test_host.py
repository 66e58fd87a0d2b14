"""One Docker host (k3infra/host): K3HostStack under the SDK's mocks with the
`docker:host` provider config, compose.yaml checked by compose-go's loader (the one
Docker Compose v2 uses), the refusals, and the host policies."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from k3infra.config import ConfigError, parse_stack_config, read_stack_file, stack_file
from k3infra.host import compose as hc
from k3infra.host.component import PrefetchFailed, prefetch_verdict
from k3infra.host.plan import PROXY_START, host_plan
from k3infra.host.preflight import PreflightError, box_checks, check_weights_space
from k3infra.plan import resolve_plan
from k3infra.policies import host as hp
from k3infra.render import render_stack
from k3infra.serving import proxy

from conftest import GOOD_REVISION, PREBUILT_IMAGE, ROOT, render

R_ID = "kimi-k3-8xb300-2026-07-29"
MODEL_DIR = f"/weights/moonshotai--Kimi-K3/{GOOD_REVISION}"
# The receipt's serve command, literally (k3infra/receipt/*.yaml engine args, then the
# surface flags k3infra sets: vLLM on the loopback behind the proxy).
SERVE = ["vllm", "serve", MODEL_DIR, "--tensor-parallel-size", "8", "--enable-expert-parallel",
         "--max-model-len", "40960", "--moe-backend", "marlin", "--kda-prefill-backend",
         "triton", "--disable-custom-all-reduce", "--block-size", "128",
         "--served-model-name", "kimi-k3", "--host", "127.0.0.1", "--port", "8001"]
GOOD = (f"weightsRevision={GOOD_REVISION}", f"engineImage={PREBUILT_IMAGE}")
DOCKER = "docker:index/container:Container"


def host_render(*overrides: str):
    return render("host", *GOOD, *overrides)


def containers(r) -> dict[str, dict]:
    return {res["name"]: res for res in r.by_type(DOCKER)}


def host_cfg(**host):
    raw, secrets = read_stack_file(stack_file("host", ROOT))
    raw.update({"k3:weightsRevision": GOOD_REVISION, "k3:engineImage": PREBUILT_IMAGE,
                "k3:apiKey": "k3-test.key+1="})
    raw["k3:host"] = {**raw["k3:host"], **host}
    return parse_stack_config(raw, tuple(secrets), receipt=load())


# --- the stack under the mocks ----------------------------------------------------------

def test_the_template_names_the_docker_host_and_carries_no_secret():
    text = (ROOT / "stacks/examples/Pulumi.host.yaml").read_text()
    raw, _ = read_stack_file(ROOT / "stacks/examples/Pulumi.host.yaml")
    assert raw["docker:host"] == "unix:///var/run/docker.sock"
    assert "secure:" not in text and "pulumi stack init host" in text
    assert "cp stacks/examples/Pulumi.host.yaml stacks/" in text


def test_host_stack_registers_image_prefetch_proxy_server_in_order():
    r = host_render()
    types = [(res["type"], res["name"]) for res in r.resources]
    # The stack program's instance is kimi-k3: every name derives from it.
    assert {("k3infra:index:K3HostStack", "kimi-k3"),
            ("k3infra:index:EngineBuild", "kimi-k3-engine")} <= set(types)
    # Independent registrations race; the containers' order is their dependencies'.
    assert {t for t in types if t[0].startswith("docker:")} == {
        ("docker:index/remoteImage:RemoteImage", "kimi-k3-engine-image"),
        ("docker:index/remoteImage:RemoteImage", "kimi-k3-proxy-image"),
        ("docker:index/volume:Volume", "kimi-k3-cache"),
        (DOCKER, "kimi-k3-prefetch"), (DOCKER, "kimi-k3-cache-owner"),
        (DOCKER, "kimi-k3-vllm"), (DOCKER, "kimi-k3-proxy")}
    assert [n for t, n in types if t == DOCKER][-1] == "kimi-k3-vllm"
    c = containers(r)
    assert {res["inputs"]["name"] for res in c.values()} == \
        {"kimi-k3-prefetch", "kimi-k3-cache-owner", "kimi-k3-vllm", "kimi-k3-proxy"}
    urn = {res["name"]: res["urn"] for res in r.resources}
    assert urn["kimi-k3-engine-image"] in c["kimi-k3-prefetch"]["dependsOn"]
    assert urn["kimi-k3-prefetch"] in c["kimi-k3-vllm"]["dependsOn"]
    assert {urn["kimi-k3-cache"], urn["kimi-k3-engine-image"]} <= set(
        c["kimi-k3-cache-owner"]["dependsOn"])
    assert urn["kimi-k3-cache-owner"] in c["kimi-k3-vllm"]["dependsOn"]
    # The proxy owns the network namespace vllm joins (plan.py says why).
    assert urn["kimi-k3-proxy"] in c["kimi-k3-vllm"]["dependsOn"]
    assert urn["kimi-k3-vllm"] not in c["kimi-k3-proxy"]["dependsOn"]
    labels = {lb["label"]: lb["value"] for lb in c["kimi-k3-vllm"]["inputs"]["labels"]}
    assert labels["app.kubernetes.io/instance"] == "kimi-k3"
    assert labels["app.kubernetes.io/name"] == "kimi-k3"
    assert labels["k3infra.dev/receipt"] == R_ID
    assert labels["k3infra.dev/engine-commit"] == "f68f4fdd"
    assert labels["k3infra.dev/engine-version"] == "0.23.1rc1.dev1475+gf68f4fdde"
    assert not any(res["type"].startswith("kubernetes:") for res in r.resources)


def test_server_runs_the_gate_then_the_receipts_exact_serve_command():
    c = containers(host_render())["kimi-k3-vllm"]["inputs"]
    tokens = [*c["entrypoints"], *c["command"]]
    # The pods' entrypoint (k3infra/serving/pod/start.sh): phase markers and the keyed
    # compile cache, the bootstrap-checked gate, then `exec vllm serve ...`.
    assert tokens[:2] == ["sh", "-c"]
    gate = ('python3 -c "$K3_RUNTIME_BOOTSTRAP" gate "$K3_TREE" --lock "$K3_GATE_LOCK" '
            '--expect-digest "$K3_EXPECT_TREE_DIGEST" --repo "$K3_REPO" '
            '--revision "$K3_REVISION" --mode "$K3_GATE_MODE" --state-dir "$K3_GATE_STATE" '
            '--workers "$K3_HASH_WORKERS"')
    assert tokens[2] == (ROOT / "k3infra/serving/pod/start.sh").read_text()
    assert (f"k3_phase gate start\n{gate} || {{ k3_phase gate fail; exit 1; }}\n"
            'k3_phase gate end\n') in tokens[2]
    assert tokens[2].endswith('k3_phase engine start\nexec "$@"\n')
    assert tokens[3:] == ["k3-start", *SERVE]
    assert c["image"] == PREBUILT_IMAGE and c["gpus"] == "all"
    assert c["shmSize"] == 64 * 1024 and c["privileged"] is False
    assert {u["name"]: (u["soft"], u["hard"]) for u in c["ulimits"]} == {
        "memlock": (-1, -1), "stack": (67108864, 67108864), "nofile": (1048576, 1048576)}
    # In the proxy's network namespace: the proxy publishes the ports (plan.py says why).
    assert c["ports"] == [] and c["networkMode"] == "container:kimi-k3-proxy"
    proxy = containers(host_render())["kimi-k3-proxy"]["inputs"]
    assert proxy["ports"] == [
        {"internal": 8000, "external": 8000, "ip": "127.0.0.1", "protocol": "tcp"},
        {"internal": 9090, "external": 9090, "ip": "127.0.0.1", "protocol": "tcp"}]
    assert proxy["networkMode"] == "bridge"
    # The startupProbe's allowance for the receipt's 1561.0 GB with the default
    # k3:coldStart (docs/coldstart.md): 10 s x ceil((1171 gate + 3751 engine + 60) / 10).
    assert c["healthcheck"]["startPeriod"] == "4990s"
    assert "http://127.0.0.1:8001/health" in c["healthcheck"]["tests"][-1]
    assert c["restart"] == "unless-stopped" and c["wait"] is True
    assert {m["target"]: m["readOnly"] for m in c["mounts"]} == {"/weights": True, "/cache": False}
    assert set(c["tmpfs"]) == {"/tmp", "/var/run/k3-gate"}
    uploads = {u["file"] for u in c["uploads"]}
    assert {"/etc/k3/weights/k3weights/gate.py", "/etc/k3/weights/k3weights/verify.py",
            "/etc/k3/weights/prefetch.sh"} <= uploads


def test_receipt_is_explicit_and_names_follow_the_instance():
    from k3infra.host.component import K3HostStack

    with pytest.raises(TypeError, match=r"args\['receipt'\] must be the Receipt"):
        K3HostStack("kimi-k3", {"config": host_cfg(), "receipt": None})
    with pytest.raises(TypeError, match=r"args\['receipt'\] must be the Receipt"):
        K3HostStack("kimi-k3", {"config": host_cfg()})
    with pytest.raises(ConfigError) as exc:
        K3HostStack("Edge_A", {"config": host_cfg(), "receipt": load()})
    assert exc.value.key == "K3HostStack name" and "DNS-1035" in str(exc.value)
    # Another instance: its own Compose project, containers and cache volume.
    cfg = host_cfg()
    doc = hc.compose_document(host_plan(resolve_plan(load(), cfg), cfg, "edge-a", PREBUILT_IMAGE),
                              {})
    assert doc["name"] == "edge-a"
    assert {n: svc["container_name"] for n, svc in doc["services"].items()} == {
        "prefetch": "edge-a-prefetch", "cache-owner": "edge-a-cache-owner",
        "vllm": "edge-a-vllm", "proxy": "edge-a-proxy"}
    assert doc["volumes"] == {"edge-a-cache": {"name": "edge-a-cache"}}
    assert doc["services"]["vllm"]["network_mode"] == "service:proxy"
    assert "network_mode" not in doc["services"]["proxy"]


def test_secrets_never_reach_the_plan_and_env_comes_from_the_plan():
    r = render_stack("host", [*GOOD, "k3:apiKey=plain-text-key-123"], ROOT)
    text = str(r.plan())
    assert "plain-text-key-123" not in text
    c = containers(r)
    # The env list holds the key, so Pulumi keeps the whole list secret.
    assert c["kimi-k3-vllm"]["inputs"]["envs"] == "[secret]"
    assert c["kimi-k3-proxy"]["inputs"]["envs"] == "[secret]"
    # The engine image is an Output: it reaches the env resolved, never str()'d (issue 33's
    # runs of the README's host render showed "Calling __str__ on an Output[T]").
    assert not [w for w in r.warnings if "__str__" in w], r.warnings
    cfg = host_cfg()
    env = host_plan(resolve_plan(load(), cfg), cfg, "kimi-k3", PREBUILT_IMAGE).container("vllm").env
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == "3751"
    assert env["K3_GATE_MODE"] == "warm" and env["K3_GATE_STATE"] == "/var/run/k3-gate"
    assert "PYTHONPATH" not in env and "VLLM_API_KEY" not in env
    assert env["K3_EXPECT_TREE_DIGEST"] == \
        "sha256:ebf0b1a75a29ab5e01f319252302c418d0e8f9340e402950497094a6fc64aced"


def load():
    from k3infra.receipt import load_receipt

    return load_receipt()


def test_outputs():
    out = host_render().outputs
    assert out["endpoint"] == "http://127.0.0.1:8000"
    assert out["imageDigest"] == "sha256:" + "5e" * 32
    assert out["weightsRevision"] == GOOD_REVISION
    assert out["treeDigest"] == "sha256:ebf0b1a75a29ab5e01f319252302c418d0e8f9340e402950497094a6fc64aced"
    assert out["profile"] == "measured" and out["licenseName"] == "Kimi K3 License"


def test_prefetch_verdict_fails_with_the_last_log_lines(monkeypatch):
    assert prefetch_verdict(0, "done", False) == "ok"
    logs = "\n".join(f"line {i}" for i in range(100))
    with pytest.raises(PrefetchFailed) as exc:
        prefetch_verdict(1, logs, False)
    assert "exited 1" in str(exc.value) and "line 99" in str(exc.value)
    assert "line 69" not in str(exc.value) and "line 70" in str(exc.value)
    # An offline render still refuses a failed prefetch; an unknown exit code passes it.
    with pytest.raises(PrefetchFailed):
        prefetch_verdict(1, logs, True)
    from pulumi import runtime

    # `pulumi up` (not a dry run): no exit code refuses, whatever the environment says.
    monkeypatch.setattr(runtime, "is_dry_run", lambda: False)
    monkeypatch.setenv("K3INFRA_OFFLINE_RENDER", "1")
    with pytest.raises(PrefetchFailed):
        prefetch_verdict(None, None, False)
    assert prefetch_verdict(None, None, True) == "unknown until pulumi up"


_FAILED_PREFETCH = """
import sys
from pathlib import Path
from k3infra.render import load_config, run_program

class FailedPrefetch:
    # The provider's report for a prefetch container that exited 3.
    def new_resource(self, args):
        outputs = dict(args.inputs)
        if args.name == "kimi-k3-prefetch":
            outputs.update(exitCode=3, containerLogs="k3 weights: not enough free space\\n")
        if args.name == "kimi-k3-vllm":
            print("SERVER REGISTERED")
        return f"{args.name}-id", outputs

    def call(self, args):
        return {}

root = Path(sys.argv[1])
raw, secrets = load_config("host", sys.argv[2:], root)
try:
    run_program("host", raw, secrets, root, mocks=FailedPrefetch())
except Exception as exc:
    seen = []
    while exc is not None and all(exc is not s for s in seen):
        seen.append(exc)
        print("CHAIN", str(exc).replace("\\n", " | "))
        exc = exc.__cause__ or exc.__context__
    sys.stdout.flush()
    sys.exit(7)
"""


def test_a_failed_prefetch_fails_the_program_before_the_server():
    """In a subprocess: asyncio reports each collected copy of the failed verdict at exit."""
    import sys

    done = subprocess.run([sys.executable, "-c", _FAILED_PREFETCH, str(ROOT), *GOOD],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 7, done.stderr[-2000:]
    assert "SERVER REGISTERED" not in done.stdout
    assert any("exited 3" in line and "not enough free space" in line
               for line in done.stdout.splitlines() if line.startswith("CHAIN"))


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and all(exc is not s for s in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


# --- refusals -------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, key, words", [
    (("k3:engineImage=registry.example.com/k3/vllm-k3:latest",), "k3:engineImage", "digest"),
    (("k3:host.publishAddress=0.0.0.0",), "k3:host", "publishAllInterfaces"),
    (("k3:host.networkMode=host",), "k3:host", "publishAllInterfaces"),
    (("k3:host.freeGB=1000",), "k3:host.freeGB", "1561.0 GB"),
    (("k3:host.weightsRoot=relative/path",), "k3:host.weightsRoot", "absolute"),
    (('k3:engine={"build": "in-cluster"}',), "k3:engine.build", "no cluster"),
])
def test_refusals_name_the_key_and_the_value(overrides, key, words):
    with pytest.raises(Exception) as exc:
        render_stack("host", [f"weightsRevision={GOOD_REVISION}", f"engineImage={PREBUILT_IMAGE}",
                              *overrides], ROOT)
    e = next((x for x in _chain(exc.value) if isinstance(x, ConfigError)), exc.value)
    assert isinstance(e, ConfigError), exc.value
    assert e.key == key and words in str(e)


def test_free_space_error_carries_the_figures():
    with pytest.raises(PreflightError) as exc:
        check_weights_space(host_cfg(freeGB=1500), load())
    assert "1500.0 GB free on /mnt/k3-weights" in str(exc.value)
    assert "1561000000000 bytes" in str(exc.value)
    assert "1700.0 GB" in check_weights_space(host_cfg(freeGB=1700), load()).detail


def test_placeholder_digest_and_missing_api_key_refuse_an_update(monkeypatch):
    from k3infra import gates

    monkeypatch.setattr(gates, "is_update", lambda offline_render=False: True)
    cfg = host_cfg()
    problems = gates.deployment_gates(load(), cfg.model_copy(update={
        "engine_image": "registry.example.com/k3/vllm-k3@sha256:" + "0" * 64}))
    assert "k3:engineImage" in [g.key for g in problems if g.refuses]
    raw, secrets = read_stack_file(stack_file("host", ROOT))
    with pytest.raises(ConfigError) as exc:
        parse_stack_config(raw, tuple(secrets), receipt=load())
    assert exc.value.key == "k3:apiKey"


def test_all_interfaces_is_an_explicit_warned_choice():
    r = host_render("k3:host.publishAddress=0.0.0.0", "k3:host.publishAllInterfaces=true")
    assert containers(r)["kimi-k3-proxy"]["inputs"]["ports"][0]["ip"] == "0.0.0.0"
    assert any("publishAllInterfaces" in w and "every interface" in w for w in r.warnings)


def test_box_checks_state_the_receipts_figures():
    lines = "\n".join(b.line() for b in box_checks(host_cfg(), load()))
    assert "driver branch >= 580" in lines and "8 GPUs" in lines and "274113 MiB" in lines
    assert "nvidia-smi --query-gpu=driver_version" in lines and "docker info" in lines
    assert "ulimit -n; ulimit -l" in lines and "df -B1000000000" in lines


# --- the proxy's key map --------------------------------------------------------------

@pytest.mark.parametrize("key", ["abc123", "k3.test+key/with~chars-_=", "a.b+c=="])
def test_proxy_start_writes_the_same_key_map_as_the_pod(tmp_path, key):
    """Run PROXY_START's key-map half with the real sh, grep and sed: the file equals
    proxy.keys_map (what the pod's Secret holds)."""
    script = PROXY_START.replace("/tmp/keys.map", str(tmp_path / "keys.map")).split("; exec nginx")[0]
    subprocess.run(["sh", "-c", script, "nginx.conf"], check=True,
                   env={"PATH": os.environ["PATH"], "VLLM_API_KEY": key})
    assert (tmp_path / "keys.map").read_text() == proxy.keys_map(key)


def test_proxy_start_refuses_a_key_that_is_not_a_bearer_token(tmp_path):
    script = PROXY_START.replace("/tmp/keys.map", str(tmp_path / "keys.map"))
    done = subprocess.run(["sh", "-c", script, "nginx.conf"], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "VLLM_API_KEY": "bad key\"; x"})
    assert done.returncode == 1 and "not an RFC 6750 bearer token" in done.stderr
    assert not (tmp_path / "keys.map").exists()


# --- compose.yaml ---------------------------------------------------------------------

def _render_cli(tmp_path: Path, *overrides: str) -> Path:
    from k3infra.cli import main

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        args = ["render", "--stack", "host", "--out", str(tmp_path)]
        for o in (*GOOD, *overrides):
            args += ["--config", o]
        assert main(args) == 0
    finally:
        os.chdir(cwd)
    return tmp_path / "compose.yaml"


def test_render_writes_compose_with_the_same_containers(tmp_path):
    doc = yaml.safe_load(_render_cli(tmp_path).read_text())
    s = doc["services"]
    assert list(s) == ["prefetch", "cache-owner", "proxy", "vllm"]
    # The compile-cache volume, given to the engine's group by a one-shot container with
    # no capability and no network (Docker makes a named volume root-owned).
    owner = s["cache-owner"]
    assert owner["command"] == ["sh", "-c", "chgrp 1000 /cache && chmod 2775 /cache"]
    assert (owner["user"], owner["cap_drop"], owner["network_mode"], owner["restart"]) == \
        ("0:1000", ["ALL"], "none", "no")
    assert "cap_add" not in owner and owner["read_only"] is True
    assert owner["volumes"] == [{"type": "volume", "source": "kimi-k3-cache", "target": "/cache",
                                 "read_only": False}]
    assert s["vllm"]["depends_on"]["cache-owner"] == {
        "condition": "service_completed_successfully"}
    assert s["vllm"]["image"] == PREBUILT_IMAGE == s["prefetch"]["image"]
    assert s["vllm"]["command"][:2] == ["sh", "-c"]
    assert s["vllm"]["command"][3:] == ["k3-start", *SERVE]
    assert doc["x-k3infra"]["serveCommand"] == " ".join(SERVE)
    assert s["vllm"]["depends_on"] == {"prefetch": {"condition": "service_completed_successfully"},
                                       "cache-owner": {"condition": "service_completed_successfully"},
                                       "proxy": {"condition": "service_started"}}
    assert s["vllm"]["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 8, "capabilities": ["gpu"]}]
    assert s["vllm"]["healthcheck"]["start_period"] == "4990s"
    # The proxy owns the network namespace and the ports; vllm joins it (plan.py says why).
    assert s["proxy"]["ports"][0] == {"host_ip": "127.0.0.1", "published": "8000", "target": 8000,
                                      "protocol": "tcp"}
    assert "ports" not in s["vllm"] and "depends_on" not in s["proxy"]
    assert s["vllm"]["env_file"] == [{"path": "k3-api-key.env", "required": True}]
    assert "VLLM_API_KEY" not in s["vllm"]["environment"]
    assert s["vllm"]["network_mode"] == "service:proxy" and "network_mode" not in s["proxy"]
    assert "env_file" not in s["prefetch"]          # no HF token configured
    assert not any(svc.get("privileged") for svc in s.values())


def _compose_config_binary() -> str | None:
    """compose-config: K3INFRA_COMPOSE_CONFIG, else the testbed bin dir `make e2e` sets
    (K3INFRA_TESTBED_BIN; tools/testbed/build.sh links every part's binaries there), else
    PATH, else the newest complete build in the testbed cache (K3INFRA_TESTBED_CACHE)."""
    explicit = os.environ.get("K3INFRA_COMPOSE_CONFIG")
    if explicit:
        return explicit
    bin_dir = os.environ.get("K3INFRA_TESTBED_BIN")
    if bin_dir and (Path(bin_dir) / "compose-config").is_file():
        return str(Path(bin_dir) / "compose-config")
    found = shutil.which("compose-config")
    if found:
        return found
    root = Path(os.environ.get("K3INFRA_TESTBED_CACHE", Path.home() / ".cache/k3infra/testbed"))
    builds = [p for p in root.glob("compose-*/compose-config") if (p.parent / ".complete").is_file()]
    return str(max(builds, key=lambda p: p.stat().st_mtime)) if builds else None


def test_compose_file_passes_compose_go(tmp_path):
    """compose-go's loader (schema, interpolation, depends_on references), the code
    `docker compose config` runs; built by tools/testbed/compose/build.sh."""
    binary = _compose_config_binary()
    if binary is None:
        pytest.skip("compose-config not built: `make testbed` (or tools/testbed/compose/build.sh "
                    "DIR, then K3INFRA_COMPOSE_CONFIG=DIR/compose-config; Go module proxy)")
    compose = _render_cli(tmp_path, "k3:hfToken=hf_test")
    (tmp_path / "k3-api-key.env").write_text("VLLM_API_KEY=k3-test-key\n")
    (tmp_path / "k3-hf-token.env").write_text("HF_TOKEN=hf_test\n")
    done = subprocess.run([binary, str(compose)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    model = yaml.safe_load(done.stdout)
    assert model["name"] == "kimi-k3"
    assert {n: svc["container_name"] for n, svc in model["services"].items()} == {
        "prefetch": "kimi-k3-prefetch", "cache-owner": "kimi-k3-cache-owner",
        "vllm": "kimi-k3-vllm", "proxy": "kimi-k3-proxy"}
    assert model["volumes"]["kimi-k3-cache"]["name"] == "kimi-k3-cache"
    vllm = model["services"]["vllm"]
    assert vllm["command"][3:] == ["k3-start", *SERVE]
    # `$$` reached the container as `$`: the shell sees its own variables.
    assert 'python3 -c "$K3_RUNTIME_BOOTSTRAP" gate "$K3_TREE"' in vllm["command"][2]
    assert vllm["environment"]["VLLM_API_KEY"] == "k3-test-key"
    assert model["services"]["prefetch"]["environment"]["HF_TOKEN"] == "hf_test"
    assert "VLLM_API_KEY" not in model["services"]["prefetch"]["environment"]
    assert vllm["depends_on"]["prefetch"]["condition"] == "service_completed_successfully"
    assert vllm["shm_size"] == str(64 * 2**30) or int(vllm["shm_size"]) == 64 * 2**30
    # The bootstrap's pins match the files Compose mounts (what the pods' check relies on).
    import hashlib
    import json as _json

    pins = _json.loads(vllm["environment"]["K3_RUNTIME_SHA256"])
    # Files beside compose.yaml, bind-mounted read-only (inline `content` is refused for a
    # read-only service by docker compose: tests/e2e/test_host_compose.py found it).
    mounted = {c["target"]: Path(model["configs"][c["source"]]["file"]).read_text()
               for c in vllm["configs"]}
    assert all(Path(model["configs"][c["source"]]["file"]).parent == tmp_path / "configs"
               for c in vllm["configs"])
    assert pins and all(
        hashlib.sha256(mounted[f"/etc/k3/weights/{path}"].encode()).hexdigest() == digest
        for path, digest in pins.items())

    # A missing env file, or a depends_on naming no service, is refused by the loader.
    (tmp_path / "k3-api-key.env").unlink()
    assert subprocess.run([binary, str(compose)], capture_output=True, cwd=tmp_path).returncode != 0
    (tmp_path / "k3-api-key.env").write_text("VLLM_API_KEY=k3-test-key\n")
    broken = yaml.safe_load(compose.read_text())
    broken["services"]["vllm"]["depends_on"] = {"no-such": {"condition": "service_started"}}
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    done = subprocess.run([binary, str(tmp_path / "broken.yaml")], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode != 0 and "no-such" in done.stderr


# --- policies -------------------------------------------------------------------------

def _violations(policy, r, config: dict | None = None):
    from k3infra.policies.runner import check_plan

    report = check_plan(r.plan(), [policy])
    return [f.message for f in report.findings]


@pytest.mark.parametrize("policy", hp.POLICIES, ids=lambda p: p.name)
def test_host_render_passes_every_host_policy(policy):
    assert _violations(policy, host_render()) == []


def test_serve_args_of_reads_both_command_forms():
    from k3infra.serve_argv import serve_args_of

    assert serve_args_of(["vllm", "serve", "/m", "--x"]) == ["/m", "--x"]
    assert serve_args_of(["sh", "-c", 'gate && exec vllm serve "$@"', "$0", "/m"]) == ["/m"]
    assert serve_args_of(["sh", "/etc/k3/weights/prefetch.sh"]) is None


# --- verify through the Docker API --------------------------------------------------------

def _inspect_of_plan() -> dict:
    """What `docker inspect kimi-k3-vllm` reports for the container K3HostStack creates
    (its labels as the program registered them)."""
    cfg = host_cfg()
    c = host_plan(resolve_plan(load(), cfg), cfg, "kimi-k3", PREBUILT_IMAGE).container("vllm")
    env = [f"{k}={v}" for k, v in c.env.items()] + ["VLLM_API_KEY=k3-test-key"]
    labels = {lb["label"]: lb["value"]
              for lb in containers(host_render())["kimi-k3-vllm"]["inputs"]["labels"]}
    return {"Name": "/kimi-k3-vllm", "State": {"Health": {"Status": "healthy"}},
            "Config": {"Image": PREBUILT_IMAGE, "Entrypoint": c.command[:1], "Cmd": c.command[1:],
                       "Env": env, "Labels": labels}}


def test_verify_reads_the_host_container_like_a_statefulset():
    from k3infra.host.inspect import statefulset_view
    from k3infra.live import drift

    view = statefulset_view(_inspect_of_plan())
    rows = drift.statefulset_drift(view, load(), PREBUILT_IMAGE)
    assert [r for r in rows if not r.ok] == []
    assert drift.model_dir(view) == MODEL_DIR
    assert "k3-test-key" not in str(view)
    # A changed flag on the host is drift.
    broken = _inspect_of_plan()
    cmd = broken["Config"]["Cmd"]
    cmd[cmd.index("--block-size") + 1] = "64"
    bad = [r.check for r in drift.statefulset_drift(statefulset_view(broken), load()) if not r.ok]
    assert bad == ["engine args (receipt order, after the model dir)"]


def test_docker_host_uses_the_docker_cli(tmp_path):
    import json as _json

    from k3infra.host.inspect import DockerHost

    (tmp_path / "inspect.json").write_text(_json.dumps([_inspect_of_plan()]))
    fake = tmp_path / "docker"
    fake.write_text(f"""#!/bin/sh
[ "$1" = -H ] && [ "$2" = ssh://gpu@box ] || exit 9
case "$3" in
  inspect) cat {tmp_path}/inspect.json ;;
  exec) [ "$5" = python3 ] && [ "$6" = -c ] && echo "file $8" ;;
esac
""")
    fake.chmod(0o755)
    host = DockerHost("ssh://gpu@box", "kimi-k3", docker=str(fake))
    assert host.container == "kimi-k3-vllm"
    assert host.statefulset()["metadata"]["name"] == "kimi-k3-vllm"
    assert host.read_file("kimi-k3-vllm-0", "vllm", "/weights/x") == "file /weights/x\n"


def test_host_render_passes_the_whole_pack():
    from k3infra.policies.runner import check_plan

    # The template leaves the licence unaccepted: its advisory is the only finding.
    licence = ["k3-license-acknowledged"]
    assert [f.policy for f in check_plan(host_render().plan()).findings] == licence
    wide = host_render("k3:host.publishAddress=0.0.0.0", "k3:host.publishAllInterfaces=true")
    # check_plan loads the plan's k3:host config: the explicit choice passes.
    assert [f.policy for f in check_plan(wide.plan()).findings] == licence
