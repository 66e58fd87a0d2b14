"""`B300NodePool`: the 8x B300 nodes one K3 replica each lands on, plus the cluster
add-ons they need, for one target (aws, oci, nebius, coreweave, existing).

    pool = B300NodePool("k3-pool", cfg)              # cfg: k3infra.config.StackConfig
    VllmServing(..., opts=ResourceOptions(depends_on=[pool]))

Thin: the spec comes from `base.pool_spec`, the cloud resources from the adapter module
of `k3:nodePool.provider`, the Helm releases from `addons.addon_releases`.
"""
from __future__ import annotations

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from k3infra.config import StackConfig
from k3infra.kube import apply_manifest
from k3infra.nodepool.addons import HelmRelease, addon_releases
from k3infra.nodepool.base import PoolSpec, load_adapter, pool_spec
from k3infra.receipt import Receipt


class B300NodePool(pulumi.ComponentResource):
    """Node pool + add-ons. Depend on this component to wait for both."""

    provider: pulumi.Output[str]
    node_type: pulumi.Output[str]
    node_count: pulumi.Output[int]
    node_labels: pulumi.Output[dict]
    addons: pulumi.Output[list]

    def __init__(self, name: str, cfg: StackConfig, receipt: Optional[Receipt] = None,
                 opts: Optional[pulumi.ResourceOptions] = None):
        spec = pool_spec(cfg, receipt, name=name)
        releases = addon_releases(spec)          # refuses a bad charts/ before registering
        adapter = load_adapter(spec.provider)
        super().__init__("k3infra:index:B300NodePool", name, None, opts)
        self.spec = spec
        child = pulumi.ResourceOptions(parent=self)
        self.nodes: list[pulumi.Resource] = adapter.register(
            name, spec, cfg.node_pool.settings, child)
        # Add-ons do not wait for the nodes: their DaemonSets schedule once nodes join.
        self.releases: list[pulumi.Resource] = [
            r for release in releases for r in _register_release(name, release, child)]
        self.provider = pulumi.Output.from_input(spec.provider)
        self.node_type = pulumi.Output.from_input(spec.sku.name)
        self.node_count = pulumi.Output.from_input(spec.node_count)
        self.node_labels = pulumi.Output.from_input(dict(spec.labels))
        self.addons = pulumi.Output.from_input(
            [f"{r.chart}@{r.version}" for r in releases])
        self.register_outputs({"provider": self.provider, "nodeType": self.node_type,
                               "nodeCount": self.node_count, "nodeLabels": self.node_labels,
                               "addons": self.addons})


def _register_release(pool: str, release: HelmRelease,
                      opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    # The operator's DaemonSets mount host paths and run privileged.
    ns = apply_manifest(f"{pool}-{release.name}-namespace", {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": release.namespace, "labels": {
            "app.kubernetes.io/managed-by": "k3infra",
            "pod-security.kubernetes.io/enforce": "privileged"}}}, opts)
    chart = k8s.helm.v4.Chart(
        f"{pool}-{release.name}",
        chart=release.chart, version=release.version,
        repository_opts=k8s.helm.v4.RepositoryOptsArgs(repo=release.repo),
        namespace=release.namespace, values=release.values,
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[ns])))
    return [ns, chart]
