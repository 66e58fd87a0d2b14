"""k3infra.plan: the figures the builders read, resolved once from receipt + config. The
builders also run on the stand-in configs of a wired build (k3infra/inputs.py), with the
plan resolved from the plain config: it must not depend on a WIREABLE key."""
from __future__ import annotations

import copy
import dataclasses

import pytest

from k3infra.config import parse_stack_config
from k3infra.inputs import WIREABLE
from k3infra.plan import given_or_resolved, resolve_plan
from k3infra.receipt import load_receipt
from k3infra.render import chosen_receipt, load_config

from conftest import ALL_STACKS, ROOT


def _put(value, parts: list[str], standin):
    """`value` with `standin` at the dotted path `parts` where it exists (`name[]`: each
    item of that list)."""
    if not parts:
        return copy.deepcopy(standin)
    head, rest = parts[0], parts[1:]
    name = head.removesuffix("[]")
    if not isinstance(value, dict) or name not in value:
        return value
    if head.endswith("[]"):
        if not isinstance(value[name], list):
            return value
        return {**value, name: [_put(v, rest, standin) for v in value[name]]}
    return {**value, name: _put(value[name], rest, standin)}


def _standins(raw: dict, which: int) -> dict:
    out = raw
    for key, pair in WIREABLE.items():
        # A whole list's stand-in (other lengths) wins over its items'.
        if key.endswith("[]") and key[:-2] in WIREABLE:
            continue
        out = _put(out, ["k3:" + key.split(".")[0], *key.split(".")[1:]], pair[which])
    return out


@pytest.mark.parametrize("stack", ALL_STACKS)
def test_the_plan_is_the_same_for_both_stand_ins(stack):
    raw, secrets = load_config(stack, [], ROOT)
    receipt = chosen_receipt(raw, ROOT).receipt
    configs = [parse_stack_config(_standins(raw, i), tuple(secrets), receipt=receipt)
               for i in (0, 1)]
    assert configs[0].weights_revision != configs[1].weights_revision
    plans = [resolve_plan(receipt, c, "kimi-k3") for c in configs]
    # The one wired figure: the engine image is k3:engineImage (EngineBuild resolves it
    # per config itself).
    a, b = (dataclasses.replace(p, engine=dataclasses.replace(p.engine, image=None))
            for p in plans)
    assert a == b
    assert a.names is not None and a.names.base == "kimi-k3"


def test_a_child_refuses_the_plan_of_another_receipt():
    """A plan handed to a child must be of the receipt its args name: the builders would
    read one receipt's budgets beside another's flags."""
    raw, secrets = load_config("existing", [], ROOT)
    measured = load_receipt(str(ROOT / "k3infra/receipt/kimi-k3-8xb300-2026-07-29.yaml"))
    candidate = load_receipt(str(ROOT / "k3infra/receipt/kimi-k3-8xb300-vllm-recipe-candidate.yaml"))
    cfg = parse_stack_config(raw, tuple(secrets), receipt=measured)
    plan = resolve_plan(measured, cfg)
    assert given_or_resolved({"plan": plan}, measured, cfg, "VllmServing") is plan
    assert given_or_resolved({}, measured, cfg, "VllmServing") == plan
    with pytest.raises(TypeError, match=r"^VllmServing: args\['plan'\] must be the ServingPlan "
                                        r"of args\['receipt'\] \(kimi-k3-8xb300-vllm-recipe"):
        given_or_resolved({"plan": plan}, candidate, cfg, "VllmServing")
