"""k3infra's CrossGuard policy pack: policies that refuse a K3 deployment which is not the
measured configuration, is unpinned, or is unsafe.

The policies are plain pulumi-policy objects, importable without starting anything:
`policy/__main__.py` serves them to `pulumi preview --policy-pack policy/`, and
`k3infra policy check DIR` (runner.py) feeds a render's plan.json through the very same
objects with pulumi-policy's own argument types.

Every policy judges against the chosen receipt (k3infra.receipt.load_receipt():
$K3INFRA_RECEIPT, else the shipped one), read when it runs. Descriptions and config
defaults are of the receipt chosen when this package was imported: the same one in the
pack's own process, which the Pulumi CLI starts with the user's environment.
"""
from __future__ import annotations

import pulumi_policy
from pulumi_policy import EnforcementLevel, Policy

from k3infra.policies import (cluster_objects, drift, engine, exposure, gateway, gating, hardware,
                               host, images, multinode, pod_security, secrets)

PACK_NAME = "k3infra"
DESCRIPTION = ("Kimi K3 on 8x B300: refuse deployments that drift from the measured serving "
               "receipt, are not pinned, or are unsafe")

POLICIES: list[Policy] = [
    *drift.POLICIES,
    *images.POLICIES,
    *hardware.POLICIES,
    *multinode.POLICIES,
    *gating.POLICIES,
    *engine.POLICIES,
    *secrets.POLICIES,
    *pod_security.POLICIES,
    *cluster_objects.POLICIES,
    *exposure.POLICIES,
    *gateway.POLICIES,
    *host.POLICIES,
]


def policy(name: str) -> Policy:
    """The pack's policy of that name (KeyError naming the known ones otherwise)."""
    for p in POLICIES:
        if p.name == name:
            return p
    raise KeyError(f"no policy {name!r}; known: {', '.join(p.name for p in POLICIES)}")


def level(p: Policy) -> EnforcementLevel:
    return p.enforcement_level or EnforcementLevel.MANDATORY


def serve_pack() -> None:
    """Start the analyzer server (blocks; what `pulumi preview --policy-pack` runs)."""
    # Looked up on the module when called: tests replace pulumi_policy.PolicyPack.
    pulumi_policy.PolicyPack(name=PACK_NAME, policies=list(POLICIES),
                             enforcement_level=EnforcementLevel.MANDATORY,
                             description=DESCRIPTION)
