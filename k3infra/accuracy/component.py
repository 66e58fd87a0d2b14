"""`AccuracySmoke`: the optional accuracy smoke test Job (k3:accuracy.enabled), its
runtime ConfigMap and results PVC. Thin: registers what k3infra.accuracy.manifests
returns. Ordered like the Benchmark: the Job depends on the serving StatefulSet, which
pulumi-kubernetes finishes only once ready, so lm-eval starts against a loaded engine."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import pulumi

from k3infra.accuracy import manifests as a
from k3infra.clientjob_component import ClientJob
from k3infra.config import StackConfig
from k3infra.inputs import StackInputs
from k3infra.receipt import Receipt


class AccuracySmoke(ClientJob):
    """lm-eval's smoke test against the endpoint, every file kept on a PVC."""

    def __init__(self, name: str, receipt: Receipt, cfg: Union[StackConfig, StackInputs], *,
                 base: str, namespace: str, labels: dict, base_url: str, api_key_secret: str,
                 api_key_secret_key: str, serving_selector: dict,
                 depends_on: Sequence[pulumi.Resource] = (),
                 opts: Optional[pulumi.ResourceOptions] = None):
        inputs = StackInputs.of(cfg)
        super().__init__("k3infra:index:AccuracySmoke", name, None, opts)
        names = a.AccuracyNames(base)
        self._build(
            name, inputs, opts, names=names,
            runtime=lambda c: a.runtime_configmap(names, namespace, labels),
            claim=lambda c: a.results_pvc(names, namespace, labels, c),
            job=lambda c: a.accuracy_job(receipt, c, names=names, namespace=namespace,
                                         labels=labels, base_url=base_url,
                                         api_key_secret=api_key_secret,
                                         api_key_secret_key=api_key_secret_key,
                                         serving_selector=serving_selector),
            timeout_seconds=inputs.plain.accuracy.timeout_minutes * 60, depends_on=depends_on)
