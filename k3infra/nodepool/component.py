"""`B300NodePool`: the 8x B300 nodes one K3 instance's replicas land on, for one target
(aws, oci, nebius, coreweave, existing). Its nodes carry `k3infra.dev/pool: <instance>`.

    pool = B300NodePool("kimi-k3-pool", {"config": cfg, "receipt": receipt, "instance": "kimi-k3"})
    VllmServing(..., opts=ResourceOptions(depends_on=[pool]))

Thin: the spec comes from `base.pool_spec`, the cloud resources from the adapter module
of `k3:nodePool.provider`. Cluster-wide add-ons (the GPU Operator) are not part of a
pool: `ClusterAddons` (k3infra.nodepool.cluster_addons) installs them once per cluster.
"""
from __future__ import annotations

from typing import NotRequired, Optional, Required, TypedDict, Union

import pulumi

from k3infra.componentargs import required
from k3infra.config import StackConfig
from k3infra.inputs import StackInputs
from k3infra.kube import child_options
from k3infra.nodepool.base import load_adapter, pool_spec
from k3infra.receipt import Receipt


class B300NodePoolArgs(TypedDict):
    config: Required[Union[StackConfig, StackInputs]]  # the validated stack config
    receipt: Required[Receipt]      # the receipt the stack deploys
    instance: NotRequired[str]      # the instance whose replicas land on the pool (its
                                    # nodes' k3infra.dev/pool label); default: from the name


class B300NodePool(pulumi.ComponentResource):
    """The pool's nodes. Depend on this component to wait for them."""

    provider: pulumi.Output[str]
    node_type: pulumi.Output[str]
    node_count: pulumi.Output[int]
    node_labels: pulumi.Output[dict]

    def __init__(self, name: str, args: B300NodePoolArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        inputs = StackInputs.of(required(args, "config", "B300NodePool", (StackConfig, StackInputs),
                                         "the validated stack config"))
        receipt = required(args, "receipt", "B300NodePool", Receipt)
        spec = pool_spec(inputs.plain, receipt, name=name, instance=args.get("instance"))
        adapter = load_adapter(spec.provider)
        super().__init__("k3infra:index:B300NodePool", name, None, opts)
        self.spec = spec
        self.nodes: list[pulumi.Resource] = adapter.register(
            name, spec, inputs, child_options(self, opts))
        self.provider = pulumi.Output.from_input(spec.provider)
        self.node_type = pulumi.Output.from_input(spec.sku.name)
        self.node_count = pulumi.Output.from_input(spec.node_count)
        self.node_labels = pulumi.Output.from_input(dict(spec.labels))
        self.register_outputs({"provider": self.provider, "nodeType": self.node_type,
                               "nodeCount": self.node_count, "nodeLabels": self.node_labels})
