"""The real Pulumi engine for the e2e tests: the binaries `make testbed` built, run offline.

Every run uses a `file://` backend and a PULUMI_HOME in temporary folders, a passphrase
secrets provider, no update check and no plugin download (a missing plugin is an error),
and a KUBECONFIG pointing at a missing file so nothing reaches an ambient cluster.
Commands and the tail of their output are printed, so `make e2e` shows what ran.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Optional

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PASSPHRASE = "k3infra-e2e-passphrase"      # test-only; never a user's secret
KUBERNETES_PROVIDER = version("pulumi-kubernetes")


# The `existing` stack's values in the e2e tests (test-only; never a user's secret).
REVISION = "3f1c2b4a5d6e7f8091a2b3c4d5e6f708192a3b4c"
API_KEY = "e2e-api-key-d41d8cd98f00b204"          # must never appear in state or files
HF_TOKEN = "hf_e2eTokenNeverInState0123456789"
IMAGE = "registry.example.com/k3/vllm-k3@sha256:" + "5e" * 32
PROXY_IMAGE = "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:" + "7a" * 32


class PulumiError(AssertionError):
    pass


@dataclass
class Pulumi:
    """One user's Pulumi: a CLI, a PULUMI_HOME, a backend, a working directory."""

    bin_dir: Path
    home: Path
    backend: Path
    cwd: Path
    extra_env: dict = field(default_factory=dict)
    quiet: bool = False
    use_login: bool = False     # True: the backend is whatever `pulumi login` chose


    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_", "KUBE"))}
        env.update({
            "PATH": f"{self.bin_dir}:{env.get('PATH', '')}",
            "PULUMI_HOME": str(self.home),
            "PULUMI_BACKEND_URL": f"file://{self.backend}",
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            # Plugins come from PULUMI_HOME (installed from their files), not from PATH.
            "PULUMI_IGNORE_AMBIENT_PLUGINS": "true",
            "PULUMI_SKIP_CONFIRMATIONS": "true",
            "PULUMI_COPILOT": "false",
            "KUBECONFIG": str(self.home / "no-such-kubeconfig"),
            "NO_COLOR": "1",
        })
        if self.use_login:
            env.pop("PULUMI_BACKEND_URL")
        env.update(self.extra_env)
        return env

    def run(self, *args: str, check: bool = True, cwd: Optional[Path] = None,
            input: Optional[str] = None, timeout: int = 1200, show: int = 12
            ) -> subprocess.CompletedProcess:
        """`pulumi ARGS` (stdin is not a terminal, so the CLI is non-interactive)."""
        return self.shell(" ".join(["pulumi", *map(_quote, args)]), check=check, cwd=cwd,
                          input=input, timeout=timeout, show=show)

    def shell(self, line: str, check: bool = True, cwd: Optional[Path] = None,
              input: Optional[str] = None, timeout: int = 1200, show: int = 12
              ) -> subprocess.CompletedProcess:
        """One shell command line as a user types it, with this Pulumi on PATH."""
        start = time.monotonic()
        proc = subprocess.run(["bash", "-c", line], cwd=cwd or self.cwd, env=self.env(),
                              input=input if input is not None else "",
                              capture_output=True, text=True, timeout=timeout)
        took = time.monotonic() - start
        if not self.quiet:
            print(f"\n$ {line}    [exit {proc.returncode}, {took:.1f} s]")
            out = (proc.stdout + proc.stderr).rstrip().splitlines()
            for text in out[-show:] if show else []:
                print(f"    {text}")
        if check and proc.returncode != 0:
            raise PulumiError(f"{line} exited {proc.returncode}\n"
                              f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        return proc

    def json(self, *args: str, **kw) -> object:
        return json.loads(self.run(*args, "--json", show=0, **kw).stdout)

    def state_resources(self, stack: Optional[str] = None) -> list[dict]:
        args = ["stack", "export"] + (["--stack", stack] if stack else [])
        doc = json.loads(self.run(*args, show=0).stdout)
        return doc.get("deployment", {}).get("resources") or []


def _quote(arg: str) -> str:
    import shlex
    return shlex.quote(arg)


def copy_project(dest: Path) -> Path:
    """A copy of the repository's tracked files (what a user clones), sharing `.venv`."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, files.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    # The copy's files keep their mtimes; mark the shared venv current so a `make venv`
    # in the copy (the README's first step) never reinstalls `-e .` from the copy.
    installed = ROOT / ".venv" / "bin" / ".installed"
    if installed.exists():
        os.utime(installed)
    return dest


def install_provider(pulumi: Pulumi) -> None:
    """The Kubernetes provider `make testbed` built, installed without a download."""
    plugin = pulumi.bin_dir / "pulumi-resource-kubernetes"
    pulumi.run("plugin", "install", "resource", "kubernetes", f"v{KUBERNETES_PROVIDER}",
               "--file", str(plugin.resolve()))


def read_manifests(directory: Path) -> list[dict]:
    """Every object the provider wrote under renderYamlToDirectory (0-crd/, 1-manifest/)."""
    objs = []
    for path in sorted(directory.rglob("*.yaml")):
        objs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return objs


def object_key(obj: dict) -> tuple:
    meta = obj.get("metadata", {})
    return (obj.get("apiVersion"), obj.get("kind"), meta.get("namespace"), meta.get("name"))


# --- the `existing` stack as the README sets it up -------------------------------------

def stack_ready(pulumi: Pulumi, *extra: tuple[str, ...]) -> None:
    """The `existing` stack as the README sets it up, with a prebuilt engine image (an
    in-cluster build needs a cluster to run its Job) and the licence acknowledged."""
    pulumi.run("stack", "init", "existing")
    for args in (("k3:weightsRevision", REVISION),
                 ("--path", "k3:weights.storageClass", "rwx-e2e"),
                 ("--path", "k3:engine.build", "prebuilt"),
                 ("k3:engineImage", IMAGE),
                 ("--path", "k3:serving.proxyImage", PROXY_IMAGE),
                 ("--secret", "k3:apiKey", API_KEY),
                 ("--secret", "k3:hfToken", HF_TOKEN),
                 ("k3:acceptModelLicense", "true"), *extra):
        pulumi.run("config", "set", *args, show=0)


def render_mode(pulumi: Pulumi, out: Path) -> None:
    pulumi.run("config", "set", "kubernetes:renderYamlToDirectory", str(out), show=0)


def copy_template(pulumi: Pulumi, stack: str = "existing") -> None:
    pulumi.shell(f"cp stacks/examples/Pulumi.{stack}.yaml stacks/", show=0)


def offline_render(pulumi: Pulumi, out: Path) -> list[dict]:
    """`k3infra render` of the same stack file (the user's, with their ciphertext)."""
    subprocess.run([str(ROOT / ".venv/bin/k3infra"), "render", "--stack", "existing",
                    "--out", str(out)], cwd=pulumi.cwd, check=True, capture_output=True, text=True)
    return [yaml.safe_load(p.read_text()) for p in sorted((out / "manifests").glob("*.yaml"))]


# --- fixtures (imported by the test modules: a second conftest.py would shadow the suite's
# own `conftest` module, which the unit tests import by name) -----------------------------

@pytest.fixture(scope="session")
def testbed_bin() -> Path:
    value = os.environ.get("K3INFRA_TESTBED_BIN")
    if not value or not (Path(value) / "pulumi").exists():
        pytest.skip("K3INFRA_TESTBED_BIN is not set to the testbed bin dir: run `make e2e`")
    bin_dir = Path(value)
    out = subprocess.run([str(bin_dir / "pulumi"), "version"], capture_output=True, text=True)
    print(f"\nengine: pulumi {out.stdout.strip()} from {bin_dir}")
    return bin_dir


@pytest.fixture(scope="session")
def pulumi_home(testbed_bin, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("pulumi-home")
    install_provider(Pulumi(testbed_bin, home, home / "unused", home))
    return home


@pytest.fixture
def project(tmp_path) -> Path:
    return copy_project(tmp_path / "k3")


@pytest.fixture
def pulumi(testbed_bin, pulumi_home, project, tmp_path) -> Pulumi:
    backend = tmp_path / "state"
    backend.mkdir()
    return Pulumi(testbed_bin, pulumi_home, backend, project)
