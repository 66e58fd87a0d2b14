"""The host stack's rendered `compose.yaml`, up for real: Docker Compose v2 (built from its
Go module, tools/testbed/composecli) on Debian's Docker daemon, inside the test's network
namespace. The prefetch container downloads the generated tiny MoE from the loopback Hub,
verifies and marks it; the vLLM container runs the gate, then the real vLLM engine on CPU
(the `engine-cpu` image), and turns healthy through the file's own healthcheck; the proxy
container answers the API with the key and refuses without it. A flipped byte is refused
by the gate on the next start (the proxy answers 502 meanwhile); restoring it brings the
engine and the API back through the restart policy alone. `docker compose down` removes the containers (the compile-cache volume is
kept on purpose: it is the cache).

What the test changes in the rendered file, and why (everything else runs as written):
- `deploy.resources.reservations.devices` (8 NVIDIA GPUs) is removed: there is no GPU
  here, and Docker refuses a device request no driver can satisfy;
- `ulimits` above this machine's hard limits are lowered to them (`nofile` 1048576 to
  20000, `memlock` unlimited to 8 MiB here): raising a limit past the hard one needs
  CAP_SYS_RESOURCE, which this VM drops even for root (the same reason the node's
  containerd sets `restrict_oom_score_adj`); runc refused the file as written with
  "error setting rlimit type 7: operation not permitted".
What differs in the stack config (keys a user sets): the test receipt (`k3:receipt`, a
copy of it in the project's git-ignored build/),
`k3:weights.hubEndpoint` (the loopback Hub on the namespace's address),
`k3:host.weightsRoot` (a folder of the test), the CPU engine and Debian nginx images by
digest from the loopback registry, `k3:servedModelName`.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

import hub_loopback
import tiny_moe
from engine import testbed_bin  # noqa: F401  (fixture)
from node import NODE_IP_ENV, image_layout, wait_for
from registry import missing_tools, remove_stores, run_registry

pytestmark = [pytest.mark.e2e, pytest.mark.node]

ROOT = Path(__file__).resolve().parents[2]
K3INFRA = str(ROOT / ".venv" / "bin" / "k3infra")
PRODUCT = "k3infra-e2e-cpu"          # the template receipt's gpu_product_label
API_KEY = "e2e-host-key-0123456789abcdef"   # test-only
PROJECT = "kimi-k3"                  # the file's `name:`
UID = 1000                           # the engine image's user, who owns weightsRoot
START_TIMEOUT_S = 900


class Docker:
    """The daemon and the Compose CLI, as the test drives them."""

    def __init__(self, sock: Path, compose_bin: Path, workdir: Path):
        self.sock, self.compose_bin, self.workdir = sock, compose_bin, workdir

    def env(self) -> dict:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.sock}"}

    def docker(self, *args: str, check=True, timeout=600) -> subprocess.CompletedProcess:
        proc = subprocess.run(["docker", *args], env=self.env(), capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: exit {proc.returncode}: "
                                 f"{proc.stderr.strip()[-2000:]}")
        return proc

    def compose(self, project_dir: Path, *args: str, check=True, timeout=1800):
        start = time.monotonic()
        proc = subprocess.run([str(self.compose_bin), "--project-directory", str(project_dir),
                               "-f", str(project_dir / "compose.yaml"), *args],
                              env=self.env(), capture_output=True, text=True, timeout=timeout)
        print(f"\n$ docker compose {' '.join(args)}    [exit {proc.returncode}, "
              f"{time.monotonic() - start:.1f} s]")
        for line in (proc.stdout + proc.stderr).rstrip().splitlines()[-25:]:
            print(f"    {line}")
        if check and proc.returncode != 0:
            raise AssertionError(f"docker compose {' '.join(args)} exited {proc.returncode}")
        return proc

    def state(self, container: str) -> dict:
        return json.loads(self.docker("inspect", "-f", "{{json .State}}", container).stdout)

    def logs(self, container: str) -> str:
        proc = self.docker("logs", "--timestamps", container, check=False)
        return proc.stdout + proc.stderr


def _missing(bin_dir: Path) -> str | None:
    if not os.environ.get(NODE_IP_ENV):
        return (f"{NODE_IP_ENV} is not set: the host tier runs inside the network namespace "
                "tests/e2e/netns.sh makes (`make e2e`)")
    for tool in ("dockerd", "docker"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs Debian's docker.io)"
    if not os.access(bin_dir / "docker-compose", os.X_OK):
        return f"{bin_dir} lacks docker-compose: run tools/testbed/build.sh"
    return missing_tools()


@pytest.fixture(scope="module")
def docker(testbed_bin, tmp_path_factory):  # noqa: F811
    reason = _missing(Path(testbed_bin))
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("docker")
    sock = work / "docker.sock"
    log = (work / "dockerd.log").open("w")
    # The daemon's state, sockets and networks are the test's: nothing outside the
    # namespace (its mounts go with netns.sh's private mount namespace).
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(work / "root"), "--exec-root", str(work / "exec"),
         "--pidfile", str(work / "docker.pid"), "-H", f"unix://{sock}",
         "--storage-driver", "overlay2", "--log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT)
    d = Docker(sock, Path(testbed_bin) / "docker-compose", work)
    try:
        wait_for("dockerd", lambda: sock.exists() and d.docker("info", check=False).returncode == 0,
                 timeout=120)
        version = d.docker("version", "-f", "{{.Server.Version}}").stdout.strip()
        compose = subprocess.run([str(d.compose_bin), "version", "--short"],
                                 capture_output=True, text=True).stdout.strip()
        print(f"\ndockerd {version}, docker compose {compose}; state in {work}")
        yield d
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=60)
        log.close()
        # Docker's images and containers (about 10 GB with the engine image); the log stays.
        remove_stores(work / "root")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """The project's engine-cpu and proxy images in a loopback registry, by digest."""
    with run_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield {name: reg.push(image_layout(name), f"k3e2e/{name}", "e2e")
               for name in ("engine-cpu", "proxy")}


@pytest.fixture(scope="module")
def model(docker, images, tmp_path_factory) -> Path:
    """The tiny MoE, generated by a container of the engine image (torch is there)."""
    out = tmp_path_factory.mktemp("model")
    os.chown(out, UID, UID)
    start = time.monotonic()
    docker.docker("pull", images["engine-cpu"], timeout=900)
    docker.docker("run", "--rm", "--network", "none", "--user", f"{UID}:{UID}",
                  "-e", "HOME=/tmp", "-e", "HF_HUB_OFFLINE=1", "--tmpfs", "/tmp",
                  "-v", f"{ROOT / 'tests/e2e/tiny_moe.py'}:/gen/tiny_moe.py:ro",
                  "-v", f"{out}:/out", images["engine-cpu"],
                  "python3", "/gen/tiny_moe.py", "generate", "/out/tiny-moe", timeout=900)
    print(f"\nmodel generated in a container in {time.monotonic() - start:.0f} s "
          "(the engine image pulled on the way)")
    return out / "tiny-moe"


@pytest.fixture(scope="module")
def hub(model):
    with hub_loopback.serve(model, tiny_moe.REPO, host=os.environ[NODE_IP_ENV]) as running:
        print(f"\nloopback Hub: {running.endpoint} serving {tiny_moe.REPO}@{running.commit}")
        yield running


def render_host(receipt: Path, lock: Path, hub, images: dict, weights_root: Path,
                out: Path) -> Path:
    named = tiny_moe.in_project(receipt, ROOT)
    overrides = [*tiny_moe.stack_overrides(named, hub.commit, lock),
                 f"engineImage={images['engine-cpu']}", f"serving.proxyImage={images['proxy']}",
                 f"weights.hubEndpoint={hub.endpoint}", f"host.weightsRoot={weights_root}",
                 "host.freeGB=20", "acceptModelLicense=true"]
    cmd = [K3INFRA, "render", "--stack", "host", "--out", str(out)]
    for o in overrides:
        cmd += ["--config", o]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=os.environ.copy(), capture_output=True,
                              text=True, timeout=600)
    finally:
        (ROOT / named).unlink()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "compose.yaml"


def adapt(compose_file: Path) -> list[str]:
    """The test's changes to the rendered file (the module docstring says why)."""
    doc = yaml.safe_load(compose_file.read_text())
    vllm = doc["services"]["vllm"]
    changed = []
    if vllm.get("deploy", {}).get("resources", {}).get("reservations", {}).pop("devices", None):
        changed.append("services.vllm.deploy.resources.reservations.devices removed")
    limits = {"nofile": resource.RLIMIT_NOFILE, "memlock": resource.RLIMIT_MEMLOCK,
              "stack": resource.RLIMIT_STACK}
    for name, value in list((vllm.get("ulimits") or {}).items()):
        hard = resource.getrlimit(limits[name])[1]
        want = value["hard"] if isinstance(value, dict) else value
        wanted = resource.RLIM_INFINITY if want == -1 else want
        if hard != resource.RLIM_INFINITY and (wanted == resource.RLIM_INFINITY or wanted > hard):
            vllm["ulimits"][name] = hard
            changed.append(f"services.vllm.ulimits.{name} {value} -> {hard} (this machine's hard limit)")
    compose_file.write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    return changed


def request(path: str, body: dict | None = None, key: str | None = API_KEY, port=8000):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (ConnectionError, urllib.error.URLError) as exc:   # nothing listening (a restart)
        return 0, str(exc)


def healthy(docker: Docker, container="kimi-k3-vllm"):
    s = docker.state(container)
    return s if (s.get("Health") or {}).get("Status") == "healthy" else None


@pytest.fixture(scope="module")
def project(docker, images, model, hub, tmp_path_factory):
    base = tmp_path_factory.mktemp("host")
    receipt, lock = tiny_moe.write_receipt(model, hub.commit, base / "receipt")
    weights_root = base / "weights"
    weights_root.mkdir()
    os.chown(weights_root, UID, UID)
    compose_file = render_host(receipt, lock, hub, images, weights_root, base / "render")
    print("\nchanges to the rendered compose.yaml: " + "; ".join(adapt(compose_file)))
    env_file = compose_file.parent / "k3-api-key.env"
    env_file.write_text(f"VLLM_API_KEY={API_KEY}\n")
    env_file.chmod(0o600)
    yield compose_file.parent, weights_root
    docker.compose(compose_file.parent, "down", "--timeout", "30", check=False)


def test_compose_up_serves_through_the_gate_and_the_proxy(docker, project, hub):
    project_dir, _weights = project
    start = time.monotonic()
    up = docker.compose(project_dir, "up", "--detach", check=False)  # after prefetch exited 0
    if up.returncode != 0:
        for c in ("kimi-k3-prefetch", "kimi-k3-vllm", "kimi-k3-proxy"):
            print(f"\n{c} log (last lines):\n" + "\n".join(docker.logs(c).splitlines()[-25:]))
        raise AssertionError(f"docker compose up exited {up.returncode}")
    prefetch = docker.state("kimi-k3-prefetch")
    print(f"\nprefetch: exit {prefetch['ExitCode']}; last lines:\n"
          + "\n".join(docker.logs("kimi-k3-prefetch").splitlines()[-6:]))
    assert prefetch["Status"] == "exited" and prefetch["ExitCode"] == 0
    try:
        wait_for("the vllm container to be healthy", lambda: healthy(docker),
                 timeout=START_TIMEOUT_S, interval=5)
    finally:
        print("\nvllm container log (last lines):\n"
              + "\n".join(docker.logs("kimi-k3-vllm").splitlines()[-30:]))
    print(f"\nvllm healthy {time.monotonic() - start:.0f} s after `up`")
    log = docker.logs("kimi-k3-vllm")
    assert "k3-phase name=gate event=end" in log and "k3-phase name=engine event=start" in log

    status, text = request("/v1/models")
    assert status == 200 and json.loads(text)["data"][0]["id"] == tiny_moe.SERVED_NAME
    assert request("/v1/models", key=None)[0] == 401
    assert request("/v1/models", key="wrong-key-0123456789")[0] == 401
    status, text = request("/v1/completions", {"model": tiny_moe.SERVED_NAME, "prompt": "one two",
                                               "max_tokens": 8})
    assert status == 200 and json.loads(text)["choices"], text
    # Routes the proxy does not pass (the engine's own admin and tokenizer routes).
    assert request("/invocations", {"x": 1})[0] == 404


def test_a_flipped_byte_is_refused_and_restoring_it_brings_the_engine_back(docker, project):
    _dir, weights = project
    shard = sorted(weights.rglob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    offset = len(data) // 2
    data[offset] ^= 0xFF
    shard.write_bytes(bytes(data))
    docker.docker("restart", "--time", "10", "kimi-k3-vllm")
    refused = wait_for("the gate to refuse the flipped byte", lambda: (
        lambda log: log if "refus" in log.lower() and shard.name in log else None)(
            docker.logs("kimi-k3-vllm")), timeout=300, interval=3)
    lines = [line for line in refused.splitlines() if shard.name in line]
    print("\ngate refusal:\n" + "\n".join(lines[-3:]))
    # The proxy stays up and answers, but nothing is served while the gate refuses.
    refused_status = request("/v1/models")[0]
    print(f"the API while the gate refuses: {refused_status}")
    assert refused_status == 502
    data[offset] ^= 0xFF
    shard.write_bytes(bytes(data))
    start = time.monotonic()
    # No other action: the restart policy starts it again and the gate now passes.
    wait_for("the vllm container to be healthy again", lambda: healthy(docker),
             timeout=START_TIMEOUT_S, interval=5)
    print(f"\nhealthy again {time.monotonic() - start:.0f} s after the byte was restored "
          f"(restarts: {docker.docker('inspect', '-f', '{{.RestartCount}}', 'kimi-k3-vllm').stdout.strip()})")
    # The proxy owns the network namespace, so a restarted vllm joins the same one and the
    # API answers again with no other action (with vllm owning it, the proxy was left in
    # the old, empty namespace until it restarted too: found by this test, fixed in plan.py).
    status, text = request("/v1/models")
    assert status == 200 and json.loads(text)["data"][0]["id"] == tiny_moe.SERVED_NAME
    assert docker.docker("inspect", "-f", "{{.RestartCount}}", "kimi-k3-proxy").stdout.strip() == "0"
