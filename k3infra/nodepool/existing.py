"""Bring-your-own nodes: nothing is created. Serving pods select nodes by the GPU
feature discovery product label (k3:gpuProduct) and tolerate the usual GPU taint; see
k3infra.placement."""
from __future__ import annotations

from typing import Optional

import pulumi

from k3infra.config import ExistingPoolConfig
from k3infra.nodepool.base import PoolSpec


def register(name: str, spec: PoolSpec, settings: Optional[ExistingPoolConfig],
             opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    return []
