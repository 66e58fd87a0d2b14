"""`AccuracySmoke`: the optional accuracy smoke test Job (k3:accuracy.enabled), its
runtime ConfigMap and results PVC. Thin: registers what k3infra.accuracy.manifests
returns. Ordered like the Benchmark: the Job depends on the serving StatefulSet, which
pulumi-kubernetes finishes only once ready, so lm-eval starts against a loaded engine."""
from __future__ import annotations

from typing import Optional

import pulumi

from k3infra.accuracy import manifests as a
from k3infra.clientjob_component import ClientJob, EndpointJobArgs, common_args, endpoint_args


class AccuracySmokeArgs(EndpointJobArgs):
    """The endpoint lm-eval talks to (EndpointJobArgs) and the client Job's keys."""


class AccuracySmoke(ClientJob):
    """lm-eval's smoke test against the endpoint, every file kept on a PVC."""

    def __init__(self, name: str, args: AccuracySmokeArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        receipt, inputs, depends_on = common_args(args, "AccuracySmoke")
        base, endpoint = endpoint_args(args, "AccuracySmoke")
        super().__init__("k3infra:index:AccuracySmoke", name, None, opts)
        names = a.AccuracyNames(base)
        self._build(
            name, inputs, opts, names=names,
            runtime=lambda c: a.runtime_configmap(names, endpoint["namespace"], endpoint["labels"]),
            claim=lambda c: a.results_pvc(names, endpoint["namespace"], endpoint["labels"], c),
            job=lambda c: a.accuracy_job(receipt, c, names=names, **endpoint),
            timeout_seconds=inputs.plain.accuracy.timeout_minutes * 60, depends_on=depends_on)
