"""`WeightsPrefetch`: the weights storage, the runtime ConfigMap, the prefetch Job(s) and
the periodic audit.

The serving StatefulSet depends on the Jobs, so `pulumi up` waits for a verified tree
before any serving pod exists; the gate in the serving container checks it again, in
full, before every engine start. The Jobs record the component's `opts.depends_on`
(namespace, secrets, node pool) themselves, so replacing the pool re-runs the prefetch
and `--target`/destroy see the edge.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import pulumi

from k3infra.config import StackConfig
from k3infra.inputs import StackInputs
from k3infra.kube import apply_built, apply_manifest, child_options
from k3infra.receipt import Receipt
from k3infra.weights import manifests as w


class WeightsPrefetch(pulumi.ComponentResource):
    """Shared RWX volume + one Job, or one local PV claim + one Job per serving node."""

    job: pulumi.CustomResource
    jobs: list
    parts: w.WeightsParts

    def __init__(self, name: str, receipt: Receipt, cfg: Union[StackConfig, StackInputs],
                 base: str, namespace: str, labels: dict, image: Any,
                 hf_token_secret: Optional[str], lock_text: Optional[str],
                 opts: Optional[pulumi.ResourceOptions] = None):
        inputs = StackInputs.of(cfg)
        plain = inputs.plain
        super().__init__("k3infra:index:WeightsPrefetch", name, None, opts)
        deps = [apply_manifest(f"{name}-runtime",
                               w.runtime_configmap(base, namespace, labels, lock_text),
                               child_options(self, opts))]
        per_node = plain.weights.mode == "node-local"
        count = plain.replicas if per_node else 1
        if not per_node:
            deps.append(apply_built(f"{name}-pvc", inputs,
                                    lambda c: w.shared_pvc(base, namespace, labels, c),
                                    child_options(self, opts)))
        else:
            for i in range(count):
                deps.append(apply_built(
                    f"{name}-pvc-{i}", inputs,
                    lambda c, i=i: w.node_local_pvcs(base, namespace, labels, c)[i],
                    child_options(self, opts)))
        wait = f"{w.prefetch_timeout_seconds(receipt, plain) // 60}m"
        self.jobs = [apply_built(
            f"{name}-job-{i}" if per_node else f"{name}-job", inputs,
            lambda c, i=i: w.prefetch_jobs(receipt, c, base, namespace, labels, image,
                                           hf_token_secret, lock_text)[i],
            child_options(self, opts, *deps,
                          custom_timeouts=pulumi.CustomTimeouts(create=wait, update=wait)))
            for i in range(count)]
        self.job = self.jobs[0]
        if plain.weights.audit_schedule is not None:
            for i in range(count):
                apply_built(f"{name}-audit-{i}" if per_node else f"{name}-audit", inputs,
                            lambda c, i=i: w.audit_cronjobs(receipt, c, base, namespace, labels,
                                                            image, lock_text)[i],
                            child_options(self, opts, *self.jobs))

        def parts_for(c: StackConfig) -> w.WeightsParts:
            return w.serving_parts(receipt, c, base, image, lock_text)

        # What the serving pod mounts; `parts_for` rebuilds it from a resolved config.
        self.parts = parts_for(plain)
        self.parts_for = parts_for
        self.register_outputs({"model_dir": inputs.build(lambda c: parts_for(c).model_dir)})
