"""`ServingOperations`: registers the NetworkPolicies (always) and, as k3:monitoring asks,
the metrics Service + ServiceMonitor, the PrometheusRule and the dashboard ConfigMap;
with k3:autoscaling, the KEDA ScaledObject."""
from __future__ import annotations

from typing import NotRequired, Optional, Required, TypedDict, Union

import pulumi

from k3infra import naming
from k3infra.componentargs import required
from k3infra.config import StackConfig
from k3infra.inputs import StackInputs
from k3infra.kube import apply_built, child_options
from k3infra.operations.autoscaling import scaled_object
from k3infra.operations.dashboard import dashboard_configmap
from k3infra.operations.monitoring import monitoring_objects
from k3infra.operations.network import network_policies
from k3infra.plan import ServingPlan, given_or_resolved
from k3infra.receipt import Receipt


def _objects(plan: ServingPlan, cfg: StackConfig, names: naming.ServingNames,
             instance: str) -> list[dict]:
    objects = monitoring_objects(plan, cfg, names, instance)
    if cfg.monitoring.dashboard:
        objects.append(dashboard_configmap(plan, cfg, names, instance))
    if cfg.autoscaling.enabled:
        objects.append(scaled_object(plan, cfg, names, instance))
    return objects


class ServingOperationsArgs(TypedDict):
    receipt: Required[Receipt]      # the receipt the stack deploys
    config: Required[Union[StackConfig, StackInputs]]  # the validated stack config
    names: Required[naming.ServingNames]   # the instance's object names
    instance: Required[str]
    plan: NotRequired[ServingPlan]  # the stack's (k3infra.plan); resolved here when absent


class ServingOperations(pulumi.ComponentResource):
    """What operating the serving pods needs beyond the pods themselves. Every child
    records the component's `opts.depends_on` (the namespace)."""

    network_policy_names: pulumi.Output[list]
    monitoring_kinds: pulumi.Output[list]

    def __init__(self, name: str, args: ServingOperationsArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        receipt = required(args, "receipt", "ServingOperations", Receipt)
        inputs = StackInputs.of(required(args, "config", "ServingOperations",
                                         (StackConfig, StackInputs), "the validated stack config"))
        names = required(args, "names", "ServingOperations", naming.ServingNames)
        instance = required(args, "instance", "ServingOperations", str)
        plan = given_or_resolved(args, receipt, inputs.plain, "ServingOperations")
        super().__init__("k3infra:index:ServingOperations", name, None, opts)
        policies = network_policies(inputs.plain, names, instance)
        for i, policy in enumerate(policies):
            apply_built(f"{name}-netpol-{policy['metadata']['name']}", inputs,
                        lambda c, i=i: network_policies(c, names, instance)[i],
                        child_options(self, opts))
        objects = _objects(plan, inputs.plain, names, instance)
        for i, obj in enumerate(objects):
            apply_built(f"{name}-{obj['kind'].lower()}-{obj['metadata']['name']}", inputs,
                        lambda c, i=i: _objects(plan, c, names, instance)[i],
                        child_options(self, opts))
        self.network_policy_names = pulumi.Output.from_input(
            [p["metadata"]["name"] for p in policies])
        self.monitoring_kinds = pulumi.Output.from_input([o["kind"] for o in objects])
        self.register_outputs({"network_policy_names": self.network_policy_names,
                               "monitoring_kinds": self.monitoring_kinds})
