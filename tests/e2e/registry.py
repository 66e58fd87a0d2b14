"""A container registry on a loopback address for the e2e tests: Debian's
``docker-registry`` (distribution 2.8), images pushed with ``skopeo`` from the OCI
layouts ``tools/images/build.sh`` makes, so pods pull by digest as users' pods do.

``run_registry(workdir)`` writes the registry's config into ``workdir`` (storage there
too, listening only on ``host:port``), waits for ``/v2/``, and stops it on exit whatever
happens, then removes its blobs (``remove_stores``); the process also dies with the test
run (apiserver's ``_Processes``: PR_SET_PDEATHSIG). Plain HTTP on a loopback or
in-namespace address: nothing leaves the machine, so no TLS. Works inside a network
namespace (only ``lo`` up is needed).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from apiserver import _Processes, _tail

REGISTRY_BIN = "docker-registry"
SKOPEO_BIN = "skopeo"
START_TIMEOUT_S = 30.0
PUSH_TIMEOUT_S = 1800.0  # the engine-cpu image is ~3 GB of gzip layers on a 2-core machine
# The manifest kinds a pushed image may have; the registry answers HEAD with the digest
# of the one stored.
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
))


class RegistryError(RuntimeError):
    """The registry did not start, or a push failed; the message says which and why."""


def missing_tools() -> str | None:
    """Why the registry cannot run here, or None."""
    for tool, package in ((REGISTRY_BIN, "docker-registry"), (SKOPEO_BIN, "skopeo")):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian: apt-get install {package}; .ci/run installs it)"
    return None


def layout_tag(layout_dir: Path) -> str:
    """The tag of the one image in an OCI layout (its index's ref.name annotation)."""
    index = json.loads((layout_dir / "index.json").read_text())
    names = [m.get("annotations", {}).get("org.opencontainers.image.ref.name")
             for m in index.get("manifests", [])]
    if len(names) != 1 or not names[0]:
        raise RegistryError(f"{layout_dir}/index.json: expected one tagged image, found {names}")
    return names[0]


def layout_digest(layout_dir: Path) -> str:
    """The manifest digest an OCI layout records for its one image."""
    layout_tag(layout_dir)
    return json.loads((layout_dir / "index.json").read_text())["manifests"][0]["digest"]


def config_layout(where: Path, tag: str, label: str, arch: str = "amd64") -> Path:
    """A one-image OCI layout made by umoci, no layers (a config is enough for a manifest):
    something to push under a tag when only its digest matters."""
    for argv in (["umoci", "init", "--layout", str(where)],
                 ["umoci", "new", "--image", f"{where}:{tag}"],
                 ["umoci", "config", "--image", f"{where}:{tag}", "--architecture", arch,
                  "--config.label", f"k3.test={label}"]):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RegistryError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return where


@dataclass(frozen=True)
class Registry:
    address: str  # host:port
    workdir: Path

    def manifest_digest(self, repo: str, reference: str) -> str:
        """The registry's own digest of repo:reference (HEAD, Docker-Content-Digest)."""
        req = urllib.request.Request(f"http://{self.address}/v2/{repo}/manifests/{reference}",
                                     method="HEAD", headers={"Accept": MANIFEST_TYPES})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                digest = resp.headers.get("Docker-Content-Digest", "")
        except urllib.error.HTTPError as exc:
            raise RegistryError(f"{self.address}: HEAD {repo}:{reference} is {exc.code}") from exc
        if not digest.startswith("sha256:") or len(digest) != 71:
            raise RegistryError(f"{self.address}: {repo}:{reference} has no sha256 digest "
                                f"(Docker-Content-Digest: {digest!r})")
        return digest

    def push(self, layout_dir: Path, repo: str, tag: str) -> str:
        """Copy the layout's image to repo:tag; return `address/repo@sha256:...`, the
        digest as the registry reports it (and as skopeo wrote it: both must agree)."""
        layout_dir = Path(layout_dir)
        digest_file = self.workdir / f"push-{repo.replace('/', '_')}-{tag}.digest"
        argv = [SKOPEO_BIN, "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false",
                "--digestfile", str(digest_file),
                f"oci:{layout_dir}:{layout_tag(layout_dir)}", f"docker://{self.address}/{repo}:{tag}"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PUSH_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise RegistryError(f"skopeo copy {layout_dir} -> {repo}:{tag} ran past "
                                f"{PUSH_TIMEOUT_S:.0f} s") from exc
        if done.returncode != 0:
            raise RegistryError(f"skopeo copy {layout_dir} -> {self.address}/{repo}:{tag} "
                                f"failed ({done.returncode}): {done.stderr.strip()}\n"
                                + _tail(self.workdir / "registry.log"))
        digest = self.manifest_digest(repo, tag)
        copied = digest_file.read_text().strip()
        if copied != digest:
            raise RegistryError(f"{repo}:{tag}: skopeo wrote {copied}, the registry has {digest}")
        return f"{self.address}/{repo}@{digest}"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _config(workdir: Path, addr: str) -> str:
    # JSON is YAML. No debug server, no access log (the push's many blob requests),
    # deletes allowed (a test may remove a tag), storage health checks off (a fresh dir).
    return json.dumps({
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(workdir / "storage")},
                    "delete": {"enabled": True}},
        "http": {"addr": addr},
        "health": {"storagedriver": {"enabled": False}},
    }, indent=2) + "\n"


@contextlib.contextmanager
def run_registry(workdir: Path, host: str = "127.0.0.1", port: int = 0) -> Iterator[Registry]:
    """A running registry on host:port (a free port when 0), stopped on exit."""
    reason = missing_tools()
    if reason:
        raise RegistryError(reason)
    workdir.mkdir(parents=True, exist_ok=True)
    address = f"{host}:{port or _free_port(host)}"
    config = workdir / "registry.yaml"
    config.write_text(_config(workdir, address))
    procs = _Processes(workdir)
    try:
        procs.start("registry", [REGISTRY_BIN, "serve", str(config)])
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while True:
            procs.check_alive()
            try:
                with urllib.request.urlopen(f"http://{address}/v2/", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (OSError, urllib.error.URLError) as exc:
                last = f" (last error: {exc})"
            if time.monotonic() > deadline:
                raise RegistryError(f"docker-registry not ready at {address} after "
                                    f"{START_TIMEOUT_S:.0f} s{last}\n{procs.logs()}")
            time.sleep(0.1)
        yield Registry(address=address, workdir=workdir)
    finally:
        procs.stop()
        remove_stores(workdir / "storage")


def remove_stores(*stores: Path) -> None:
    """Image stores once what used them has stopped: a registry's blobs, containerd's or
    Docker's content and snapshots (gigabytes each with the engine image; pytest keeps
    the run folders, and two lanes of `make e2e` hold theirs at once). A folder that still
    holds a mount point is left in place, and said so."""
    with open("/proc/self/mountinfo") as fh:
        mounts = [line.split()[4] for line in fh]
    for store in stores:
        if any(m == str(store) or m.startswith(f"{store}/") for m in mounts):
            print(f"e2e: {store} still holds a mount point; left in place")
            continue
        shutil.rmtree(store, ignore_errors=True)
