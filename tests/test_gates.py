"""Deployment gates: the licence acknowledgement and the placeholders refuse an update
(`pulumi up`) and warn in a preview or an offline render.

An update is simulated with the SDK's mocks in non-preview mode and the offline-render
variable unset: the same condition `pulumi up` runs the program under."""
from __future__ import annotations

import asyncio
import logging

import pulumi
import json

import pytest
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from k3infra import gates
from k3infra.receipt import load_receipt
from k3infra.config import parse_stack_config
from k3infra.stack import K3ServingStack

from conftest import GOOD_REVISION, render

IMAGE = "registry.example.com/k3/vllm-k3@sha256:" + "ab" * 32
PIN = f"weightsRevision={GOOD_REVISION}"
REAL_IMAGE = f"engineImage={IMAGE}"
PROXY = "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:" + "cd" * 32
REAL_PROXY = f"serving.proxyImage={PROXY}"


def thresholds(receipt) -> list[str]:
    """The figures the licence text must carry, read from the receipt."""
    return [f"Section {s.section}: {s.text}" for s in receipt.license.sections]


def test_licence_sections_carry_the_published_thresholds(receipt):
    # The receipt is the source; this pins it to K3_FACTS.md's wording of the thresholds.
    text = gates.license_text(receipt)
    for needle in ("Section 2", "Model-as-a-Service", "20M USD in any 12 months",
                   "Section 3", "100M monthly active users", "20M USD monthly revenue",
                   "Section 4", "internal use"):
        assert needle in text


class _Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args):
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args):
        return {}


def _run_stack(raw: dict, *, preview: bool) -> tuple[list[str], dict]:
    """Construct K3ServingStack under mocks; return (warnings, resolved outputs)."""
    warnings: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    logger = logging.getLogger(f"k3infra.test.gates.{id(warnings)}")
    logger.propagate = False
    logger.handlers = [Capture()]
    built: dict[str, K3ServingStack] = {}

    def program():
        built["stack"] = K3ServingStack("k3", {
            "config": parse_stack_config(raw, receipt=load_receipt()), "receipt": load_receipt()})

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        pulumi.runtime.set_mocks(_Mocks(), project="k3", stack="gates", preview=preview,
                                 logger=logger)
        _sync_await(run_pulumi_func(program))
        outputs = {k: _sync_await(v.future()) for k, v in built["stack"].outputs().items()
                   if k in ("licenseName", "profile", "receiptId")}
        return warnings, outputs
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def _raw(**overrides) -> dict:
    raw = {"k3:weightsRevision": GOOD_REVISION, "k3:apiKey": "sk-test",
           "k3:engineImage": IMAGE, "k3:acceptModelLicense": "false",
           "k3:serving": json.dumps({"proxyImage": PROXY})}
    raw.update({f"k3:{k}": v for k, v in overrides.items()})
    return raw


@pytest.fixture
def update_mode(monkeypatch):
    """`pulumi up`: not a preview, and not `k3infra render`. The variable that used to
    switch the gates off is set on purpose: nothing reads the environment any more, so
    an update with it still refuses (only the renderer's explicit argument renders)."""
    monkeypatch.setenv("K3INFRA_OFFLINE_RENDER", "1")


def test_update_without_licence_acknowledgement_is_refused(update_mode, receipt):
    with pytest.raises(gates.GateError) as exc:
        _run_stack(_raw(), preview=False)
    message = str(exc.value)
    assert message.startswith("refusing to update")
    assert "k3:acceptModelLicense" in message
    for needle in thresholds(receipt):
        assert needle in message


def test_update_with_licence_acknowledgement_proceeds(update_mode, receipt):
    warnings, outputs = _run_stack(_raw(acceptModelLicense="true"), preview=False)
    assert not any("k3:acceptModelLicense" in w for w in warnings)
    assert outputs["licenseName"] == receipt.license.name


def test_preview_without_acknowledgement_warns_and_does_not_refuse(update_mode, receipt):
    warnings, outputs = _run_stack(_raw(), preview=True)
    licence = [w for w in warnings if w.startswith("k3:acceptModelLicense")]
    assert len(licence) == 1
    for needle in thresholds(receipt):
        assert needle in licence[0]
    assert outputs["licenseName"] == receipt.license.name


@pytest.mark.parametrize("key,value", [
    ("weightsRevision", "0" * 40),
    ("engineImage", "registry.example.com/k3/vllm-k3@sha256:" + "0" * 64),
])
def test_update_with_a_placeholder_is_refused_even_with_the_licence(update_mode, key, value):
    with pytest.raises(gates.GateError) as exc:
        _run_stack(_raw(acceptModelLicense="true", **{key: value}), preview=False)
    assert f"k3:{key}" in str(exc.value) and "placeholder" in str(exc.value)
    assert "k3:acceptModelLicense" not in str(exc.value)


def test_non_measured_profile_warns_but_does_not_refuse_an_update(update_mode, receipt):
    warnings, outputs = _run_stack(
        _raw(acceptModelLicense="true", profile="custom",
             custom='{"args": ["--max-num-seqs", "16"]}'), preview=False)
    assert outputs["profile"] == "custom"
    assert any(w.startswith("k3:profile") and "NOT the measured configuration" in w
               for w in warnings)


def test_render_of_the_shipped_stack_warns_with_the_thresholds(receipt):
    r = render("existing")                       # placeholders, licence not accepted
    licence = [w for w in r.warnings if w.startswith("k3:acceptModelLicense")]
    assert len(licence) == 1
    for needle in thresholds(receipt):
        assert needle in licence[0]
    assert any(w.startswith("k3:weightsRevision") and "placeholder" in w for w in r.warnings)
    assert any(w.startswith("k3:engine.buildkitImage") and "placeholder" in w
               for w in r.warnings)
    assert r.outputs["licenseName"] == receipt.license.name


def test_render_with_acknowledgement_has_no_licence_warning(receipt):
    r = render("existing", PIN, 'engine={"build": "prebuilt"}', REAL_IMAGE, REAL_PROXY,
               "acceptModelLicense=true")
    assert not [w for w in r.warnings if "k3:acceptModelLicense" in w]
    assert not [w for w in r.warnings if "placeholder" in w]
    assert r.outputs["licenseName"] == receipt.license.name


def test_shipped_stacks_do_not_accept_the_licence():
    from conftest import ALL_STACKS, ROOT
    from k3infra.config import read_stack_file, stack_file

    for stack in ALL_STACKS:
        raw, _ = read_stack_file(stack_file(stack, ROOT))
        assert raw.get("k3:acceptModelLicense", False) in (False, "false"), stack


def test_the_proxy_image_placeholder_refuses_an_update(update_mode):
    """The serving proxy's shipped digest is a placeholder, refused like the others."""
    raw = _raw(acceptModelLicense="true")
    del raw["k3:serving"]
    with pytest.raises(gates.GateError) as err:
        _run_stack(raw, preview=False)
    assert "k3:serving.proxyImage" in str(err.value)
