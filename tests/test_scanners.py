"""Third-party scanners over every shipped stack's rendered manifests:

- `kubernetes-validate --strict` (OpenAPI schemas of real Kubernetes releases; unknown
  fields fail) against Kubernetes 1.33 and the newest release it ships;
- `checkov --framework kubernetes`: no failed check; every skip is annotated on its object
  with a reason (k3infra/checkov_skips.py) and listed in docs/policy.md.

Each stack is rendered once (conftest cache) and scanned by checkov once per session.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from k3infra import checkov_skips
from k3infra.render import write_render

from conftest import ROOT, STACKS, render

K8S_VERSIONS = ("1.33.0", kubernetes_validate.utils.latest_version())
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
KNOWN_SKIPS = {(s.check, s.reason) for s in checkov_skips.ALL_SKIPS}
SERVING_SKIPS = {checkov_skips.ENGINE_IMAGE_UID.check, checkov_skips.VLLM_API_KEY_ENV.check}
# API groups whose kinds kubernetes-validate has schemas for (built-in Kubernetes APIs).
_BUILTIN_GROUP = re.compile(r"^([a-z0-9]+/v\d\w*|v1|[a-z.]*k8s\.io/v\d\w*)$")


def checkov_binary() -> str:
    for candidate in (os.environ.get("K3INFRA_CHECKOV"), str(ROOT / ".venv-scan" / "bin" / "checkov")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("checkov not found: set K3INFRA_CHECKOV or run `make test`, which installs it "
                "into .venv-scan (requirements-scan.txt)")


def run_checkov(directory: Path) -> dict:
    """checkov's JSON report for one directory of manifests (one report dict)."""
    proc = subprocess.run([checkov_binary(), "-d", str(directory), "--framework", "kubernetes",
                           "-o", "json", "--compact", "--skip-download"],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "LOG_LEVEL": "ERROR"})
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report.get("check_type") in (None, "kubernetes"), report.get("check_type")
    return report


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> dict[str, Path]:
    """stack -> its rendered manifests directory (written once)."""
    out = {}
    for stack in STACKS:
        d = tmp_path_factory.mktemp(f"scan-{stack}")
        write_render(render(stack), d)
        out[stack] = d / "manifests"
    return out


@pytest.fixture(scope="session")
def checkov_reports(rendered) -> dict[str, dict]:
    """stack -> checkov report; the stacks scanned two at a time (2 cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = dict(zip(rendered, pool.map(run_checkov, rendered.values())))
    summary = {s: {k: r["summary"][k] for k in ("passed", "failed", "skipped")}
               for s, r in reports.items()}
    print(f"\ncheckov pass/fail/skip per stack: {json.dumps(summary)}")
    return reports


# --- kubernetes-validate ---------------------------------------------------------------------

@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("stack", STACKS)
def test_kubernetes_validate_strict(rendered, stack, version):
    files = sorted(rendered[stack].glob("*.yaml"))
    assert files
    proc = subprocess.run([str(VALIDATE), "--strict", "-k", version, *map(str, files)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for path in files:
        obj = yaml.safe_load(path.read_text())
        mentioned = [line for line in lines if f" {path} " in f"{line} "]
        if _BUILTIN_GROUP.match(obj["apiVersion"]):
            assert any("passed" in line for line in mentioned), (path.name, mentioned)
        else:
            # A custom resource: no schema ships for it, and the scanner says so.
            assert any("Couldn't find schema" in line for line in mentioned), (path.name, mentioned)


def test_kubernetes_validate_strict_catches_an_unknown_field(rendered, tmp_path):
    sts_file = next(p for p in rendered["existing"].glob("*.yaml")
                    if yaml.safe_load(p.read_text())["kind"] == "StatefulSet")
    broken = yaml.safe_load(sts_file.read_text())
    broken["spec"]["template"]["spec"]["containers"][0]["startupProbes"] = {}
    bad = tmp_path / "statefulset.yaml"
    bad.write_text(yaml.safe_dump(broken))
    proc = subprocess.run([str(VALIDATE), "--strict", "-k", K8S_VERSIONS[-1], str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "startupProbes" in proc.stdout + proc.stderr


# --- checkov -----------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_checkov_finds_no_failed_check(checkov_reports, stack):
    report = checkov_reports[stack]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}"
              for c in report["results"]["failed_checks"]]
    assert failed == []
    assert report["summary"]["parsing_errors"] == 0
    assert report["summary"]["passed"] > 100


@pytest.mark.parametrize("stack", STACKS)
def test_checkov_skips_are_the_documented_ones_with_reasons(checkov_reports, stack):
    doc = (ROOT / "docs" / "policy.md").read_text()
    for c in checkov_reports[stack]["results"]["skipped_checks"]:
        assert (c["check_id"], c["check_result"]["suppress_comment"]) in KNOWN_SKIPS, c["check_id"]
        kind = c["resource"].split(".")[0]
        assert re.search(rf"{c['check_id']}.*{kind}", doc), f"{c['check_id']} on {kind} not in docs"


def test_checkov_skips_are_load_bearing(rendered, tmp_path):
    """Control: the render with the serving StatefulSet's skip annotations removed fails
    exactly the checks skipped there, so the skips are load-bearing and checkov ran."""
    for path in rendered["existing"].glob("*.yaml"):
        obj = yaml.safe_load(path.read_text())
        if obj["kind"] == "StatefulSet":
            obj["metadata"]["annotations"] = {k: v for k, v in obj["metadata"]["annotations"].items()
                                              if not k.startswith("checkov.io/")}
        (tmp_path / path.name).write_text(yaml.safe_dump(obj))
    report = run_checkov(tmp_path)
    failed = {c["check_id"] for c in report["results"]["failed_checks"]}
    skipped_here = {c["check_id"] for c in report["results"].get("skipped_checks", [])
                    if c["resource"].startswith("StatefulSet.")}
    assert failed == SERVING_SKIPS and not skipped_here
