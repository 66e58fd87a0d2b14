"""The installed package works outside a checkout (issue 31, point 6): the schema's key
descriptions come from the config models and the engine recipe is package data, not
files read from docs/ or images/ of a source tree at run time.

The package tree is what setuptools' build_py writes (the step a wheel is zipped from,
setup.py's recipe copy included), built from a copy of the tracked files into a temp
dir and imported from there with the working directory outside the checkout. build_py
rather than `pip wheel`: the venv's setuptools (65) builds a wheel only with the
`wheel` package, which this venv does not have, and pip's isolated build would need
the network."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from k3infra.engine import component as ec

from conftest import ROOT

# What the package build reads: the rest of the checkout (tests, docs, tools) is absent.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "k3infra", "images")


def test_setup_copies_the_files_the_recipe_has():
    tree = ast.parse((ROOT / "setup.py").read_text())
    (files,) = [ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and node.targets[0].id == "RECIPE_FILES"]
    assert files == ec.RECIPE_FILES


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """k3infra's package tree as a wheel would install it, in a temp dir (the worktree
    gets no build/ or egg-info: the build runs in a copy)."""
    tmp = tmp_path_factory.mktemp("package")
    src = tmp / "src"
    # Tracked and new files, not ignored ones (no build/, egg-info or __pycache__).
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                            *BUILD_INPUTS], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.split()
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    site = tmp / "site"
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib",
                           str(site)], cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return site


def run_installed(site: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)         # ahead of the venv's editable checkout
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_installed_package_reads_no_checkout_file(installed: Path, tmp_path):
    assert (installed / "k3infra/engine/recipe/Dockerfile").read_text() == \
        (ROOT / "images/Dockerfile").read_text()
    assert not (installed / "docs").exists() and not (installed / "images").exists()
    code = f"""
import json
from pathlib import Path
import k3infra
from k3infra.engine import component as ec
from k3infra.plugin import schema
from k3infra.plugin.shapes import ARGS_NAME, SHAPES
assert Path(k3infra.__file__).resolve().is_relative_to({str(installed.resolve())!r}), k3infra.__file__
recipe = ec.find_recipe_dir()
inferred = {{"description": "", "resources": {{schema.COMPONENT: {{"inputProperties": {{
    "namespace": {{"type": "string"}}, "createNamespace": {{"type": "boolean"}}}}}}}},
    "types": {{f"k3infra:index:{{n}}": {{}} for n in SHAPES if n != ARGS_NAME}}}}
props = schema.complete(inferred, "k3infra")["resources"][schema.COMPONENT]["inputProperties"]
print(json.dumps({{"recipe": str(recipe), "files": sorted(ec.recipe_files(recipe)),
                  "createNamespace": props["createNamespace"]["description"]}}))
"""
    proc = run_installed(installed, code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["recipe"] == str((installed / "k3infra/engine/recipe").resolve())
    assert out["files"] == ["Dockerfile", "k3_engine_build.py"]     # no locks in git
    assert out["createNamespace"].startswith("`k3:createNamespace`. `true`: the instance "
                                             "creates the namespace")
