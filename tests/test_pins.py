"""`k3infra pins` against real servers on loopback: Debian's docker-registry with images
pushed by skopeo (umoci layouts made here, one a two-platform index), `git daemon` with a
refs/pull/N/head, the loopback Hub; a fake API client for the cluster's CIDRs, and a
small Bearer-token stub for the registry token flow (the Debian registry runs without
auth). Skipped, with the reason, where a Debian tool is missing."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "tests"))

from k3infra.pins import cluster, oci, stackwrite  # noqa: E402
from registry import config_layout  # noqa: E402

try:
    import ruamel.yaml  # noqa: F401
    WHY_NO_RUAMEL = None
except ImportError:
    WHY_NO_RUAMEL = "ruamel.yaml is not installed (the `pins` extra; constraints.txt pins it)"
needs_ruamel = pytest.mark.skipif(WHY_NO_RUAMEL is not None, reason=str(WHY_NO_RUAMEL))

ZERO = "0" * 64


# --- units ---------------------------------------------------------------------------------

@pytest.mark.parametrize("image, want", [
    ("rust:1.90.0-slim-bookworm@sha256:" + ZERO,
     ("registry-1.docker.io", "library/rust", "1.90.0-slim-bookworm", "https")),
    ("nvidia/cuda:13.0.2-devel-ubuntu22.04", ("registry-1.docker.io", "nvidia/cuda", "13.0.2-devel-ubuntu22.04", "https")),
    ("ghcr.io/astral-sh/uv:0.8.22", ("ghcr.io", "astral-sh/uv", "0.8.22", "https")),
    ("127.0.0.1:5000/k3/uv:1", ("127.0.0.1:5000", "k3/uv", "1", "http")),
    ("localhost:5000/uv:1", ("localhost:5000", "uv", "1", "http")),
])
def test_parse_ref(image, want):
    ref = oci.parse_ref(image)
    assert (ref.registry, ref.repository, ref.tag, ref.base_url.split(":")[0]) == want


def test_parse_ref_refuses_an_untagged_image():
    with pytest.raises(oci.ResolveError, match="no tag to resolve"):
        oci.parse_ref("127.0.0.1:5000/k3/uv@sha256:" + ZERO)


def _slices(*endpoints):
    return SimpleNamespace(items=[SimpleNamespace(endpoints=[
        SimpleNamespace(addresses=addrs, conditions=SimpleNamespace(ready=ready))
        for addrs, ready in endpoints])])


def test_cidrs_from_the_kubernetes_endpointslice():
    calls = []

    class Api:
        def list_namespaced_endpoint_slice(self, namespace, label_selector, **_kw):
            calls.append((namespace, label_selector))
            return _slices((["10.0.0.12"], True), (["fd00::1", "10.0.0.11"], None), (["10.0.0.99"], False))

    assert cluster.api_server_cidrs(Api()) == ["10.0.0.11/32", "10.0.0.12/32", "fd00::1/128"]
    assert calls == [("default", "kubernetes.io/service-name=kubernetes")]


def test_cidrs_refuse_an_empty_slice():
    api = SimpleNamespace(list_namespaced_endpoint_slice=lambda *a, **k: _slices())
    with pytest.raises(cluster.ClusterError, match="no ready address"):
        cluster.api_server_cidrs(api)


@needs_ruamel
def test_write_keeps_comments_order_and_secrets(tmp_path):
    path = tmp_path / "Pulumi.existing.yaml"
    text = (ROOT / "stacks/examples/Pulumi.existing.yaml").read_text()
    text += "  k3:apiKey:\n    secure: v1:AAAAciphertext==\n"
    path.write_text(text)
    digest = "sha256:" + "a" * 64
    new = stackwrite.set_values(path, [
        (("k3:weightsRevision",), "b" * 40),
        (("k3:engine", "baseImages", "uv"), f"ghcr.io/astral-sh/uv:0.8.22@{digest}"),
        (("k3:engine", "apiServerCidrs"), ["10.0.0.11/32"]),
        (("k3:serving", "proxyImage"), "nginx:1@" + digest),
    ])
    old_lines = text.splitlines()
    new_lines = new.splitlines()
    # Every comment line and every other value is still there, in order.
    kept = [line for line in new_lines if line in old_lines]
    assert kept == [line for line in old_lines if line != '  k3:weightsRevision: "' + "0" * 40 + '"']
    assert '  k3:weightsRevision: "' + "b" * 40 + '"' in new_lines
    engine = new[new.index("  k3:engine:"):new.index("  k3:nodePool:")]
    assert engine.endswith("    registrySecret: k3-registry-push\n"
                           "    baseImages:\n"
                           f"      uv: ghcr.io/astral-sh/uv:0.8.22@{digest}\n"
                           "    apiServerCidrs:\n"
                           "      - 10.0.0.11/32\n")
    assert new.endswith("  k3:apiKey:\n    secure: v1:AAAAciphertext==\n"
                        "  k3:serving:\n"
                        f"    proxyImage: nginx:1@{digest}\n")


class _TokenRegistry(BaseHTTPRequestHandler):
    """401 + WWW-Authenticate Bearer until the token from /token is presented; each body
    hashes to the digest that names it (the client checks)."""
    config = json.dumps({"os": "linux", "architecture": "amd64"}).encode()
    manifest = json.dumps({"schemaVersion": 2, "config": {
        "digest": "sha256:" + hashlib.sha256(config).hexdigest()}}).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    seen: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        if self.path.startswith("/token?"):
            body = json.dumps({"token": "t0k"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.headers.get("Authorization") != "Bearer t0k":
            host = self.headers["Host"]
            self.send_response(401)
            self.send_header("WWW-Authenticate", f'Bearer realm="http://{host}/token",'
                             'service="stub",scope="repository:k3/img:pull"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if "/blobs/" in self.path:
            body = self.config
        else:
            body = self.manifest
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        self.send_header("Docker-Content-Digest", self.digest)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    do_HEAD = do_GET


def test_token_flow_on_401():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TokenRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        got = oci.resolve(f"127.0.0.1:{server.server_port}/k3/img:1")
    finally:
        server.shutdown()
    assert got.digest == _TokenRegistry.digest
    seen = _TokenRegistry.seen
    assert seen[0] == ("HEAD", "/v2/k3/img/manifests/1", None)
    assert seen[1] == ("GET", "/token?service=stub&scope=repository%3Ak3%2Fimg%3Apull", None)
    assert seen[2] == ("HEAD", "/v2/k3/img/manifests/1", "Bearer t0k")


@needs_ruamel
def test_write_quotes_a_value_yaml_would_misread(tmp_path):
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text("config:\n  k3:replicas: 1  # kept\n")
    assert stackwrite.set_values(path, [(("k3:weightsRevision",), "1" * 39 + "0"),
                                        (("k3:gpuProduct",), "B300")]) == (
        "config:\n  k3:replicas: 1  # kept\n"
        f'  k3:weightsRevision: "{"1" * 39 + "0"}"\n  k3:gpuProduct: B300\n')


# --- real servers on loopback --------------------------------------------------------------

def _missing() -> str | None:
    from registry import missing_tools

    why = missing_tools()
    if why:
        return why
    for tool, package in (("umoci", "umoci"), ("git", "git")):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian: apt-get install {package})"
    return None


def _run(*argv, cwd=None) -> str:
    return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _index_layout(where: Path, tag: str, arches: tuple[str, ...]) -> Path:
    """A layout whose one tag is an OCI index of one image per architecture."""
    _run("umoci", "init", "--layout", str(where))
    manifests = []
    for arch in arches:
        _run("umoci", "new", "--image", f"{where}:{arch}")
        _run("umoci", "config", "--image", f"{where}:{arch}", "--architecture", arch)
    index_path = where / "index.json"
    index = json.loads(index_path.read_text())
    for entry in index["manifests"]:
        arch = entry.pop("annotations")["org.opencontainers.image.ref.name"]
        manifests.append({**entry, "platform": {"os": "linux", "architecture": arch}})
    blob = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": manifests}).encode()
    digest = hashlib.sha256(blob).hexdigest()
    (where / "blobs" / "sha256" / digest).write_bytes(blob)
    index["manifests"] = [{"mediaType": "application/vnd.oci.image.index.v1+json",
                           "digest": f"sha256:{digest}", "size": len(blob),
                           "annotations": {"org.opencontainers.image.ref.name": tag}}]
    index_path.write_text(json.dumps(index))
    return where


def _push_all(registry, layout: Path, repo: str, tag: str) -> str:
    """skopeo copy --all: the index and every image in it (Registry.push copies one)."""
    from registry import layout_tag

    _run("skopeo", "--insecure-policy", "copy", "--all", "--quiet", "--dest-tls-verify=false",
         f"oci:{layout}:{layout_tag(layout)}", f"docker://{registry.address}/{repo}:{tag}")
    return f"{registry.address}/{repo}@{registry.manifest_digest(repo, tag)}"


@pytest.fixture
def git_server(tmp_path):
    """`git daemon` on 127.0.0.1 serving vllm.git, with refs/pull/7/head."""
    from gitserver import git_daemon

    with git_daemon(tmp_path, 7) as server:
        yield server


@pytest.fixture
def loopback(tmp_path, git_server, monkeypatch):
    """A project directory whose stack names images on a loopback registry, a receipt
    whose engine is the git daemon's PR 7, and the loopback Hub as HF_ENDPOINT."""
    why = _missing()
    if why:
        pytest.skip(why)
    import hub_loopback
    from registry import run_registry

    from k3infra.receipt import receipt_path

    with run_registry(tmp_path / "registry") as reg:
        pushed = {}
        pushed["proxy"] = reg.push(config_layout(tmp_path / "l-proxy", "1", "proxy"), "k3/nginx", "1.28")
        pushed["cuda"] = _push_all(reg, _index_layout(tmp_path / "l-cuda", "13", ("amd64", "arm64")),
                                   "nvidia/cuda", "13.0.2")
        for name in ("uv", "rust", "buildkit", "reporter"):
            pushed[name] = reg.push(config_layout(tmp_path / f"l-{name}", "1", name), f"k3/{name}", "1")
        project = tmp_path / "project"
        (project / "stacks").mkdir(parents=True)
        (project / "Pulumi.yaml").write_text("name: k3infra\n")
        (project / "__main__.py").write_text("")
        stack = (ROOT / "stacks/examples/Pulumi.existing.yaml").read_text()
        a = reg.address
        stack = stack.replace("  k3:engine:\n", "  k3:serving:\n"
                              f"    proxyImage: {a}/k3/nginx:1.28@sha256:{ZERO}\n"
                              "  k3:engine:\n    baseImages:\n"
                              f"      cudaDevel: {a}/nvidia/cuda:13.0.2@sha256:{ZERO}\n"
                              f"      uv: {a}/k3/uv:1@sha256:{ZERO}\n"
                              f"      rust: {a}/k3/rust:1@sha256:{ZERO}\n"
                              f"    buildkitImage: {a}/k3/buildkit:1@sha256:{ZERO}\n"
                              f"    reporterImage: {a}/k3/reporter:1@sha256:{ZERO}\n")
        receipt = yaml.safe_load(receipt_path().read_text())
        receipt["engine"].update(repo=git_server.url, commit=git_server.first[:8], pull_request=7)
        # The stack names a receipt of its project whose engine is the loopback git server's.
        (project / "receipts").mkdir()
        receipt_file = project / "receipts" / "loopback.yaml"
        receipt_file.write_text(yaml.safe_dump(receipt, sort_keys=False))
        stack = stack.replace("k3:receipt: kimi-k3-8xb300-2026-07-29",
                              "k3:receipt: receipts/loopback.yaml")
        (project / "stacks" / "Pulumi.existing.yaml").write_text(stack)
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text("{}\n")
        hub = hub_loopback.serve(model, receipt["model"]["repo"], revision="e" * 40)
        try:
            for key, value in hub_loopback.environment(hub, str(tmp_path / "hf")).items():
                monkeypatch.setenv(key, value)
            monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
            monkeypatch.setenv("COLUMNS", "400")
            monkeypatch.chdir(project)
            yield SimpleNamespace(registry=reg, pushed=pushed, project=project, git=git_server,
                                  stack=project / "stacks" / "Pulumi.existing.yaml",
                                  tmp=tmp_path, hub=hub)
        finally:
            hub.stop()


def _pins(capsys, *argv) -> tuple[int, str]:
    from k3infra.cli import main

    rc = main(["pins", "--stack", "existing", *argv])
    out = capsys.readouterr()
    return rc, out.out + out.err


@needs_ruamel
def test_pins_resolve_write_and_check(loopback, capsys):
    from k3infra.config import parse_stack_config
    from k3infra.config.stackfile import read_stack_file
    from k3infra.receipt import load_receipt

    before = loopback.stack.read_text()
    rc, out = _pins(capsys)
    assert rc == 0, out
    assert loopback.stack.read_text() == before          # nothing written without --write
    digest = {k: v.rsplit("@", 1)[1] for k, v in loopback.pushed.items()}
    assert digest["cuda"] in out and "index, linux/amd64 present" in out
    assert loopback.git.first in out
    assert "e" * 40 in out and "choice" in out           # offered, not taken
    assert ("unresolved: k3:engine.apiServerCidrs: no usable kubeconfig ($KUBECONFIG or "
            "~/.kube/config): Invalid kube-config file. No configuration found.\n") in out
    assert ("choice: k3:weightsRevision: moonshotai/Kimi-K3@main today, from the Hub (HF_ENDPOINT): "
            "check it is the bytes you mean, then --take-revision\n") in out
    assert "images/build.lock" in out and "not compiled here" in out

    rc, out = _pins(capsys, "--write")
    assert rc == 0, out
    raw, secrets = read_stack_file(loopback.stack)
    a = loopback.registry.address
    assert raw["k3:serving"] == {"proxyImage": f"{a}/k3/nginx:1.28@{digest['proxy']}"}
    assert raw["k3:engine"]["baseImages"] == {
        "cudaDevel": f"{a}/nvidia/cuda:13.0.2@{digest['cuda']}",
        "uv": f"{a}/k3/uv:1@{digest['uv']}", "rust": f"{a}/k3/rust:1@{digest['rust']}"}
    assert raw["k3:engine"]["buildkitImage"] == f"{a}/k3/buildkit:1@{digest['buildkit']}"
    assert raw["k3:engine"]["commit"] == loopback.git.first
    assert raw["k3:weightsRevision"] == "0" * 40        # never taken silently
    text = loopback.stack.read_text()
    assert "  # REPLACE: the 40-hex commit of moonshotai/Kimi-K3 you deploy (never `main`).\n" in text
    assert "k3:apiKey:" not in text and "[secret]" not in text     # no secret, not even a stand-in
    raw["k3:apiKey"] = "[secret]"
    parse_stack_config(raw, ("k3:apiKey",), receipt=load_receipt())

    rc, out = _pins(capsys, "--write", "--take-revision")
    assert rc == 0, out
    assert read_stack_file(loopback.stack)[0]["k3:weightsRevision"] == "e" * 40

    rc, out = _pins(capsys, "--check")
    assert rc == 0, out
    assert "7 recorded pin(s) still name what was measured" in out


@needs_ruamel
def test_check_refuses_a_moved_tag_and_a_moved_pr_head(loopback, capsys):
    assert _pins(capsys, "--write")[0] == 0
    # The tag moves: another image pushed under k3/uv:1.
    loopback.registry.push(config_layout(loopback.tmp / "l-uv2", "1", "uv, rebuilt"), "k3/uv", "1")
    rc, out = _pins(capsys, "--check")
    assert rc == 1
    assert ("refused: k3:engine.baseImages.uv: the tag moved; the recorded digest is what was "
            "measured") in out
    assert "refused: k3:engine.commit" not in out
    # The PR head moves too.
    loopback.git.push_pr(loopback.git.commit("a later push to the PR"))
    rc, out = _pins(capsys, "--check")
    assert rc == 1
    assert "refused: k3:engine.commit: the PR head moved; the recorded commit is what was measured" in out
    # --write never overwrites a recorded pin with a moved one.
    before = loopback.stack.read_text()
    rc, out = _pins(capsys, "--write")
    assert rc == 1 and loopback.stack.read_text() == before
    assert "moved: k3:engine.baseImages.uv" in out


@needs_ruamel
def test_a_pr_head_that_is_not_the_receipts_commit_is_refused(loopback, capsys):
    loopback.git.push_pr(loopback.git.commit("not the measured engine"))
    rc, out = _pins(capsys, "--write")
    text = loopback.stack.read_text()
    assert "commit:" not in text
    head = loopback.git.url and _run("git", "ls-remote", loopback.git.url, "refs/pull/7/head").split()[0]
    assert rc == 0
    assert (f"unresolved: k3:engine.commit: git ls-remote {loopback.git.url} refs/pull/7/head is "
            f"{head}, not the receipt's {loopback.git.first[:8]}...: refused (the PR head moved "
            "past the measured engine)\n") in out


def test_an_index_without_the_nodes_platform_is_refused(loopback, capsys):
    reg = loopback.registry
    _push_all(reg, _index_layout(loopback.tmp / "l-arm", "13", ("arm64",)), "nvidia/cuda", "13.0.2")
    rc, out = _pins(capsys)
    assert rc == 0
    assert (f"unresolved: k3:engine.baseImages.cudaDevel: {reg.address}/nvidia/cuda:13.0.2: the index "
            f"{reg.manifest_digest('nvidia/cuda', '13.0.2')} lists linux/arm64, not linux/amd64 "
            "(the nodes' platform)\n") in out


def test_an_absent_pr_ref_is_refused(tmp_path):
    from k3infra.pins import gitref

    _run("git", "init", "-q", "--bare", str(tmp_path / "empty.git"))
    with pytest.raises(gitref.RefError, match=r"empty.git has no refs/pull/9/head$"):
        gitref.resolve_pr_head(f"file://{tmp_path}/empty.git", 9, "f68f4fdd")
    with pytest.raises(gitref.RefError, match=r"git ls-remote file:///nonexistent.git refs/pull/9/head failed \(128\)"):
        gitref.resolve_pr_head("file:///nonexistent.git", 9, "f68f4fdd")


@needs_ruamel
@pytest.mark.parametrize("template", sorted((ROOT / "stacks/examples").glob("Pulumi.*.yaml")),
                         ids=lambda p: p.name)
def test_write_of_nothing_is_byte_identical(template):
    assert stackwrite.set_values(template, []) == template.read_text()


def test_write_refuses_a_shipped_template(tmp_path, monkeypatch, capsys):
    """Before anything is resolved: the template is tracked, the user's copy is theirs."""
    (tmp_path / "stacks/examples").mkdir(parents=True)
    (tmp_path / "Pulumi.yaml").write_text("name: k3infra\n")
    (tmp_path / "__main__.py").write_text("")
    shutil.copy(ROOT / "stacks/examples/Pulumi.existing.yaml", tmp_path / "stacks/examples")
    monkeypatch.chdir(tmp_path)
    rc, out = _pins(capsys, "--write")
    assert rc == 2
    assert out == ("k3infra pins: --write: stacks/examples/Pulumi.existing.yaml is a shipped "
                   "template; copy it first: cp stacks/examples/Pulumi.existing.yaml stacks/\n")


def test_an_image_pinned_by_digest_alone_is_left_alone():
    from k3infra.pins import NOT_DONE, image_pin

    def resolve(image):
        raise AssertionError("nothing to ask a registry")

    pin = image_pin("k3:accuracy.image", "127.0.0.1:5000/k3/lm-eval@sha256:" + "a" * 64, resolve)
    assert (pin.state, pin.source) == (NOT_DONE, "pinned by digest alone: no tag to re-resolve")


@needs_ruamel
def test_a_resolved_value_the_config_refuses_is_not_written(loopback, capsys, monkeypatch):
    """The written file is parsed by the config models first: a bad value stops it."""
    from k3infra.pins import oci as oci_mod

    real = oci_mod.resolve
    monkeypatch.setattr(oci_mod, "resolve", lambda image, **kw: real(image, **kw) if "uv" not in image
                        else oci_mod.Resolved("sha256:" + "A" * 64, "x", ()))
    before = loopback.stack.read_text()
    rc, out = _pins(capsys, "--write")
    assert rc == 2 and loopback.stack.read_text() == before
    assert out.splitlines()[-1].startswith("k3infra pins: not written: k3:engine")
    assert "must be pinned by digest" in out.splitlines()[-1]


# --- registries.conf mirrors ------------------------------------------------------------------

def _conf(tmp_path, text: str, monkeypatch) -> Path:
    path = tmp_path / "registries.conf"
    path.write_text(text)
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(path))
    return path


def test_mirrors_in_order_then_the_registry_longest_prefix_wins(tmp_path, monkeypatch):
    _conf(tmp_path, '''
[[registry]]
location = "docker.io"
[[registry.mirror]]
location = "mirror.example:5000/hub"
insecure = true
[[registry.mirror]]
location = "by-digest.example/hub"
pull-from-mirror = "digest-only"
[[registry.mirror]]
location = "127.0.0.1:5001/second"

[[registry]]
prefix = "docker.io/nvidia"
location = "nvcr-cache.example/nvidia"
''', monkeypatch)
    got = [(r.base_url, r.repository) for r in oci.targets("rust:1.90.0-slim-bookworm@sha256:" + ZERO)]
    assert got == [("http://mirror.example:5000", "hub/library/rust"),
                   ("http://127.0.0.1:5001", "second/library/rust"),
                   ("https://registry-1.docker.io", "library/rust")]
    got = [(r.base_url, r.repository) for r in oci.targets("nvidia/cuda:13.0.2-devel-ubuntu22.04")]
    assert got == [("https://nvcr-cache.example", "nvidia/cuda")]
    # Not a path-component match: docker.io/nvidiax is not under docker.io/nvidia.
    assert [(r.registry, r.repository) for r in oci.targets("nvidiax/tool:1")][-1] == (
        "registry-1.docker.io", "nvidiax/tool")
    assert [r.registry for r in oci.targets("ghcr.io/astral-sh/uv:0.8.22")] == ["ghcr.io"]


def test_no_registries_conf_asks_the_registry_itself(tmp_path, monkeypatch):
    monkeypatch.delenv("CONTAINERS_REGISTRIES_CONF", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr("k3infra.pins.mirrors.SYSTEM_FILE", tmp_path / "none.conf")
    assert [(r.base_url, r.repository) for r in oci.targets("ghcr.io/astral-sh/uv:0.8.22")] == [
        ("https://ghcr.io", "astral-sh/uv")]


@pytest.mark.parametrize("text, message", [
    ("[[registry]\nlocation = 1", "not readable as TOML"),
    ('[[registry]]\nlocation = "https://mirror.example"', "registry[0].location: expected host[:port][/path] (no scheme, no user:password@, no spaces) (got 'https://mirror.example')"),
    ('[[registry]]\nlocation = "user:pw@mirror.example"', "registry[0].location: expected host[:port][/path] (no scheme, no user:password@, no spaces) (got 'user:pw@mirror.example')"),
    ('[[registry]]\nlocation = "docker.io"\ninsecure = "yes"', "registry[0].insecure: Input should be a valid boolean (got 'yes')"),
    ('[[registry]]\nlocation = "docker.io"\n[[registry.mirror]]\nlocation = "m.example"\ninsecure = 1', "registry[0].mirror[0].insecure: Input should be a valid boolean (got 1)"),
    ("registry = 5", "registry: Input should be a valid list (got 5)"),
    ('[[registry]]\nprefix = "*.docker.io"\nlocation = "x.example"', "wildcard prefixes are not read"),
    ('[[registry]]\nlocation = "docker.io"\n[[registry.mirror]]\nlocation = "m.example"\npull-from-mirror = "sometimes"',
     "registry[0].mirror[0].pull-from-mirror: Input should be 'all', 'digest-only' or 'tag-only' (got 'sometimes')"),
    ('[[registry]]\nlocation = "docker.io"\nblocked = true', "docker.io/library/rust: blocked by"),
])
def test_a_bad_registries_conf_is_one_line_naming_the_file(tmp_path, monkeypatch, text, message):
    path = _conf(tmp_path, text, monkeypatch)
    with pytest.raises(oci.ResolveError) as err:
        oci.resolve("rust:1.90.0-slim-bookworm")
    assert message in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_a_named_registries_conf_that_is_not_a_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(tmp_path))
    with pytest.raises(oci.ResolveError, match="not a regular file"):
        oci.resolve("rust:1.90.0-slim-bookworm")


def test_a_tag_resolves_through_a_loopback_mirror(tmp_path, monkeypatch):
    """Docker Hub's name, the mirror's bytes: the pin keeps the image's own name."""
    why = _missing()
    if why:
        pytest.skip(why)
    from registry import run_registry

    from k3infra.pins import RESOLVED, image_pin

    with run_registry(tmp_path / "registry") as reg:
        pushed = reg.push(config_layout(tmp_path / "l-rust", "1", "rust"), "hub/library/rust", "1.90.0-slim-bookworm")
        _conf(tmp_path, f'[[registry]]\nlocation = "docker.io"\n[[registry.mirror]]\n'
                        f'location = "{reg.address}/hub"\n', monkeypatch)
        pin = image_pin("k3:engine.baseImages.rust", f"rust:1.90.0-slim-bookworm@sha256:{ZERO}", oci.resolve)
    assert pin.state == RESOLVED
    assert pin.resolved == "rust:1.90.0-slim-bookworm@" + pushed.split("@")[1]
    assert pin.source == (f"http://{reg.address}/v2/hub/library/rust/manifests/1.90.0-slim-bookworm "
                          "(manifest, a registries.conf mirror)")


def test_a_registry_mirrored_by_digest_only_is_asked_itself_for_a_tag(tmp_path, monkeypatch):
    """mirror-by-digest-only: its mirrors serve digests, never tags (docs/pins.md)."""
    _conf(tmp_path, '[[registry]]\nlocation = "docker.io"\nmirror-by-digest-only = true\n'
                    '[[registry.mirror]]\nlocation = "mirror.example/hub"\n', monkeypatch)
    assert [(r.base_url, r.repository) for r in oci.targets("rust:1.90.0-slim-bookworm")] == [
        ("https://registry-1.docker.io", "library/rust")]
