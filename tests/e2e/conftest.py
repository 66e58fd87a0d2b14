"""Fixtures for the real-engine tests (`make e2e`): the binaries `make engine` built
(K3INFRA_ENGINE_BIN), one PULUMI_HOME with the Kubernetes provider installed from its
file, and per-test copies of the project with their own file:// backend."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from engine import Pulumi, copy_project, install_provider


@pytest.fixture(scope="session")
def engine_bin() -> Path:
    value = os.environ.get("K3INFRA_ENGINE_BIN")
    if not value or not (Path(value) / "pulumi").exists():
        pytest.skip("K3INFRA_ENGINE_BIN is not set to the engine bin dir: run `make e2e`")
    bin_dir = Path(value)
    out = subprocess.run([str(bin_dir / "pulumi"), "version"], capture_output=True, text=True)
    print(f"\nengine: pulumi {out.stdout.strip()} from {bin_dir}")
    return bin_dir


@pytest.fixture(scope="session")
def pulumi_home(engine_bin, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("pulumi-home")
    install_provider(Pulumi(engine_bin, home, home / "unused", home))
    return home


@pytest.fixture
def project(tmp_path) -> Path:
    return copy_project(tmp_path / "k3")


@pytest.fixture
def pulumi(engine_bin, pulumi_home, project, tmp_path) -> Pulumi:
    backend = tmp_path / "state"
    backend.mkdir()
    return Pulumi(engine_bin, pulumi_home, backend, project)
