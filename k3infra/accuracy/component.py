"""`AccuracySmoke`: the optional accuracy smoke test Job (k3:accuracy.enabled), its
runtime ConfigMap and results PVC. Thin: registers what k3infra.accuracy.manifests
returns. Ordered like the Benchmark: the Job depends on the serving StatefulSet, which
pulumi-kubernetes finishes only once ready, so lm-eval starts against a loaded engine."""
from __future__ import annotations

from typing import Optional, Required

import pulumi

from k3infra.accuracy import manifests as a
from k3infra.clientjob_component import ClientJob, ClientJobArgs, common_args
from k3infra.componentargs import required


class AccuracySmokeArgs(ClientJobArgs):
    base: Required[str]             # object name prefix (the instance)
    namespace: Required[str]
    labels: Required[dict]
    baseUrl: Required[str]          # the endpoint lm-eval talks to
    apiKeySecret: Required[str]     # the Secret with the API key, and its key
    apiKeySecretKey: Required[str]
    servingSelector: Required[dict]   # the serving pods' labels


class AccuracySmoke(ClientJob):
    """lm-eval's smoke test against the endpoint, every file kept on a PVC."""

    def __init__(self, name: str, args: AccuracySmokeArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        receipt, inputs, depends_on = common_args(args, "AccuracySmoke")
        base = required(args, "base", "AccuracySmoke", str)
        namespace = required(args, "namespace", "AccuracySmoke", str)
        labels = required(args, "labels", "AccuracySmoke", dict)
        base_url = required(args, "baseUrl", "AccuracySmoke", str)
        api_key_secret = required(args, "apiKeySecret", "AccuracySmoke", str)
        api_key_secret_key = required(args, "apiKeySecretKey", "AccuracySmoke", str)
        serving_selector = required(args, "servingSelector", "AccuracySmoke", dict)
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
