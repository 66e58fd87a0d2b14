"""The `K3ServingStack` other languages construct through the provider.

Pulumi's component provider calls `Component(name, args, opts)` and infers the schema
from the annotations of `args` and of the class, with the docstrings under them. This
is k3infra's `K3ServingStack` with the receipt its args name (`receipt`: a shipped id or a
project file; unset: the shipped default), typed args
(`shapes.StackKeys`) and its outputs declared again with descriptions; it
registers the same type token (`k3infra:index:K3ServingStack`), so a program in
TypeScript, Go or YAML builds exactly what a Python program builds with the same args,
and a bad value is refused with the same message.
"""
# No `from __future__ import annotations`: the inference reads these annotations as
# types, not strings.
from typing import Optional

import pulumi

from k3infra import stack
from k3infra.plugin.shapes import StackKeys
from k3infra.receipt import stack_receipt


class K3ServingStack(stack.K3ServingStack):
    """Kimi K3 on 8x NVIDIA B300 with vLLM, deployed exactly as the receipt measured it
    (k3infra; the receipt shipped with the package). Args are the `k3:*` stack keys
    without the prefix (docs/configuration.md)."""

    endpoint: pulumi.Output[str]
    """The OpenAI-compatible API's in-cluster URL (the authenticating proxy's port)."""
    served_model_name: pulumi.Output[str]
    """The model name clients send (`--served-model-name`)."""
    receipt_id: pulumi.Output[str]
    """The receipt this instance deploys."""
    receipt_sha256: pulumi.Output[str]
    """The receipt's content sha256, as the serving StatefulSet records it."""
    receipt_status: pulumi.Output[str]
    """`measured`, or `candidate` (nothing measured yet)."""
    engine_commit: pulumi.Output[Optional[str]]
    """The vLLM commit of the engine image (unset for a released upstream image)."""
    engine_version: pulumi.Output[Optional[str]]
    """The vLLM version of the engine image."""
    wheel_sha256: pulumi.Output[Optional[str]]
    """The sha256 of the vLLM wheel inside the engine image, when known."""
    image_digest: pulumi.Output[str]
    """The engine image's digest (`sha256:<64 hex>`)."""
    engine_profile: pulumi.Output[str]
    """How the engine relates to the measured one (measured, upstream, custom), in words."""
    weights_revision: pulumi.Output[str]
    """The Hub commit of moonshotai/Kimi-K3 the weights are pinned to."""
    tree_digest: pulumi.Output[str]
    """The receipt's digest of the weights tree every replica verifies before it starts."""
    image: pulumi.Output[str]
    """The engine image reference by digest (`repo@sha256:...`)."""
    profile: pulumi.Output[str]
    """`k3:profile`: measured, upstream or custom."""
    license_name: pulumi.Output[str]
    """The model licence acknowledged by `k3:acceptModelLicense`."""
    topology: pulumi.Output[str]
    """`k3:topology`: single-node (the measured configuration) or multi-node (one replica
    across two 4-GPU trays of an NVL72 rack: not the measured configuration)."""

    def __init__(self, name: str, args: StackKeys,
                 opts: Optional[pulumi.ResourceOptions] = None):
        # The receipt the args name (`receipt`) is resolved in the program's project by
        # K3ServingStack; unset, the shipped default (K3INFRA_RECEIPT in tests).
        args = dict(args)
        if args.get("receipt") is None:
            args["receipt"] = stack_receipt(None).receipt
        super().__init__(name, args, opts)
