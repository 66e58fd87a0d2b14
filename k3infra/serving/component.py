"""`VllmServing`: registers the serving objects the pure builders return."""
from __future__ import annotations

from typing import Callable, NotRequired, Optional, Required, Sequence, TypedDict, Union

import pulumi

from k3infra.componentargs import required
from k3infra.config import StackConfig
from k3infra.inputs import StackInputs, wired_build
from k3infra.kube import apply_built, apply_manifest, child_options
from k3infra.plan import ServingPlan, given_or_resolved
from k3infra.receipt import Receipt
from k3infra.serving import group
from k3infra.serving import manifests as m, prepull, rollout
from k3infra.weights.manifests import WeightsParts


class VllmServingArgs(TypedDict):
    receipt: Required[Receipt]      # the receipt the stack deploys: flags, env, pins
    config: Required[Union[StackConfig, StackInputs]]  # the validated stack config
    image: Required[pulumi.Input[str]]   # the engine image (repo@sha256:...)
    weights: Required[Union[WeightsParts, Callable[[StackConfig], WeightsParts]]]
    # (what the serving pod mounts; WeightsPrefetch.parts_for rebuilds it from a
    # resolved config)
    names: Required[m.ServingNames]      # the instance's object names
    instance: Required[str]
    enginePins: Required[dict[str, str]]   # the engine build's pins (EnginePlan.pins())
    workloadDependsOn: NotRequired[Sequence[pulumi.Resource]]
    # what the workload alone waits for (the weights Jobs, the Secrets, the node pool):
    # the Services, PDB and pre-pull do not wait for the weights
    plan: NotRequired[ServingPlan]   # the stack's (k3infra.plan); resolved here when absent


class VllmServing(pulumi.ComponentResource):
    """The vLLM StatefulSet with the receipt's flags, its Services and PDB.

    `workloadDependsOn` is recorded on the StatefulSet (or each LeaderWorkerSet) itself;
    the component's own `opts.depends_on` on every child."""

    statefulset: pulumi.CustomResource
    service_name: pulumi.Output[str]
    template_digest: Optional[pulumi.Output[str]] = None   # single-node only

    def __init__(self, name: str, args: VllmServingArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        receipt = required(args, "receipt", "VllmServing", Receipt)
        inputs = StackInputs.of(required(args, "config", "VllmServing",
                                         (StackConfig, StackInputs), "the validated stack config"))
        image = required(args, "image", "VllmServing", what="the engine image")
        weights = required(args, "weights", "VllmServing", what="the WeightsParts")
        names = required(args, "names", "VllmServing", m.ServingNames)
        instance = required(args, "instance", "VllmServing", str)
        engine_pins = required(args, "enginePins", "VllmServing", dict)
        depends_on = list(args.get("workloadDependsOn", ()))
        plain = inputs.plain
        parts = weights if callable(weights) else (lambda _c: weights)
        plan = given_or_resolved(args, receipt, plain, "VllmServing")
        super().__init__("k3infra:index:VllmServing", name, None, opts)
        # The image pull, then the startupProbe's allowance, plus scheduling; pods start
        # together on create (Parallel) but roll one node at a time on update.
        create_s, update_s = plan.budget.await_seconds(plain.replicas)
        create, update = f"{-(-create_s // 60)}m", f"{-(-update_s // 60)}m"
        timeouts = pulumi.CustomTimeouts(create=create, update=update)
        self.groups: list[pulumi.CustomResource] = []
        if plan.multi_node:
            # Per replica a ComputeDomain, then the LeaderWorkerSet whose pods claim it.
            for i in range(plain.replicas):
                domain = apply_built(
                    f"{name}-domain-{i}", inputs,
                    lambda c, i=i: group.compute_domain(receipt, c, names, instance, engine_pins, i),
                    child_options(self, opts))
                self.groups.append(apply_built(
                    f"{name}-group-{i}", inputs,
                    lambda c, i=i: group.leader_worker_set(plan, c, image, parts(c), names,
                                                           instance, engine_pins, i),
                    child_options(self, opts, *depends_on, domain, custom_timeouts=timeouts)))
            self.statefulset = self.groups[-1]
        else:
            def build(c: StackConfig) -> dict:
                return m.statefulset(plan, c, image, parts(c), names, instance, engine_pins)

            wired = wired_build(inputs, build)
            self.statefulset = apply_manifest(
                f"{name}-statefulset", wired,
                child_options(self, opts, *depends_on, custom_timeouts=timeouts), build(plain))
            # The pod template's identity: what the rollout gate judges (serving/rollout.py).
            self.template_digest = pulumi.Output.from_input(wired).apply(
                lambda s: rollout.template_digest(s["spec"]["template"]))
        self.rollout_timeouts = timeouts
        # What dependents (benchmark, accuracy) wait for: every replica's workload.
        self.workloads = self.groups or [self.statefulset]
        if plain.cold_start.prepull:
            # Not behind the weights Job: the pull runs while the weights download.
            apply_built(f"{name}-prepull", inputs,
                        lambda c: prepull.daemonset(c, image, names.base, names.namespace,
                                                    m.labels(instance), instance),
                        child_options(self, opts))
        for i, svc in enumerate(m.services(plain, names, instance)):
            apply_built(f"{name}-svc-{svc['metadata']['name']}", inputs,
                        lambda c, i=i: m.services(c, names, instance)[i], child_options(self, opts))
        apply_built(f"{name}-pdb", inputs, lambda c: m.disruption_budget(names, instance),
                    child_options(self, opts))
        self.service_name = pulumi.Output.from_input(names.service)
        self.register_outputs({"service_name": self.service_name})
