"""Bring-your-own nodes: nothing is created. Serving pods select nodes by the GPU
feature discovery product label (k3:gpuProduct) and tolerate the usual GPU taint; see
k3infra.placement."""
from __future__ import annotations

import pulumi

from k3infra.inputs import StackInputs
from k3infra.nodepool.base import PoolSpec


def register(name: str, spec: PoolSpec, inputs: StackInputs,
             opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    return []
