"""The `kubernetes.Provider` of the cluster a node pool targets, so the nodes and every
Kubernetes object of the stack go to the same cluster.

- aws: the EKS cluster `k3:nodePool.aws.clusterName` (endpoint and CA from
  `aws.eks.get_cluster`; tokens from `aws eks get-token`, the AWS CLI's exec plugin);
- oci: the OKE cluster `k3:nodePool.oci.clusterId` (OKE's own kubeconfig, whose exec
  plugin is `oci ce cluster generate-token`);
- nebius: the MK8s cluster `k3:nodePool.nebius.clusterId` (endpoint and CA from
  `nebius.get_mk8s_v1_cluster`; tokens from `nebius mk8s cluster get-token`);
- coreweave / existing: no cloud resource names the cluster; no provider is built, so
  the objects use Pulumi's default kubernetes provider, configured by the stack's
  `kubernetes:*` keys (kubeconfig, context, renderYamlToDirectory) or the ambient
  kubeconfig: the user's choice of cluster, not k3infra's.

The exec plugins run on the machine that runs `pulumi`; none of this was exercised
against a live cluster here (docs/clouds.md).
"""
from __future__ import annotations

import base64
import json
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from k3infra.config import StackConfig

EXEC_API = "client.authentication.k8s.io/v1beta1"
# What an offline render's mock runtime answers to the cluster lookups (no cloud there):
# a visibly fake endpoint, so the render still shows one explicit provider per cluster.
RENDER_ENDPOINT = "https://cluster.render.invalid"
RENDER_LOOKUPS = {
    "aws:eks/getCluster:getCluster": {
        "endpoint": RENDER_ENDPOINT, "certificateAuthorities": [{"data": ""}]},
    "oci:ContainerEngine/getClusterKubeConfig:getClusterKubeConfig": {"content": "{}"},
    "nebius:index/getMk8sV1Cluster:getMk8sV1Cluster": {"status": {"controlPlane": {
        "endpoints": {"publicEndpoint": RENDER_ENDPOINT}, "auth": {"clusterCaCertificate": ""}}}},
}


def exec_kubeconfig(cluster: str, server: str, ca_base64: str, command: str,
                    args: list[str]) -> str:
    """A kubeconfig (JSON is YAML) with one cluster, one exec-plugin user, one context."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": cluster,
        "clusters": [{"name": cluster, "cluster": {
            "server": server, "certificate-authority-data": ca_base64}}],
        "users": [{"name": cluster, "user": {"exec": {
            "apiVersion": EXEC_API, "command": command, "args": list(args),
            "interactiveMode": "Never"}}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster}}],
    })


def eks_kubeconfig(name: str, endpoint: str, ca_base64: str) -> str:
    return exec_kubeconfig(name, endpoint, ca_base64, "aws",
                           ["eks", "get-token", "--cluster-name", name, "--output", "json"])


def nebius_kubeconfig(cluster_id: str, endpoint: str, ca_pem: str) -> str:
    return exec_kubeconfig(cluster_id, endpoint, base64.b64encode(ca_pem.encode()).decode(),
                           "nebius", ["mk8s", "cluster", "get-token", "--format", "json"])


def kubeconfig(cfg: StackConfig) -> Any:
    """Kubeconfig (an Output) of the cluster the pool targets; None: the default one."""
    pool = cfg.node_pool
    # Each cloud SDK here, not at the top: optional dependencies (the aws, oci and nebius
    # extras), the one the stack's provider needs installed alone.
    if pool.provider == "aws":
        import pulumi_aws as aws

        name = pool.aws.cluster_name
        eks = aws.eks.get_cluster_output(name=name)
        return pulumi.Output.all(eks.endpoint, eks.certificate_authorities).apply(
            lambda v: eks_kubeconfig(name, v[0], v[1][0]["data"] if isinstance(v[1][0], dict)
                                     else v[1][0].data))
    if pool.provider == "oci":
        import pulumi_oci as oci

        return oci.containerengine.get_cluster_kube_config_output(
            cluster_id=pool.oci.cluster_id, token_version="2.0.0").content
    if pool.provider == "nebius":
        import pulumi_nebius as nebius

        cluster = nebius.get_mk8s_v1_cluster_output(id=pool.nebius.cluster_id)
        return cluster.status.apply(lambda s: nebius_kubeconfig(
            pool.nebius.cluster_id, _nebius_endpoint(s), _get(_get(_get(s, "control_plane"), "auth"),
                                                         "cluster_ca_certificate")))
    return None


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key)


def _nebius_endpoint(status: Any) -> str:
    endpoints = _get(_get(status, "control_plane"), "endpoints")
    public = _get(endpoints, "public_endpoint")
    return public if public else _get(endpoints, "private_endpoint")


def cluster_provider(name: str, cfg: StackConfig,
                     opts: pulumi.ResourceOptions | None = None) -> k8s.Provider | None:
    """An explicit kubernetes.Provider for the pool's cluster; None where no cloud
    resource names it (coreweave, existing: the stack's default provider)."""
    config = kubeconfig(cfg)
    if config is None:
        return None
    return k8s.Provider(name, kubeconfig=pulumi.Output.secret(config), opts=opts)
