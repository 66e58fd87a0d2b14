"""`VllmServing`: registers the serving objects the pure builders return."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import pulumi

from k3infra.config import StackConfig
from k3infra.kube import apply_manifest
from k3infra.receipt import Receipt
from k3infra.serving import manifests as m
from k3infra.serving.startup import startup_budget_seconds
from k3infra.weights.manifests import WeightsParts

# How long `pulumi up` waits for the StatefulSet beyond the pods' own startup budget
# (scheduling, image pull of a multi-GB engine image, init-container verification).
ROLLOUT_MARGIN_SECONDS = 1800


class VllmServing(pulumi.ComponentResource):
    """The vLLM StatefulSet with the receipt's flags, its Services and PDB."""

    statefulset: pulumi.CustomResource
    service_name: pulumi.Output[str]

    def __init__(self, name: str, receipt: Receipt, cfg: StackConfig, image: Any,
                 weights: WeightsParts, names: m.ServingNames, instance: str,
                 depends_on: Sequence[pulumi.Resource] = (),
                 opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("k3infra:index:VllmServing", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        budget = startup_budget_seconds(receipt, cfg.serving)
        # Pods start together on create (Parallel) but roll one node at a time on update.
        create = f"{(budget.total_seconds + ROLLOUT_MARGIN_SECONDS) // 60}m"
        update = f"{(cfg.replicas * budget.total_seconds + ROLLOUT_MARGIN_SECONDS) // 60}m"
        self.statefulset = apply_manifest(
            f"{name}-statefulset", m.statefulset(receipt, cfg, image, weights, names, instance),
            pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                depends_on=list(depends_on),
                custom_timeouts=pulumi.CustomTimeouts(create=create, update=update))))
        for svc in m.services(cfg, names, instance):
            apply_manifest(f"{name}-svc-{svc['metadata']['name']}", svc, child)
        apply_manifest(f"{name}-pdb", m.disruption_budget(names, instance), child)
        self.service_name = pulumi.Output.from_input(names.service)
        self.register_outputs({"service_name": self.service_name})
