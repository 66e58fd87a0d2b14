"""k3infra: Kimi K3 on 8x NVIDIA B300 with vLLM, deployed exactly as measured.

`from k3infra import K3ServingStack, K3ServingStackArgs, ClusterAddons` in any Pulumi
program (docs/component.md). The
import is lazy so the `k3infra` CLI's short commands (`k3infra weights verify`, `k3infra
startup`) do not pay for loading the Pulumi SDK. No pod imports this package: pod code
ships as package files in ConfigMaps (k3infra/podfiles.py).
"""

__all__ = ["K3ServingStack", "K3ServingStackArgs", "ClusterAddons"]


def __getattr__(name: str):
    # Lazy (see the docstring): the components load the Pulumi SDK and pulumi-kubernetes,
    # 0.19 s (python -X importtime).
    if name == "ClusterAddons":
        from k3infra.nodepool.cluster_addons import ClusterAddons

        return ClusterAddons
    if name in __all__:
        from k3infra import stack

        return getattr(stack, name)
    raise AttributeError(f"module 'k3infra' has no attribute {name!r}")
