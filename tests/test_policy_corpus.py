"""The corpus of broken variants of a rendered stack: every one is refused by the policy
it is written against, through the offline runner and through `k3infra policy check`."""
from __future__ import annotations

import json

import pytest

from k3infra.cli import main
from k3infra.policies.runner import check_plan

from conftest import render
from policy_corpus import CORPUS


@pytest.fixture(scope="module")
def plan() -> dict:
    return render("existing").plan()


def test_corpus_is_large_and_ids_unique():
    assert len(CORPUS) >= 25
    assert len({v.id for v in CORPUS}) == len(CORPUS)


def test_the_unbroken_render_passes(plan):
    assert check_plan(plan).mandatory == []


@pytest.mark.parametrize("variant", CORPUS, ids=lambda v: v.id)
def test_variant_is_caught_by_its_policy(plan, variant):
    report = check_plan(variant.apply(plan))
    caught = report.by_policy(variant.policy)
    assert caught and all(f.level == "mandatory" and not f.could_not_run for f in caught)


@pytest.mark.parametrize("variant", CORPUS, ids=lambda v: v.id)
def test_policy_check_cli_fails_naming_the_policy(plan, variant, tmp_path, capsys):
    (tmp_path / "plan.json").write_text(json.dumps(variant.apply(plan)))
    assert main(["policy", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    failed = out.split("FAILED:", 1)[1]
    assert variant.policy in " ".join(failed.split())
