"""`Benchmark`: the optional benchmark Job (k3:benchmark.enabled), its runtime ConfigMap
and the results PVC. Thin: registers what k3infra.bench.manifests returns.

Ordering: the Job depends on the serving StatefulSet, and pulumi-kubernetes only
finishes a StatefulSet once it is ready (ready replicas = replicas, current revision =
update revision), so the Job is created against a serving endpoint that has loaded the
weights. `pulumi up` then waits for the Job to complete (its deadline + a margin); a
failed benchmark fails the update, with the raw files kept on the PVC.
"""
from __future__ import annotations

from typing import Callable, Optional, Required, Union

import pulumi
import pulumi_kubernetes as k8s

from k3infra import clientjob, naming
from k3infra.bench import manifests as b
from k3infra.clientjob_component import (ClientJob, ClientJobArgs, EndpointJobArgs,
                                        common_args, endpoint_args)
from k3infra.componentargs import required
from k3infra.config import StackConfig
from k3infra.kube import child_options
from k3infra.naming import ServingNames
from k3infra.serving import rollout
from k3infra.weights.manifests import WeightsParts


class BenchmarkArgs(EndpointJobArgs):
    image: Required[pulumi.Input[str]]   # the engine image (repo@sha256:...)
    weights: Required[Union[WeightsParts, Callable[[StackConfig], WeightsParts]]]


class Benchmark(ClientJob):
    """`vllm bench serve` over Workload A, every raw result kept on a PVC."""

    def __init__(self, name: str, args: BenchmarkArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        receipt, inputs, depends_on = common_args(args, "Benchmark")
        image = required(args, "image", "Benchmark", what="the engine image")
        weights = required(args, "weights", "Benchmark", what="the WeightsParts")
        base, endpoint = endpoint_args(args, "Benchmark")
        parts = weights if callable(weights) else (lambda _c: weights)
        super().__init__("k3infra:index:Benchmark", name, None, opts)
        names = b.BenchmarkNames(base)
        self._build(
            name, inputs, opts, names=names,
            runtime=lambda c: b.runtime_configmap(names, endpoint["namespace"], endpoint["labels"]),
            claim=lambda c: b.results_pvc(names, endpoint["namespace"], endpoint["labels"], c),
            job=lambda c: b.benchmark_job(receipt, c, names=names, image=image,
                                          weights=parts(c), **endpoint),
            timeout_seconds=b.job_timeout_seconds(inputs.plain), depends_on=depends_on)


class RolloutGateArgs(ClientJobArgs):
    image: Required[pulumi.Input[str]]   # the engine image (repo@sha256:...)
    weights: Required[Callable[[StackConfig], WeightsParts]]   # WeightsPrefetch.parts_for
    names: Required[ServingNames]   # the instance's object names
    instance: Required[str]
    statefulset: Required[pulumi.Resource]   # the serving StatefulSet the gate judges
    templateDigest: Required[pulumi.Output]  # the digest of its pod template
    rolloutTimeouts: Required[pulumi.CustomTimeouts]   # the promotion's (VllmServing's)
    apiKeySecretKey: Required[str]


class RolloutGate(ClientJob):
    """The rollout gate (k3infra/serving/rollout.py): the canary's benchmark Job, named by
    the digest of the pod template it judges, then the promotion of every other replica
    (none for a candidate receipt: its run is recorded for `k3infra bench receipt`). The
    Job waits for `statefulset` and `jobDependsOn`."""

    promotion: Optional[pulumi.CustomResource]

    def __init__(self, name: str, args: RolloutGateArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        receipt, inputs, depends_on = common_args(args, "RolloutGate")
        image = required(args, "image", "RolloutGate", what="the engine image")
        weights = required(args, "weights", "RolloutGate", what="WeightsPrefetch.parts_for")
        names = required(args, "names", "RolloutGate", ServingNames)
        instance = required(args, "instance", "RolloutGate", str)
        statefulset = required(args, "statefulset", "RolloutGate", pulumi.Resource)
        template_digest = required(args, "templateDigest", "RolloutGate", pulumi.Output)
        rollout_timeouts = required(args, "rolloutTimeouts", "RolloutGate", pulumi.CustomTimeouts)
        api_key_secret_key = required(args, "apiKeySecretKey", "RolloutGate", str)
        super().__init__("k3infra:index:RolloutGate", name, None, opts)
        job_names = clientjob.JobNames(names.base, rollout.GATE_KIND)
        labels = naming.labels(instance, naming.ROLLOUT_GATE_COMPONENT)
        judge = rollout.judge_spec(receipt, inputs.plain)
        self._build(
            name, inputs, opts, names=job_names,
            runtime=lambda c: b.runtime_configmap(job_names, names.namespace, labels),
            claim=lambda c: b.results_pvc(job_names, names.namespace, labels, c),
            job=lambda c: b.benchmark_job(receipt, c, names=job_names,
                                          namespace=names.namespace, labels=labels, image=image,
                                          base_url=rollout.canary_url(c, names),
                                          api_key_secret=names.api_key_secret,
                                          api_key_secret_key=api_key_secret_key,
                                          weights=weights(c),
                                          serving_selector=naming.selector_labels(instance),
                                          gate=judge),
            timeout_seconds=b.job_timeout_seconds(inputs.plain),
            depends_on=[statefulset, *depends_on],
            job_name=template_digest.apply(lambda d: rollout.gate_job_name(names.base, d)),
            complete=False)
        self.promotion = None
        if not receipt.is_candidate:
            replicas = inputs.plain.replicas
            patch = template_digest.apply(lambda d: rollout.promotion_patch(names, d, replicas))
            # Waits for every replica Ready on the new template (its own waitFor).
            self.promotion = k8s.apps.v1.StatefulSetPatch(
                f"{name}-promote", metadata=patch.apply(lambda p: p["metadata"]),
                spec=patch.apply(lambda p: p["spec"]),
                opts=child_options(self, opts, self.job, custom_timeouts=rollout_timeouts))
        self.register_outputs(self.job_outputs())
