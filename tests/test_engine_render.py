"""The real stack program, rendered offline in each engine mode: the build shows in the
plan, the StatefulSet's image is EngineBuild's digest output, the stack outputs carry
commit / wheel hash / digest / profile, and `upstream` says it is not the measured engine."""
from __future__ import annotations

import functools
import os

import pytest

from k3infra.cli import main
from k3infra.config import apply_override
from k3infra.engine.component import PLACEHOLDER_DIGEST
from k3infra.engine.plan import NOT_MEASURED
from k3infra.policies.runner import check_plan
from k3infra.render import load_config, run_program

from conftest import GOOD_REVISION, PREBUILT, ROOT, container, manifest, render

REPO = "registry.example.com/k3/vllm"
BUILD = {"registry": REPO, "registrySecret": "push"}


@functools.lru_cache(maxsize=None)
def render_mode(engine: str) -> object:
    """The shipped `existing` stack switched to a build mode: without k3:engineImage
    (a build's image is its output), with k3:engine set to `engine` (JSON)."""
    raw, secrets = load_config("existing", [f"weightsRevision={GOOD_REVISION}"], ROOT)
    raw.pop("k3:engineImage", None)
    apply_override(raw, f"k3:engine={engine}")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return run_program("existing", raw, secrets, ROOT)
    finally:
        os.chdir(cwd)


def in_cluster():
    import json
    return render_mode(json.dumps({"build": "in-cluster", **BUILD}))


def local():
    import json
    return render_mode(json.dumps({"build": "local", "registry": REPO}))


def engine_component(r):
    (comp,) = r.by_type("k3infra:index:EngineBuild")
    return comp


def test_prebuilt_render_uses_the_configured_digest(receipt):
    r = render("existing", f"weightsRevision={GOOD_REVISION}", *PREBUILT)
    engine_component(r)
    image = container(r)["image"]
    assert image == r.raw_config["k3:engineImage"]
    assert r.outputs["image"] == image
    assert r.outputs["imageDigest"] == image.split("@", 1)[1]
    assert r.outputs["engineCommit"] == receipt.engine.commit
    assert r.outputs["wheelSha256"] is None
    assert r.outputs["engineProfile"].startswith("measured:")
    assert not [x for x in r.manifests() if "engine-build" in x["metadata"]["name"]]


def test_in_cluster_render_shows_the_build_and_the_image_is_its_output(receipt):
    r = in_cluster()
    comp = engine_component(r)
    job = manifest(r, "Job", next(x["metadata"]["name"] for x in r.manifests()
                                  if x["kind"] == "Job" and "engine-build" in x["metadata"]["name"]))
    resources = {x["name"]: x for x in r.resources}
    job_res = next(x for x in r.resources if x["inputs"] is job)
    assert job_res["parent"] == comp["urn"]
    # the Job waits for its RBAC and ConfigMaps (the result read, a ReadResource, is
    # not a registration and so not in plan.json; test_engine_component covers it)
    deps = {resources[n]["urn"] for n in (
        "kimi-k3-engine-namespace", "kimi-k3-engine-service-account", "kimi-k3-engine-role",
        "kimi-k3-engine-role-binding", "kimi-k3-engine-job-files", "kimi-k3-engine-result", "kimi-k3-engine-context")}
    assert deps <= set(job_res["dependsOn"])
    assert job_res["customTimeouts"]["create"].endswith("m")
    # the StatefulSet's image is the build's digest output (a labelled placeholder offline)
    image = f"{REPO}@{PLACEHOLDER_DIGEST}"
    assert container(r)["image"] == image
    assert r.outputs["image"] == image and r.outputs["imageDigest"] == PLACEHOLDER_DIGEST
    assert any("written by Job" in w for w in r.warnings)
    assert r.outputs["engineCommit"] == receipt.engine.commit
    assert "built in-cluster" in r.outputs["engineProfile"]


def test_in_cluster_render_passes_the_policy_pack():
    assert check_plan(in_cluster().plan()).mandatory == []


def test_in_cluster_render_passes_kubernetes_validate_and_checkov(tmp_path):
    """The same scanners the shipped stacks pass (tests/test_scanners.py), on the build."""
    import json
    import subprocess
    from pathlib import Path

    import kubernetes_validate

    from k3infra.render import write_render

    r = in_cluster()
    for obj in r.manifests():
        for version in ("1.33.0", kubernetes_validate.utils.latest_version()):
            kubernetes_validate.validate(obj, version, strict=True)
    write_render(r, tmp_path)
    checkov = os.environ.get("K3INFRA_CHECKOV") or str(ROOT / ".venv-scan" / "bin" / "checkov")
    if not Path(checkov).is_file():
        pytest.fail("checkov not found: set K3INFRA_CHECKOV or run `make test`")
    proc = subprocess.run([checkov, "-d", str(tmp_path / "manifests"), "--framework",
                           "kubernetes", "-o", "json", "--compact", "--skip-download"],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "LOG_LEVEL": "ERROR"})
    report = json.loads(proc.stdout)
    report = report[0] if isinstance(report, list) else report
    failed = [(f["check_id"], f["resource"]) for f in report["results"]["failed_checks"]]
    assert failed == []


def test_local_render_registers_both_passes():
    r = local()
    images = r.by_type("docker-build:index:Image")
    assert [i["inputs"]["target"] for i in images] == ["wheel-export", "runtime"]
    assert images[1]["inputs"]["push"] is True
    assert container(r)["image"] == f"{REPO}@{PLACEHOLDER_DIGEST}"
    assert r.outputs["imageDigest"] == PLACEHOLDER_DIGEST


def test_upstream_render_is_labelled_not_the_measured_engine():
    r = render("existing", f"weightsRevision={GOOD_REVISION}", "k3:profile=upstream", *PREBUILT,
               'k3:engine={"build": "prebuilt", "upstreamVersion": "0.33.0"}')
    assert NOT_MEASURED in r.outputs["engineProfile"]
    assert r.outputs["engineCommit"] is None
    assert r.outputs["engineVersion"] == "0.33.0"
    assert container(r)["image"] == r.raw_config["k3:engineImage"]


def test_render_cli_prints_the_engine_label(tmp_path, capsys):
    code = main(["render", "--stack", "existing", "--out", str(tmp_path),
                 "--config", f"weightsRevision={GOOD_REVISION}", "--config", "k3:profile=upstream",
                 *(a for c in PREBUILT for a in ("--config", c))])
    assert code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert NOT_MEASURED in out


@pytest.mark.parametrize("engine, key", [
    ('{"build": "in-cluster", "registry": "registry.example.com/k3/vllm"}', "k3:engine.registrySecret"),
    ('{"build": "local"}', "k3:engine.registry"),
])
def test_render_cli_refuses_a_bad_engine_config_in_one_line(engine, key, tmp_path, capsys):
    code = main(["render", "--stack", "existing", "--out", str(tmp_path),
                 "--config", f"weightsRevision={GOOD_REVISION}", "--config", f"k3:engine={engine}"])
    assert code == 2
    err = capsys.readouterr().err
    assert key in err or "k3:engineImage" in err
