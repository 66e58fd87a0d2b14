"""`AccuracySmoke`: the optional accuracy smoke test Job (k3:accuracy.enabled), its
runtime ConfigMap and results PVC. Thin: registers what k3infra.accuracy.manifests
returns. Ordered like the Benchmark: the Job depends on the serving StatefulSet, which
pulumi-kubernetes finishes only once ready, so lm-eval starts against a loaded engine."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import pulumi

from k3infra.accuracy import manifests as a
from k3infra.config import StackConfig
from k3infra.inputs import StackInputs
from k3infra.kube import apply_built, child_options
from k3infra.receipt import Receipt


class AccuracySmoke(pulumi.ComponentResource):
    """lm-eval's smoke test against the endpoint, every file kept on a PVC."""

    job: pulumi.CustomResource
    results_claim: pulumi.Output[str]
    job_name: pulumi.Output[str]

    def __init__(self, name: str, receipt: Receipt, cfg: Union[StackConfig, StackInputs], *,
                 base: str, namespace: str, labels: dict, base_url: str, api_key_secret: str,
                 api_key_secret_key: str, serving_selector: dict,
                 depends_on: Sequence[pulumi.Resource] = (),
                 opts: Optional[pulumi.ResourceOptions] = None):
        inputs = StackInputs.of(cfg)
        super().__init__("k3infra:index:AccuracySmoke", name, None, opts)
        names = a.AccuracyNames(base)
        runtime = apply_built(f"{name}-runtime", inputs,
                              lambda c: a.runtime_configmap(names, namespace, labels),
                              child_options(self, opts))
        claim = apply_built(f"{name}-results", inputs,
                            lambda c: a.results_pvc(names, namespace, labels, c),
                            child_options(self, opts, retain_on_delete=True))
        wait = f"{(inputs.plain.accuracy.timeout_minutes * 60 + a.WAIT_MARGIN_SECONDS) // 60}m"
        self.job = apply_built(
            f"{name}-job", inputs,
            lambda c: a.accuracy_job(receipt, c, names=names, namespace=namespace,
                                     labels=labels, base_url=base_url,
                                     api_key_secret=api_key_secret,
                                     api_key_secret_key=api_key_secret_key,
                                     serving_selector=serving_selector),
            child_options(self, opts, *depends_on, runtime, claim, delete_before_replace=True,
                          custom_timeouts=pulumi.CustomTimeouts(create=wait, update=wait)))
        self.results_claim = pulumi.Output.from_input(names.pvc)
        self.job_name = pulumi.Output.from_input(names.job)
        self.register_outputs({"results_claim": self.results_claim, "job_name": self.job_name})
