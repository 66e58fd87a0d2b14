"""The stack program (`__main__.py`): Pulumi config -> one cluster provider, the cluster
add-ons, one K3ServingStack instance -> stack outputs."""
from __future__ import annotations

import pulumi
from pulumi.runtime import config as runtime_config

from k3infra.config import CONFIG_NAMESPACE, ConfigError, chosen_receipt, parse_stack_config
from k3infra.engine.result import EngineBuildError
from k3infra.gates import GateError
from k3infra.hbm import HbmError
from k3infra.naming import PROGRAM_INSTANCE as INSTANCE  # names derive from it
from k3infra.nodepool.base import pool_spec
from k3infra.nodepool.cluster_access import cluster_provider
from k3infra.nodepool.cluster_addons import ClusterAddons
from k3infra.receipt import ReceiptError
from k3infra.stack import K3ServingStack


def read_k3_config() -> tuple[dict[str, str], list[str]]:
    """All `k3:*` keys Pulumi passed to this program, and which of them are secrets."""
    keys = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw = {k: runtime_config.get_config(k) for k in keys
           if k.startswith(f"{CONFIG_NAMESPACE}:")}
    secret = [k for k in raw if runtime_config.is_config_secret(k)]
    return raw, secret


def run(offline_render: bool = False) -> None:
    """`offline_render`: passed by `k3infra render` only (see `__main__.py`)."""
    try:
        raw, secret = read_k3_config()
        # The stack's own receipt (k3:receipt), resolved in the project (the working
        # directory `pulumi` runs the program in) before the rest is judged against it.
        receipt = chosen_receipt(raw).receipt
        cfg = parse_stack_config(raw, tuple(secret), receipt=receipt)
        if cfg.host is not None:      # one Docker host, no cluster (k3infra/host)
            # Here, not at the top: pulumi-docker is an optional dependency (the `host`
            # extra), which a cluster stack need not install.
            from k3infra.host.component import K3HostStack

            stack = K3HostStack(INSTANCE, {"config": cfg, "receipt": receipt,
                                           "offlineRender": offline_render})
        else:
            # Nodes and Kubernetes objects go to one cluster: the one the pool targets
            # (aws, oci, nebius); elsewhere the stack's default provider (kubernetes:*).
            k8s = cluster_provider(f"{INSTANCE}-cluster", cfg)
            providers = [k8s] if k8s is not None else None
            depends_on = []
            if pool_spec(cfg, receipt).gpu_operator:
                depends_on.append(ClusterAddons("cluster-addons", {"config": cfg, "receipt": receipt},
                                                pulumi.ResourceOptions(providers=providers)))
            stack = K3ServingStack(INSTANCE, {"config": cfg, "receipt": receipt,
                                              "offlineRender": offline_render},
                                   pulumi.ResourceOptions(providers=providers, depends_on=depends_on))
    except (ConfigError, GateError, HbmError, EngineBuildError, ReceiptError) as exc:
        # The CLI prints a RunError's message alone: a refusal is not a crash, and a
        # Python traceback would bury the key, the value and what is accepted.
        raise pulumi.RunError(f"k3infra: {exc}") from exc
    for key, value in stack.outputs().items():
        pulumi.export(key, value)
