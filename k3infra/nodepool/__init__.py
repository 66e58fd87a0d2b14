"""B300 node pools on every target: one interface (`base`), one adapter module per
cloud, Helm add-ons (`addons`) and the `B300NodePool` component.

Importing this package imports no cloud SDK; `B300NodePool` imports the adapter (and its
SDK) of the configured provider only.
"""
from k3infra.nodepool.base import PROVIDERS, NodeSku, PoolSpec, node_sku, pool_spec

__all__ = ["PROVIDERS", "NodeSku", "PoolSpec", "node_sku", "pool_spec", "B300NodePool"]


def __getattr__(name: str):
    # Lazy: the component imports the Pulumi SDK and pulumi-kubernetes (0.19 s, python -X
    # importtime), and every import of a k3infra.nodepool module runs this file first,
    # a pure one (base: the pool specs) too.
    if name == "B300NodePool":
        from k3infra.nodepool.component import B300NodePool
        return B300NodePool
    raise AttributeError(name)
