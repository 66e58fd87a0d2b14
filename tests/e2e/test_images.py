"""The e2e tier's container images (issue 27, item 3), built from the project's own
files by tools/images/build.sh and pushed to a loopback registry (registry.py), as the
node tests pull them: pinned by digest.

The three small images are built here (or reused from the cache): base, pause, proxy.
pause and proxy then run under runc as a pod runs them: pause as 65535 until SIGTERM;
nginx from the proxy image with the product's own command, user, rendered config and a
read-only root (the pod's securityContext, k3infra.serving.proxy.container). The engine
image (6.7 GB unpacked) is checked on the node, where its pods pull it anyway
(test_node_stack.py: the model generator pod imports vLLM, huggingface_hub and hf_xet at
the pinned versions as the engine's user; unpacking it here too cost 119 s of a CI).

Needs root and Debian's debootstrap, umoci, skopeo, docker-registry and runc (.ci/run
installs them); skipped with the missing one named otherwise.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from apiserver import report
from registry import layout_digest, run_registry

from k3infra.config import parse_stack_config
from k3infra.receipt import load_receipt
from k3infra.serving import proxy

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tools" / "images" / "build.sh"
SMALL = ("base", "pause", "proxy")
BUILD_TIMEOUT_S = 1800
TOOLS = {"debootstrap": "debootstrap", "umoci": "umoci", "skopeo": "skopeo",
         "docker-registry": "docker-registry", "runc": "runc"}
KEY = "k3-images-test-key"


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "tools/images/build.sh needs root (debootstrap, chroot, mount namespaces)"
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian: apt-get install {package}; .ci/run installs it)"
    return None


def build(name: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(BUILD), *flags, name], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S)


def built_layout(done: subprocess.CompletedProcess, name: str) -> Path:
    assert done.returncode == 0, f"build.sh {name} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return Path(done.stdout.splitlines()[-1])


def manifest(layout: Path) -> dict:
    digest = layout_digest(layout).split(":", 1)[1]
    return json.loads((layout / "blobs" / "sha256" / digest).read_text())


@pytest.fixture(scope="module")
def layouts(request) -> dict[str, Path]:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    out = {}
    for name in SMALL:
        start = time.monotonic()
        out[name] = built_layout(build(name), name)
        size = int((out[name] / ".bytes").read_text())
        report(request.config, f"\nimages: {name} ready in {time.monotonic() - start:.1f} s "
                               f"(built once in {(out[name] / '.build-seconds').read_text().strip()} s), "
                               f"{size / 2**20:.1f} MiB: {out[name]}")
    return out


@pytest.fixture(scope="module")
def registry(layouts, tmp_path_factory):
    with run_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def pushed(request, layouts, registry) -> dict[str, str]:
    refs = {}
    for name in SMALL:
        start = time.monotonic()
        refs[name] = registry.push(layouts[name], f"k3infra/{name}", "e2e")
        report(request.config, f"images: {name} pushed in {time.monotonic() - start:.1f} s: {refs[name]}")
    return refs


def test_each_layout_is_keyed_by_its_inputs_and_reused(layouts):
    for name, layout in layouts.items():
        assert re.fullmatch(rf"{name}-[0-9a-f]{{16}}", layout.name), layout
        assert (layout / ".complete").is_file()
        again = build(name)
        assert built_layout(again, name) == layout
        assert f"images: {name} reused ({layout})" in again.stderr
        # What the cache holds, without building: the lead's fixtures ask this way too.
        assert built_layout(build(name, "--cached"), name) == layout


def test_an_unknown_image_is_refused_in_one_line():
    done = build("nginx")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == ("images: usage: tools/images/build.sh NAME (NAME is base, pause, "
                           "proxy, engine-cpu, buildkit or accuracy; got 'nginx')\n")


def test_each_push_returns_the_pinned_reference_of_the_layouts_own_manifest(layouts, registry, pushed):
    for name, ref in pushed.items():
        digest = layout_digest(layouts[name])
        assert ref == f"{registry.address}/k3infra/{name}@{digest}"
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
        # The registry serves it by digest, and skopeo reads back the same manifest.
        assert registry.manifest_digest(f"k3infra/{name}", digest) == digest
        inspect = subprocess.run(["skopeo", "inspect", "--tls-verify=false", f"docker://{ref}"],
                                 capture_output=True, text=True, check=True, timeout=60)
        assert json.loads(inspect.stdout)["Digest"] == digest


def test_images_on_base_add_one_layer_to_its_layer(layouts):
    base = [layer["digest"] for layer in manifest(layouts["base"])["layers"]]
    proxy_layers = manifest(layouts["proxy"])["layers"]
    assert len(base) == 1
    assert [layer["digest"] for layer in proxy_layers[:1]] == base and len(proxy_layers) == 2
    assert {layer["mediaType"] for layer in proxy_layers} == {
        "application/vnd.oci.image.layer.v1.tar+gzip"}
    assert len(manifest(layouts["pause"])["layers"]) == 1


# --- run under runc --------------------------------------------------------------------


def unpack(layout: Path, bundle: Path) -> dict:
    done = subprocess.run(["umoci", "unpack", "--image", f"{layout}:latest", str(bundle)],
                          capture_output=True, text=True, timeout=600)
    free = shutil.disk_usage(bundle.parent).free / 2**30
    assert done.returncode == 0, (f"umoci unpack {layout.name} into {bundle} failed "
                                  f"({free:.1f} GiB free there): {done.stderr[-2000:]}")
    return json.loads((bundle / "config.json").read_text())


def pod_like(spec: dict, user: int, args: list[str], mounts: list[dict]) -> dict:
    """A pod's container: the product's user and command, a read-only root, no
    capability, no new privileges; the test's network (a loopback port to call)."""
    spec["root"]["readonly"] = True
    spec["process"].update(user={"uid": user, "gid": user}, args=args, terminal=False,
                           noNewPrivileges=True, capabilities={})
    spec["mounts"] += mounts
    spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"]
                                   if n["type"] != "network"]
    return spec


class Runc:
    """Containers under a private runc state dir, killed and deleted at the end."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.ids: list[str] = []

    def run(self, cid: str, bundle: Path, spec: dict, stdout, stderr) -> subprocess.Popen:
        (bundle / "config.json").write_text(json.dumps(spec))
        self.ids.append(cid)
        return subprocess.Popen(["runc", "--root", str(self.state), "run", "--bundle", str(bundle), cid],
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)

    def status(self, cid: str) -> str:
        done = subprocess.run(["runc", "--root", str(self.state), "state", cid],
                              capture_output=True, text=True)
        return json.loads(done.stdout)["status"] if done.returncode == 0 else "gone"

    def kill(self, cid: str, signal: str) -> None:
        subprocess.run(["runc", "--root", str(self.state), "kill", cid, signal], capture_output=True)

    def close(self) -> None:
        for cid in self.ids:
            subprocess.run(["runc", "--root", str(self.state), "delete", "--force", cid],
                           capture_output=True)


@pytest.fixture
def runc(tmp_path):
    r = Runc(tmp_path / "runc-state")
    yield r
    r.close()


def wait_for(what: str, check, proc: subprocess.Popen, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what}: the container exited with {proc.returncode}")
        result = check()
        if result:
            return result
        time.sleep(0.1)
    pytest.fail(f"{what}: not after {timeout:.0f} s")


def test_the_pause_image_runs_as_65535_until_sigterm(layouts, runc, tmp_path):
    bundle = tmp_path / "pause"
    spec = unpack(layouts["pause"], bundle)
    assert spec["process"]["args"] == ["/pause"]
    assert spec["process"]["user"] == {"uid": 65535, "gid": 65535}
    assert os.listdir(bundle / "rootfs") == ["pause"]  # nothing but the binary
    spec = pod_like(spec, 65535, ["/pause"], [])
    proc = runc.run("k3-pause", bundle, spec, subprocess.PIPE, subprocess.PIPE)
    wait_for("pause running", lambda: runc.status("k3-pause") == "running", proc)
    runc.kill("k3-pause", "TERM")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def owned_pipe(uid: int) -> tuple[int, int]:
    """A pipe the container's user owns, as containerd's shim hands a container its
    stdout and stderr (so nginx, not root, can open /dev/stdout)."""
    r, w = os.pipe()
    os.fchown(w, uid, uid)
    return r, w


def test_the_proxy_image_runs_nginx_as_the_pod_does(layouts, runc, tmp_path):
    ports = {"port": free_port(), "metricsPort": free_port(), "healthPort": free_port(),
             "enginePort": free_port()}
    cfg = parse_stack_config({"weightsRevision": "a" * 40, "apiKey": KEY,
                              "engineImage": "r/vllm@sha256:" + "1" * 64, "serving": ports},
                             receipt=load_receipt())
    container = proxy.container(cfg, "proxy-conf", drain_seconds=11)
    conf = tmp_path / "conf"
    conf.mkdir()
    # The pod's projected volume: the ConfigMap's nginx.conf and the Secret's key map.
    for name, text in {**proxy.config_files(cfg), **proxy.secret_files(KEY)}.items():
        (conf / name).write_text(text)
        os.chmod(conf / name, 0o444)
    bundle = tmp_path / "proxy"
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] and ctx["runAsUser"] == proxy.PROXY_UID
    spec = pod_like(unpack(layouts["proxy"], bundle), ctx["runAsUser"], container["command"], [
        {"destination": proxy.CONF_DIR, "type": "bind", "source": str(conf),
         "options": ["rbind", "ro"]},
        {"destination": proxy.TMP_DIR, "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=1777"]}])
    out_r, out_w = owned_pipe(proxy.PROXY_UID)
    err_r, err_w = owned_pipe(proxy.PROXY_UID)
    proc = runc.run("k3-proxy", bundle, spec, out_w, err_w)
    os.close(out_w)
    os.close(err_w)

    def live():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports['healthPort']}{proxy.LIVE_PATH}",
                                        timeout=2) as resp:
                return resp.status
        except OSError:
            return None

    try:
        assert wait_for("nginx answering its liveness", live, proc) == 200
    finally:
        runc.kill("k3-proxy", "TERM")
        proc.wait(timeout=30)
        stderr = os.read(err_r, 1 << 20).decode(errors="replace")
        os.close(out_r)
        os.close(err_r)
    # Nothing it needed on the read-only root: no /var/log/nginx, no /var/lib/nginx.
    assert "could not open" not in stderr and "Read-only file system" not in stderr, stderr
    assert "[emerg]" not in stderr and "[alert]" not in stderr, stderr
