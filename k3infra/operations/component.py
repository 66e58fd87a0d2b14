"""`ServingOperations`: registers the NetworkPolicies (always) and, as k3:monitoring asks,
the metrics Service + ServiceMonitor, the PrometheusRule and the dashboard ConfigMap."""
from __future__ import annotations

from typing import Optional

import pulumi

from k3infra.config import StackConfig
from k3infra.kube import apply_manifest
from k3infra.operations.dashboard import dashboard_configmap
from k3infra.operations.monitoring import monitoring_objects
from k3infra.operations.network import network_policies
from k3infra.receipt import Receipt
from k3infra.serving import manifests as m


class ServingOperations(pulumi.ComponentResource):
    """What operating the serving pods needs beyond the pods themselves."""

    network_policy_names: pulumi.Output[list]
    monitoring_kinds: pulumi.Output[list]

    def __init__(self, name: str, receipt: Receipt, cfg: StackConfig, names: m.ServingNames,
                 instance: str, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("k3infra:index:ServingOperations", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        policies = network_policies(cfg, names, instance)
        for policy in policies:
            apply_manifest(f"{name}-netpol-{policy['metadata']['name']}", policy, child)
        objects = monitoring_objects(receipt, cfg, names, instance)
        if cfg.monitoring.dashboard:
            objects.append(dashboard_configmap(receipt, cfg, names, instance))
        for obj in objects:
            apply_manifest(f"{name}-{obj['kind'].lower()}-{obj['metadata']['name']}", obj, child)
        self.network_policy_names = pulumi.Output.from_input(
            [p["metadata"]["name"] for p in policies])
        self.monitoring_kinds = pulumi.Output.from_input([o["kind"] for o in objects])
        self.register_outputs({"network_policy_names": self.network_policy_names,
                               "monitoring_kinds": self.monitoring_kinds})
