"""The API server's addresses as CIDRs, from the `kubernetes` EndpointSlices in
`default` of the cluster the kubeconfig names (what `kubectl get endpointslices -n
default -l kubernetes.io/service-name=kubernetes` lists), through the kubernetes client."""
from __future__ import annotations

import ipaddress

SELECTOR = "kubernetes.io/service-name=kubernetes"


class ClusterError(RuntimeError):
    """No kubeconfig, or the cluster did not list the API server's endpoints."""


def discovery_api(kubeconfig: str | None = None):
    # Here, not at the top: the kubernetes client is optional (the `cluster` extra) and
    # takes 0.54 s to import (python -X importtime); only `pins --resolve` of the API
    # server's CIDRs reads a cluster.
    from kubernetes import client, config

    try:
        config.load_kube_config(config_file=kubeconfig)
    except Exception as exc:  # the client raises ConfigException or OSError
        raise ClusterError(f"no usable kubeconfig ({kubeconfig or '$KUBECONFIG or ~/.kube/config'}): "
                           f"{exc}") from None
    return client.DiscoveryV1Api()


def api_server_cidrs(api) -> list[str]:
    """Each ready address of the slices as a /32 (IPv4) or /128 (IPv6), sorted."""
    try:
        slices = api.list_namespaced_endpoint_slice("default", label_selector=SELECTOR,
                                                    _request_timeout=(10, 20))
    except Exception as exc:  # ApiException, urllib3 errors: one line either way
        raise ClusterError(f"listing EndpointSlices in default failed: {str(exc).splitlines()[0]}") from None
    found = set()
    for item in slices.items or []:
        for endpoint in item.endpoints or []:
            if endpoint.conditions is not None and endpoint.conditions.ready is False:
                continue
            for addr in endpoint.addresses or []:
                found.add(ipaddress.ip_network(addr))
    if not found:
        raise ClusterError("the cluster lists no ready address for the kubernetes Service")
    return [str(n) for n in sorted(found, key=lambda n: (n.version, n))]
