"""`k3infra pins` against real servers on loopback: Debian's docker-registry with images
pushed by skopeo (umoci layouts made here, one a two-platform index), `git daemon` with a
refs/pull/N/head, the loopback Hub; a fake API client for the cluster's CIDRs, and a
small Bearer-token stub for the registry token flow (the Debian registry runs without
auth). Skipped, with the reason, where a Debian tool is missing."""
from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "tests"))

from k3infra.pins import cluster, oci, stackwrite  # noqa: E402

pytest.importorskip("ruamel.yaml", reason="ruamel.yaml not installed (constraints.txt pins it)")

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
        def list_namespaced_endpoint_slice(self, namespace, label_selector):
            calls.append((namespace, label_selector))
            return _slices((["10.0.0.12"], True), (["fd00::1", "10.0.0.11"], None), (["10.0.0.99"], False))

    assert cluster.api_server_cidrs(Api()) == ["10.0.0.11/32", "10.0.0.12/32", "fd00::1/128"]
    assert calls == [("default", "kubernetes.io/service-name=kubernetes")]


def test_cidrs_refuse_an_empty_slice():
    api = SimpleNamespace(list_namespaced_endpoint_slice=lambda *a, **k: _slices())
    with pytest.raises(cluster.ClusterError, match="no ready address"):
        cluster.api_server_cidrs(api)


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
    """401 + WWW-Authenticate Bearer until the token from /token is presented."""
    digest = "sha256:" + hashlib.sha256(b"{}").hexdigest()
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
            body = json.dumps({"os": "linux", "architecture": "amd64"}).encode()
        else:
            body = json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:" + "c" * 64}}).encode()
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


def test_write_quotes_a_value_yaml_would_misread(tmp_path):
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text("config:\n  k3:replicas: 1  # kept\n")
    assert stackwrite.set_values(path, [(("k3:weightsRevision",), "1" * 39 + "0"),
                                        (("k3:gpuProduct",), "B300")]) == (
        "config:\n  k3:replicas: 1  # kept\n"
        f'  k3:weightsRevision: "{"1" * 39 + "0"}"\n  k3:gpuProduct: B300\n')
