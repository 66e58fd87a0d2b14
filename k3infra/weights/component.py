"""`WeightsPrefetch`: the weights storage, the runtime ConfigMap, the prefetch Job(s) and
the periodic audit.

The serving StatefulSet depends on the Jobs, so `pulumi up` waits for a verified tree
before any serving pod exists; the gate in the serving container checks it again, in
full, before every engine start. The Jobs record the component's `opts.depends_on`
(namespace, secrets, node pool) themselves, so replacing the pool re-runs the prefetch
and `--target`/destroy see the edge.

Node-local copies after the first fill from in-cluster sources (k3infra/weights/fanout.py):
copy 0's Job (the Hub), then copy 0's source (Deployment, whose start re-verifies the
copy, then Service), then the Jobs of the copies that fill from it, each depending on the
Deployment and Service it reads from, with timeouts from the tree's size and the stated
link rates.
"""
from __future__ import annotations

from typing import NotRequired, Optional, Required, TypedDict, Union

import pulumi

from k3infra.componentargs import required
from k3infra.config import StackConfig
from k3infra.inputs import StackInputs
from k3infra.kube import apply_built, apply_manifest, child_options
from k3infra.receipt import Receipt
from k3infra.weights import fanout
from k3infra.weights import manifests as w
from k3infra.weights import source_server as s


class WeightsPrefetchArgs(TypedDict):
    receipt: Required[Receipt]      # the receipt the stack deploys (repo, revision, digest)
    config: Required[Union[StackConfig, StackInputs]]  # the validated stack config
    base: Required[str]             # object name prefix (the instance)
    namespace: Required[str]
    labels: Required[dict]          # labels on every object
    image: Required[pulumi.Input[str]]   # the engine image (repo@sha256:...) the Jobs run
    hfTokenSecret: NotRequired[Optional[str]]   # the Secret holding k3:hfToken, if any
    lockText: NotRequired[Optional[str]]        # the stack's weights lock file, if any


class WeightsPrefetch(pulumi.ComponentResource):
    """Shared RWX volume + one Job, or one local PV claim + one Job per serving node (and
    an in-cluster source per copy that others fill from)."""

    job: pulumi.CustomResource
    jobs: list
    sources: dict          # copy index -> [Deployment, Service] of its in-cluster source
    parts: w.WeightsParts

    def __init__(self, name: str, args: WeightsPrefetchArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        receipt = required(args, "receipt", "WeightsPrefetch", Receipt)
        inputs = StackInputs.of(required(args, "config", "WeightsPrefetch",
                                         (StackConfig, StackInputs), "the validated stack config"))
        base = required(args, "base", "WeightsPrefetch", str)
        namespace = required(args, "namespace", "WeightsPrefetch", str)
        labels = required(args, "labels", "WeightsPrefetch", dict)
        image = required(args, "image", "WeightsPrefetch", what="the engine image")
        hf_token_secret = args.get("hfTokenSecret")
        lock_text = args.get("lockText")
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
        # The Hub once per cluster (fanout.py): copies filled from the Hub first, each
        # verified copy then serves (its source: ConfigMap, Deployment, Service), and a
        # copy that fills from a source waits for that source's real objects.
        serving = set(fanout.serving_copies(plain))
        lay = w.layout(receipt, plain)
        source_conf = None
        if serving:
            source_conf = apply_manifest(f"{name}-source-conf", s.conf_configmap(
                base, namespace, labels, lay), child_options(self, opts))
        self.jobs, self.sources = [], {}
        for i in range(count):
            wait = f"{fanout.job_timeout_seconds(receipt, plain, i) // 60}m"
            after = [x for o in fanout.origins(plain, i) if o != fanout.HUB
                     for x in self.sources[o]]
            self.jobs.append(apply_built(
                f"{name}-job-{i}" if per_node else f"{name}-job", inputs,
                lambda c, i=i: w.prefetch_jobs(receipt, c, base, namespace, labels, image,
                                               hf_token_secret, lock_text)[i],
                child_options(self, opts, *deps, *after,
                              custom_timeouts=pulumi.CustomTimeouts(create=wait, update=wait))))
            if i in serving:
                start = f"{fanout.source_start_seconds(receipt, plain) // 60}m"
                deployment = apply_built(
                    f"{name}-source-{i}", inputs,
                    lambda c, i=i: s.source_deployment(receipt, c, base, namespace, labels,
                                                       image, lock_text, i),
                    child_options(self, opts, *deps, source_conf, self.jobs[i],
                                  custom_timeouts=pulumi.CustomTimeouts(create=start,
                                                                        update=start)))
                service = apply_manifest(f"{name}-source-svc-{i}",
                                         s.source_service(base, namespace, labels, i),
                                         # pulumi-kubernetes waits for a Service's
                                         # endpoints: only once the pod is ready.
                                         child_options(self, opts, deployment))
                self.sources[i] = [deployment, service]
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
