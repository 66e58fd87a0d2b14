"""docs/operations.md stays true: every alert and every metric name is documented, and
the figures it quotes are the ones the code derives from the receipt and the default
config (its k3:monitoring / k3:network tables are written from the models:
tests/test_config_reference.py)."""
from __future__ import annotations

from k3infra.config import parse_stack_config
from k3infra.receipt import load_receipt
from k3infra.operations import monitoring as mon
from k3infra.operations.metric_names import catalogue
from k3infra.plan import resolve_plan
from k3infra.serving import manifests as m
from k3infra.serving.startup import startup_budget_seconds

from conftest import GOOD_REVISION, ROOT

DOC = (ROOT / "docs" / "operations.md").read_text()
FLAT = " ".join(DOC.split())


def default_cfg():
    return parse_stack_config({"k3:weightsRevision": GOOD_REVISION, "k3:apiKey": "x",
                               "k3:engineImage": "r/x@sha256:" + "1" * 64}, receipt=load_receipt())


def test_every_alert_is_documented(receipt):
    cfg = default_cfg()
    for rule in mon.alert_rules(resolve_plan(receipt, cfg), cfg, m.ServingNames(m.APP, "k3")):
        assert f"`{rule['alert']}`" in DOC, rule["alert"]


def test_every_listed_metric_is_documented():
    for metric in catalogue()[1].values():
        assert any(f"`{name}`" in DOC for name in (metric.name, *metric.exposed)), metric.name


def test_quoted_figures_are_the_derived_ones(receipt):
    cfg = default_cfg()
    plan = resolve_plan(receipt, cfg)
    ref = plan.reference
    assert f"p99 {ref.p99_ms:g} ms at concurrency {ref.concurrency}" in FLAT
    assert f"fires above {plan.p99_threshold_seconds:.3f} s" in FLAT
    assert f"default {cfg.monitoring.p99_margin_pct:g} % margin" in FLAT
    assert f"p50 ({ref.p50_ms / 1000:g} s) and p99 ({ref.p99_ms / 1000:g} s)" in FLAT
    assert f"{startup_budget_seconds(receipt, cfg).total_seconds} s with the defaults" in FLAT
    assert f"so it sleeps {plan.drain_seconds} s with the shipped receipt" in FLAT
    assert f"default {cfg.serving.termination_grace_seconds})" in FLAT
    assert f"p99 {ref.p99_ms:g} ms at concurrency {ref.concurrency}, rounded up" in FLAT


def test_licence_thresholds_are_in_the_doc(receipt):
    flat = FLAT.replace("\u2011", "-")
    for needle in ("Section 2", "over 20M USD in any 12 months", "Section 3",
                   "100M monthly active users", "20M USD monthly revenue", "Section 4",
                   "purely internal use is exempt"):
        assert needle in flat, needle
    assert receipt.license.name in flat
