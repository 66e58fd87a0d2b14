"""`WeightsPrefetch`: the weights storage, the runtime ConfigMap and the prefetch Job.

The serving StatefulSet depends on the Job, so `pulumi up` waits for a verified tree
before any serving pod exists; the pod's gate init container checks it again on every
start. The Job records the component's `opts.depends_on` (namespace, secrets, node pool)
itself, so replacing the pool re-runs the prefetch and `--target`/destroy see the edge.
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
    """Shared RWX volume + one Job, or node-local NVMe + one Job pod per serving node."""

    job: pulumi.CustomResource
    parts: w.WeightsParts

    def __init__(self, name: str, receipt: Receipt, cfg: Union[StackConfig, StackInputs],
                 base: str, namespace: str, labels: dict, image: Any,
                 hf_token_secret: Optional[str], lock_text: Optional[str],
                 opts: Optional[pulumi.ResourceOptions] = None):
        inputs = StackInputs.of(cfg)
        plain = inputs.plain
        super().__init__("k3infra:index:WeightsPrefetch", name, None, opts)
        has_lock = lock_text is not None
        deps = [apply_manifest(f"{name}-runtime",
                               w.runtime_configmap(base, namespace, labels, lock_text),
                               child_options(self, opts))]
        if plain.weights.mode == "shared":
            deps.append(apply_built(f"{name}-pvc", inputs,
                                    lambda c: w.shared_pvc(base, namespace, labels, c),
                                    child_options(self, opts)))
        wait = f"{w.prefetch_timeout_seconds(receipt, plain) // 60}m"
        self.job = apply_built(
            f"{name}-job", inputs,
            lambda c: w.prefetch_job(receipt, c, base, namespace, labels, image,
                                     hf_token_secret, has_lock),
            child_options(self, opts, *deps,
                          custom_timeouts=pulumi.CustomTimeouts(create=wait, update=wait)))

        def parts_for(c: StackConfig) -> w.WeightsParts:
            return w.serving_parts(receipt, c, base, image, hf_token_secret, has_lock)

        # What the serving pod mounts; `parts_for` rebuilds it from a resolved config.
        self.parts = parts_for(plain)
        self.parts_for = parts_for
        self.register_outputs({"model_dir": inputs.build(lambda c: parts_for(c).model_dir)})
