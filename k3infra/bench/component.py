"""`Benchmark`: the optional benchmark Job (k3:benchmark.enabled), its runtime ConfigMap
and the results PVC. Thin: registers what k3infra.bench.manifests returns.

Ordering: the Job depends on the serving StatefulSet, and pulumi-kubernetes only
finishes a StatefulSet once it is ready (ready replicas = replicas, current revision =
update revision), so the Job is created against a serving endpoint that has loaded the
weights. `pulumi up` then waits for the Job to complete (its deadline + a margin); a
failed benchmark fails the update, with the raw files kept on the PVC.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import pulumi

from k3infra.bench import manifests as b
from k3infra.config import StackConfig
from k3infra.inputs import StackInputs
from k3infra.kube import apply_built, child_options
from k3infra.receipt import Receipt
from k3infra.weights.manifests import WeightsParts

# Scheduling and image start on top of the Job's own deadline.
WAIT_MARGIN_SECONDS = 600


class Benchmark(pulumi.ComponentResource):
    """`vllm bench serve` over Workload A, every raw result kept on a PVC."""

    job: pulumi.CustomResource
    results_claim: pulumi.Output[str]
    job_name: pulumi.Output[str]

    def __init__(self, name: str, receipt: Receipt, cfg: Union[StackConfig, StackInputs],
                 image: Any, weights: Union[WeightsParts, Callable[[StackConfig], WeightsParts]],
                 *, base: str, namespace: str, labels: dict,
                 base_url: str, api_key_secret: str, api_key_secret_key: str,
                 serving_selector: dict,
                 depends_on: Sequence[pulumi.Resource] = (),
                 opts: Optional[pulumi.ResourceOptions] = None):
        inputs = StackInputs.of(cfg)
        parts = weights if callable(weights) else (lambda _c: weights)
        super().__init__("k3infra:index:Benchmark", name, None, opts)
        names = b.BenchmarkNames(base)
        runtime = apply_built(f"{name}-runtime", inputs,
                              lambda c: b.runtime_configmap(names, namespace, labels),
                              child_options(self, opts))
        # The evidence outlives the stack: `pulumi destroy` leaves the claim in place.
        claim = apply_built(f"{name}-results", inputs,
                            lambda c: b.results_pvc(names, namespace, labels, c),
                            child_options(self, opts, retain_on_delete=True))
        wait = f"{(b.job_timeout_seconds(inputs.plain) + WAIT_MARGIN_SECONDS) // 60}m"
        self.job = apply_built(
            f"{name}-job", inputs,
            lambda c: b.benchmark_job(receipt, c, names=names, namespace=namespace,
                                      labels=labels, image=image, base_url=base_url,
                                      api_key_secret=api_key_secret,
                                      api_key_secret_key=api_key_secret_key, weights=parts(c),
                                      serving_selector=serving_selector),
            child_options(self, opts, *depends_on, runtime, claim,
                          # A fixed name cannot be created before the old Job is gone.
                          delete_before_replace=True,
                          custom_timeouts=pulumi.CustomTimeouts(create=wait, update=wait)))
        self.results_claim = pulumi.Output.from_input(names.pvc)
        self.job_name = pulumi.Output.from_input(names.job)
        self.register_outputs({"results_claim": self.results_claim, "job_name": self.job_name})
