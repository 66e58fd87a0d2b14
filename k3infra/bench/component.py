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
from k3infra.clientjob_component import ClientJob
from k3infra.config import StackConfig
from k3infra.inputs import StackInputs
from k3infra.receipt import Receipt
from k3infra.weights.manifests import WeightsParts

class Benchmark(ClientJob):
    """`vllm bench serve` over Workload A, every raw result kept on a PVC."""

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
        self._build(
            name, inputs, opts, names=names,
            runtime=lambda c: b.runtime_configmap(names, namespace, labels),
            claim=lambda c: b.results_pvc(names, namespace, labels, c),
            job=lambda c: b.benchmark_job(receipt, c, names=names, namespace=namespace,
                                          labels=labels, image=image, base_url=base_url,
                                          api_key_secret=api_key_secret,
                                          api_key_secret_key=api_key_secret_key,
                                          weights=parts(c), serving_selector=serving_selector),
            timeout_seconds=b.job_timeout_seconds(inputs.plain), depends_on=depends_on)
