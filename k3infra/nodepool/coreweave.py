"""CoreWeave adapter: a CKS `NodePool` custom resource (compute.coreweave.com/v1alpha1)
applied to the cluster itself. CKS manages the NVIDIA driver and device plugin, so no
GPU Operator is installed here.
"""
from __future__ import annotations

from typing import Any

import pulumi

from k3infra.config import CoreWeavePoolConfig
from k3infra.inputs import StackInputs
from k3infra.kube import apply_built
from k3infra.nodepool.base import PoolSpec

API_VERSION = "compute.coreweave.com/v1alpha1"


def node_pool_manifest(name: str, spec: PoolSpec,
                       settings: CoreWeavePoolConfig) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": "NodePool",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "k3infra"}},
        "spec": {
            "instanceType": settings.instance_type,
            "targetNodes": spec.node_count,
            "autoscaling": False,
            "nodeLabels": dict(spec.labels),
            "nodeTaints": [dict(t) for t in spec.taints],
        },
    }


def register(name: str, spec: PoolSpec, inputs: StackInputs,
             opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    return [apply_built(f"{name}-cks-nodepool", inputs,
                        lambda c: node_pool_manifest(name, spec, c.node_pool.coreweave), opts)]
