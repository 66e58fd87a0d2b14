"""`ClusterAddons`: cluster-wide add-ons, once per cluster (today: the NVIDIA GPU
Operator, when `k3:nodePool.gpuOperator` asks for it). Opt-in and separate from the
per-instance `K3ServingStack`, so two instances in one cluster never fight over one Helm
release; the stack program creates it and makes the instance depend on it.

    addons = ClusterAddons("cluster-addons", {"config": cfg, "receipt": receipt},
                           ResourceOptions(provider=k8s))
    K3ServingStack("kimi-k3", {"config": cfg, "receipt": receipt},
                   ResourceOptions(provider=k8s, depends_on=[addons]))
"""
from __future__ import annotations

from pathlib import Path
from typing import NotRequired, Optional, Required, TypedDict, Union

import pulumi
import pulumi_kubernetes as k8s

from k3infra.componentargs import required
from k3infra.config import StackConfig
from k3infra.kube import apply_manifest, child_options
from k3infra.nodepool.addons import HelmRelease, addon_releases
from k3infra.nodepool.base import pool_spec
from k3infra.receipt import Receipt


class ClusterAddonsArgs(TypedDict):
    config: Required[StackConfig]   # the validated stack config (k3:nodePool)
    receipt: Required[Receipt]      # the receipt the stack deploys
    chartsDir: NotRequired[Union[Path, str]]   # charts/addons.yaml's directory (default:
                                               # the package's; tests pass their own)


class ClusterAddons(pulumi.ComponentResource):
    """Pinned Helm releases from charts/addons.yaml for the pool's cloud."""

    addons: pulumi.Output[list]

    def __init__(self, name: str, args: ClusterAddonsArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        cfg = required(args, "config", "ClusterAddons", StackConfig, "the validated stack config")
        receipt = required(args, "receipt", "ClusterAddons", Receipt)
        charts_dir = args.get("chartsDir")
        releases = addon_releases(pool_spec(cfg, receipt),
                                  Path(charts_dir) if charts_dir is not None else None)  # refuses first
        super().__init__("k3infra:index:ClusterAddons", name, None, opts)
        self.releases: list[pulumi.Resource] = [
            r for release in releases for r in _register_release(self, name, release, opts)]
        self.addons = pulumi.Output.from_input([f"{r.chart}@{r.version}" for r in releases])
        self.register_outputs({"addons": self.addons})


def _register_release(parent: pulumi.Resource, name: str, release: HelmRelease,
                      opts: Optional[pulumi.ResourceOptions]) -> list[pulumi.Resource]:
    # The operator's DaemonSets mount host paths and run privileged.
    ns = apply_manifest(f"{name}-{release.name}-namespace", {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": release.namespace, "labels": {
            "app.kubernetes.io/managed-by": "k3infra",
            "pod-security.kubernetes.io/enforce": "privileged"}}}, child_options(parent, opts))
    chart = k8s.helm.v4.Chart(
        f"{name}-{release.name}",
        chart=release.chart, version=release.version,
        repository_opts=k8s.helm.v4.RepositoryOptsArgs(repo=release.repo),
        namespace=release.namespace, values=release.values,
        opts=child_options(parent, opts, ns))
    return [ns, chart]
