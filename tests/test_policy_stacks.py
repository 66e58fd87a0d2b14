"""Every shipped stack (stacks/Pulumi.*.yaml, whatever exists) and the main config
variations render into something the pack accepts: zero mandatory violations, through
the runner and through `k3infra policy check` on the written render."""
from __future__ import annotations

import json

import pytest

from k3infra.cli import main
from k3infra.policies.runner import check_plan
from k3infra.receipt import load_receipt
from k3infra.render import write_render

from conftest import PREBUILT, STACKS, render

VARIATIONS = {
    "benchmark": ('k3:benchmark={"enabled": true}',),
    "monitoring": ('k3:monitoring={"serviceMonitor": true, "prometheusRule": true, '
                   '"dashboard": true}',),
    "upstream": ("k3:profile=upstream", *PREBUILT),
    "prebuilt": PREBUILT,
    "hf-token": ("k3:hfToken=placeholder-token",),
    "two-replicas": ("k3:replicas=2",),
    # The full commit `k3infra pins` records (the walk-through's preview met this refused).
    "engine-commit": ("k3:engine.commit=" + (load_receipt().engine.commit + "0" * 40)[:40],),
}


def _mandatory(plan: dict) -> list[str]:
    return [f"{f.policy}: {f.resource}: {f.message}" for f in check_plan(plan).mandatory]


def test_stacks_are_shipped():
    assert "existing" in STACKS and len(STACKS) >= 1


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stack_has_no_mandatory_violation(stack):
    assert _mandatory(render(stack).plan()) == []


@pytest.mark.parametrize("name", sorted(VARIATIONS))
def test_config_variation_has_no_mandatory_violation(name):
    assert _mandatory(render("existing", *VARIATIONS[name]).plan()) == []


@pytest.mark.parametrize("stack", STACKS)
def test_policy_check_cli_passes_a_written_render(stack, tmp_path, capsys):
    write_render(render(stack), tmp_path)
    assert main(["policy", "check", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "0 mandatory" in out and "FAILED" not in out


def test_policy_check_cli_usage_errors(tmp_path, capsys):
    assert main(["policy", "check", str(tmp_path)]) == 2
    assert "no plan.json" in capsys.readouterr().err
    write_render(render("existing"), tmp_path)
    bad = tmp_path / "pack.json"
    bad.write_text(json.dumps({"k3-not-a-policy": "advisory"}))
    assert main(["policy", "check", str(tmp_path), "--policy-config", str(bad)]) == 2
    assert "k3-not-a-policy" in capsys.readouterr().err


def test_policy_check_cli_applies_pack_config(tmp_path, capsys):
    write_render(render("existing"), tmp_path)
    cfg = tmp_path / "pack.json"
    cfg.write_text(json.dumps({"k3-license-acknowledged": "mandatory"}))
    assert main(["policy", "check", str(tmp_path), "--policy-config", str(cfg)]) == 1
    assert "k3-license-acknowledged" in capsys.readouterr().out


def test_policy_list_cli(capsys):
    assert main(["policy", "list"]) == 0
    out = capsys.readouterr().out
    assert "k3-serve-flags" in out and "k3-hbm-fit" in out


@pytest.mark.parametrize("stack", ["existing", "host"])
def test_licence_advisory_on_cluster_and_host_renders(stack):
    """Issue 33: the host stack serves the weights too; the advisory must show on its render."""
    names = [f.policy for f in check_plan(render(stack).plan()).advisory]
    assert names.count("k3-license-acknowledged") == 1
    accepted = check_plan(render(stack, "k3:acceptModelLicense=true").plan()).advisory
    assert "k3-license-acknowledged" not in [f.policy for f in accepted]
