"""`WeightsPrefetch`: the weights storage, the runtime ConfigMap and the prefetch Job.

The serving StatefulSet depends on the Job, so `pulumi up` waits for a verified tree
before any serving pod exists; the pod's gate init container checks it again on every
start.
"""
from __future__ import annotations

from typing import Any, Optional

import pulumi

from k3infra.config import StackConfig
from k3infra.kube import apply_manifest
from k3infra.receipt import Receipt
from k3infra.weights import manifests as w


class WeightsPrefetch(pulumi.ComponentResource):
    """Shared RWX volume + one Job, or node-local NVMe + one Job pod per serving node."""

    job: pulumi.CustomResource
    parts: w.WeightsParts

    def __init__(self, name: str, receipt: Receipt, cfg: StackConfig, base: str,
                 namespace: str, labels: dict, image: Any, hf_token_secret: Optional[str],
                 lock_text: Optional[str], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("k3infra:index:WeightsPrefetch", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        has_lock = lock_text is not None
        deps = [apply_manifest(f"{name}-runtime",
                               w.runtime_configmap(base, namespace, labels, lock_text), child)]
        if cfg.weights.mode == "shared":
            deps.append(apply_manifest(f"{name}-pvc", w.shared_pvc(base, namespace, labels, cfg),
                                       child))
        wait = f"{w.prefetch_timeout_seconds(receipt, cfg) // 60}m"
        self.job = apply_manifest(
            f"{name}-job",
            w.prefetch_job(receipt, cfg, base, namespace, labels, image, hf_token_secret, has_lock),
            pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                depends_on=deps,
                custom_timeouts=pulumi.CustomTimeouts(create=wait, update=wait))))
        self.parts = w.serving_parts(receipt, cfg, base, image, hf_token_secret, has_lock)
        self.register_outputs({"model_dir": self.parts.model_dir})
