"""Deployment gates: conditions that warn in a preview or an offline render and refuse
an update (`pulumi up`). Shipped stacks carry placeholders and do not accept the model
licence on the user's behalf, so they render everywhere but cannot be deployed as-is.

Whether a run is an offline render is passed explicitly by the renderer
(`offlineRender` in `K3ServingStack`'s args); nothing here reads the environment.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi

from k3infra.config import StackConfig
from k3infra.receipt import NOTHING_MEASURED, Receipt
from k3infra.topology import not_measured_text

PLACEHOLDER_HEX = "0" * 64


@dataclass(frozen=True)
class Gate:
    key: str
    message: str
    # False: a label to show, never a refusal (a non-measured profile is a choice).
    refuses: bool = True


class GateError(pulumi.RunError, RuntimeError):
    """An update was refused by a gate. A RunError: the CLI shows its message alone,
    also when the component runs inside someone else's program."""


def is_placeholder(value: str | None) -> bool:
    """All-zero hex (a commit or an image digest) marks a value the user must replace."""
    if not value:
        return False
    tail = value.rsplit("@sha256:", 1)[-1]
    return len(tail) >= 40 and set(tail) == {"0"}


def license_text(receipt: Receipt) -> str:
    lic = receipt.license
    return (f"The {lic.name} applies to the weights ({lic.commercial_use} commercial use). "
            f"{lic.thresholds_text()}. {lic.gated_note[:1].upper()}{lic.gated_note[1:]}. Set k3:acceptModelLicense to true "
            "once you have read it and your use complies.")


def deployment_gates(receipt: Receipt, cfg: StackConfig) -> list[Gate]:
    gates = []
    if not cfg.accept_model_license:
        gates.append(Gate("k3:acceptModelLicense", license_text(receipt)))
    for key, value in (("k3:weightsRevision", cfg.weights_revision),
                       ("k3:engineImage", cfg.engine_image),
                       ("k3:serving.proxyImage", cfg.serving.proxy_image),
                       ("k3:accuracy.image",
                        cfg.accuracy.image if cfg.accuracy.enabled else None)):
        if is_placeholder(value):
            gates.append(Gate(key, f"{value} is a placeholder: replace it with your pinned value"))
    if receipt.is_candidate:
        gates.append(Gate("k3:receipt", f"{receipt.id} is a candidate: {NOTHING_MEASURED} "
                          f"(flags from {receipt.source}); benchmark it on your nodes "
                          "(k3:benchmark.enabled) and measure it into a receipt with `k3infra "
                          "bench receipt` (docs/receipts.md)", refuses=False))
    if cfg.profile != "measured":
        gates_note = ("the upstream engine is not the measured engine"
                      if cfg.profile == "upstream" else "custom engine-path settings")
        gates.append(Gate("k3:profile", f"{cfg.profile}: NOT the measured configuration of "
                          f"receipt {receipt.id} ({gates_note}); figures must be re-measured",
                          refuses=False))
    if cfg.topology == "multi-node":
        gates.append(Gate("k3:topology", f"{not_measured_text(receipt)}; figures must be "
                          "re-measured (docs/multinode.md)", refuses=False))
    return gates


def is_update(offline_render: bool = False) -> bool:
    """`pulumi up` (not a preview), unless the caller says this is an offline render."""
    return not offline_render and not pulumi.runtime.is_dry_run()


def enforce(gates: list[Gate], offline_render: bool = False) -> None:
    """Warn about every gate; on an update, refuse if any refusing gate is open."""
    refusing = [g for g in gates if g.refuses]
    for g in gates:
        pulumi.log.warn(f"{g.key}: {g.message}")
    if refusing and is_update(offline_render):
        raise GateError("refusing to update: " + "; ".join(f"{g.key}: {g.message}" for g in refusing))
