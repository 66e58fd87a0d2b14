"""`K3ServingStack`: namespace + weights + serving (and the node pool, engine build,
benchmark and operations parts) for one instance, composed from the `k3:*` keys.

    from k3infra import K3ServingStack, K3ServingStackArgs
    from k3infra.receipt import stack_receipt
    stack = K3ServingStack(
        "kimi-k3",
        K3ServingStackArgs(weightsRevision="<40 hex>", apiKey=password.result,
                           engineImage=image.ref,
                           nodePool={"provider": "aws", "aws": {"clusterName": cluster.name, ...}},
                           receipt=stack_receipt("kimi-k3-8xb300-2026-07-29").receipt),
        pulumi.ResourceOptions(provider=k8s_provider))

Args are the stack config keys (without the `k3:` prefix): `K3ServingStackArgs` is the
TypedDict derived from the config models (k3infra/plugin/shapes.py), with `receipt`
required (a `Receipt`, or a receipt the project names, as `k3:receipt`) and
`offlineRender` (`k3infra render` only). The keys listed in
`k3infra.inputs.WIREABLE` (weightsRevision, engineImage, the cloud pool's ids) and the
secrets (apiKey, hfToken) accept `pulumi.Input`s: plain values are validated before any
resource is registered, Output values inside `apply` with the same messages. A config
validated already comes as `StackConfigArgs` (`{"config": cfg, "receipt": receipt}`, the
stack program's). The `provider`/`providers` option reaches every child (Kubernetes
objects and cloud resources). Kubernetes names derive from the instance name
(k3infra.naming).
"""
from __future__ import annotations

from typing import Any, Optional, Union

import pulumi

from k3infra import gates, naming, topology
from k3infra.accuracy.component import AccuracySmoke
from k3infra.bench.component import Benchmark, RolloutGate
from k3infra.componentargs import StackConfigArgs, top_level_args
from k3infra.config import ConfigError, StackConfig
from k3infra.engine import EngineBuild, engine_gates
from k3infra.engine.component import engine_recipe
from k3infra.gateway.auth import key_policy_note
from k3infra.gateway.component import InferenceGateway
from k3infra.gateway.picker import picker_gates
from k3infra.inputs import StackInputs, stack_inputs
from k3infra.kube import apply_manifest, child_options, mark_every_object
from k3infra.nodepool.component import B300NodePool
from k3infra.operations.autoscaling import scaling_warnings
from k3infra.operations.component import ServingOperations
from k3infra.plan import resolve_plan
# The args type is derived from the config models (every k3:* key, Inputs where a value
# may be wired), never written out again here.
from k3infra.plugin.shapes import K3ServingStackArgs
from k3infra.preflight import run_preflight
from k3infra.receipt import stack_receipt
from k3infra.serving import manifests as m, rollout
from k3infra.serving.component import VllmServing
from k3infra.weights.component import WeightsPrefetch
from k3infra.weights.lockcheck import check_lock_revision, load_stack_lock


class K3ServingStack(pulumi.ComponentResource):
    """Kimi K3 on 8x B300 with vLLM, deployed exactly as the receipt measured it."""

    endpoint: pulumi.Output[str]
    served_model_name: pulumi.Output[str]
    receipt_id: pulumi.Output[str]
    receipt_sha256: pulumi.Output[str]
    receipt_status: pulumi.Output[str]
    engine_commit: pulumi.Output[Optional[str]]
    engine_version: pulumi.Output[Optional[str]]
    wheel_sha256: pulumi.Output[Optional[str]]
    image_digest: pulumi.Output[str]
    engine_profile: pulumi.Output[str]
    weights_revision: pulumi.Output[str]
    tree_digest: pulumi.Output[str]
    image: pulumi.Output[str]
    profile: pulumi.Output[str]
    topology: pulumi.Output[str]
    license_name: pulumi.Output[str]

    def __init__(self, name: str, args: Union[K3ServingStackArgs, StackConfigArgs],
                 opts: Optional[pulumi.ResourceOptions] = None):
        """`args["receipt"]`: what "measured" means for this instance (required, explicit).
        `args["offlineRender"]`: set by `k3infra render` only; gates then warn instead of
        refusing and builds show placeholder digests. `pulumi up` never sets it."""
        # Everything that can refuse does so before the first registration.
        given = top_level_args(args, "K3ServingStack")
        receipt, offline_render = given.receipt, given.offline_render
        instance = naming.check_instance_name(name)
        lock_holder: dict[str, Any] = {}

        def check_resolved(c: StackConfig, wired: frozenset) -> None:
            # Wired values are checked like plain ones: the lock's revision, the
            # placeholder gates of the wired keys.
            check_lock_revision(lock_holder.get("lock"), c)
            gates.enforce([g for g in gates.deployment_gates(receipt, c)
                           if g.key.split(":", 1)[1] in wired], offline_render)

        inputs = (StackInputs.of(given.config) if given.config is not None
                  else stack_inputs(given.keys, receipt, check_resolved))
        if inputs.plain.namespace is None:
            inputs = inputs.with_plain(lambda c: c.model_copy(update={"namespace": instance}))
        cfg = inputs.plain
        if cfg.receipt is not None:
            named = stack_receipt(cfg.receipt).receipt
            if named.sha256() != receipt.sha256():
                raise ConfigError("k3:receipt", cfg.receipt,
                                  f"names receipt {named.id}, but the component was given "
                                  f"receipt {receipt.id}: pass the receipt the args name")
        owns_namespace = naming.creates_namespace(cfg.namespace, cfg.create_namespace, instance)
        self.config = cfg
        self.inputs = inputs
        # Every figure the children read, once (k3infra/plan.py); its refusals (HBM fit,
        # k3:engine / k3:profile) come before the lock's and the gates'.
        self.serving_plan = plan = resolve_plan(receipt, cfg, instance)
        self.fit = plan.fit
        m.check_shutdown(plan, cfg)
        lock = load_stack_lock(receipt, cfg, check_revision=not inputs.is_wired("weightsRevision"))
        lock_holder["lock"] = lock
        engine_recipe(plan.engine, cfg)       # k3:engine.recipeDir read and checked, likewise
        if (not owns_namespace and plan.engine.mode == "in-cluster"
                and cfg.engine.build_namespace is None):
            # The build namespace is always created by the instance: the default derived
            # from a namespace others share would be created by each of them.
            raise ConfigError("k3:engine.buildNamespace", None,
                              f"must be set when k3:createNamespace is false: the default "
                              f"{cfg.namespace}-build would be created by every instance "
                              f"in {cfg.namespace!r}; name one per instance, e.g. "
                              f"{instance}-build")
        gates.enforce([g for g in gates.deployment_gates(receipt, cfg)
                       if g.key.split(":", 1)[1] not in inputs.wired] + engine_gates(receipt, cfg)
                      + picker_gates(cfg) + [g for g in [key_policy_note(cfg)] if g]
                      + scaling_warnings(plan, cfg),
                      offline_render)
        self.preflight = run_preflight(cfg, receipt, lock.total_bytes if lock else None, plan.fit)

        if plan.multi_node:
            # Every Kubernetes object of the instance says it is not the measured configuration.
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(transformations=[
                mark_every_object({"k3infra.dev/measured-configuration": "false",
                                   "k3infra.dev/warning": topology.not_measured_text(receipt)},
                                  {"k3infra.dev/topology": topology.MULTI_NODE})]))
        super().__init__("k3infra:index:K3ServingStack", name, None, opts)
        # Children carry this component's depends_on (e.g. ClusterAddons) themselves.
        self.pool = B300NodePool(f"{name}-pool", {"config": inputs, "receipt": receipt,
                                                  "instance": instance},
                                 child_options(self, opts))
        names = plan.names

        # Created only when this instance owns it (naming.creates_namespace); otherwise the
        # namespace is the user's: no edge, and destroying the instance leaves it.
        self.namespace = (apply_manifest(f"{name}-namespace",
                                         m.namespace(cfg.namespace, instance,
                                                     m.pod_security_level(cfg)),
                                         child_options(self, opts))
                          if owns_namespace else None)
        ns = [self.namespace] if self.namespace is not None else []
        in_ns = child_options(self, opts, *ns)
        # NetworkPolicies first (no pod of the stack runs unpoliced), then the metrics
        # objects and dashboard that k3:monitoring asks for.
        self.operations = ServingOperations(f"{name}-operations", {
            "receipt": receipt, "config": inputs, "names": names, "instance": instance,
            "plan": plan}, in_ns)

        # The engine image by digest: k3:engineImage, or the build's pushed digest.
        self.engine = EngineBuild(f"{name}-engine", {
            "config": inputs, "receipt": receipt, "base": instance,
            "labels": naming.labels(instance, "engine-build"), "gatesEnforced": True,
            "offlineRender": offline_render, "plan": plan}, in_ns)
        image: Any = self.engine.image
        secrets = [apply_manifest(f"{name}-api-key", m.api_key_secret(
            names, instance, pulumi.Output.secret(cfg.api_key.reveal())), in_ns),
                   # Not a secret: listed here so the serving pods wait for it too.
                   apply_manifest(f"{name}-proxy-config", m.proxy_configmap(cfg, names, instance),
                                  in_ns)]
        hf_secret_name = None
        if cfg.hf_token is not None:
            hf_secret_name = names.hf_token_secret
            secrets.append(apply_manifest(f"{name}-hf-token", m.hf_token_secret(
                names, instance, pulumi.Output.secret(cfg.hf_token.reveal())), in_ns))

        self.weights = WeightsPrefetch(f"{name}-weights", {
            "receipt": receipt, "config": inputs, "base": instance, "namespace": cfg.namespace,
            "labels": naming.labels(instance, "weights-prefetch"), "image": image,
            "hfTokenSecret": hf_secret_name, "lockText": lock.text if lock else None},
            child_options(self, opts, *ns, *secrets, self.pool))

        self.serving = VllmServing(f"{name}-serving", {
            "receipt": receipt, "config": inputs, "image": image,
            "weights": self.weights.parts_for, "names": names, "instance": instance,
            "enginePins": self.engine.plan.pins(), "plan": plan,
            "workloadDependsOn": [*self.weights.jobs, *secrets, self.pool]}, in_ns)

        # k3:rollout.gate: a change of the serving pods reaches the canary, is benchmarked
        # there against the receipt, and reaches the others only if it passes.
        self.rollout_gate = None
        serving_ready: list[pulumi.Resource] = list(self.serving.workloads)
        if rollout.gated(cfg):
            self.rollout_gate = RolloutGate(f"{name}-rollout", {
                "receipt": receipt, "config": inputs, "image": image,
                "weights": self.weights.parts_for, "names": names, "instance": instance,
                "statefulset": self.serving.statefulset,
                "templateDigest": self.serving.template_digest,
                "rolloutTimeouts": self.serving.rollout_timeouts,
                "apiKeySecretKey": m.API_KEY_SECRET_KEY, "jobDependsOn": secrets}, in_ns)
            # Dependents judge the promoted template (or, a candidate, the measured canary).
            serving_ready.append(self.rollout_gate.promotion or self.rollout_gate.job)

        # k3:gateway.enabled: the inference gateway in front of the serving pods.
        self.gateway = None
        if cfg.gateway.enabled:
            self.gateway = InferenceGateway(f"{name}-gateway", {
                "config": inputs, "instance": instance, "namespace": cfg.namespace,
                "apiKey": pulumi.Output.secret(cfg.api_key.reveal())}, in_ns)

        # k3:benchmark.enabled: re-measure the receipt once serving is ready.
        self.benchmark = None
        if cfg.benchmark.enabled:
            self.benchmark = Benchmark(f"{name}-benchmark", {
                "receipt": receipt, "config": inputs, "image": image,
                "weights": self.weights.parts_for, "base": instance, "namespace": cfg.namespace,
                "labels": naming.labels(instance, "benchmark"),
                "baseUrl": m.benchmark_url(cfg, names), "apiKeySecret": names.api_key_secret,
                "apiKeySecretKey": m.API_KEY_SECRET_KEY,
                "servingSelector": naming.selector_labels(instance),
                "jobDependsOn": [*serving_ready, *secrets]}, in_ns)

        # k3:accuracy.enabled: the lm-eval smoke test, once serving is ready.
        self.accuracy = None
        if cfg.accuracy.enabled:
            self.accuracy = AccuracySmoke(f"{name}-accuracy", {
                "receipt": receipt, "config": inputs, "base": instance, "namespace": cfg.namespace,
                "labels": naming.labels(instance, "accuracy-smoke"),
                "baseUrl": m.endpoint_url(cfg, names), "apiKeySecret": names.api_key_secret,
                "apiKeySecretKey": m.API_KEY_SECRET_KEY,
                "servingSelector": naming.selector_labels(instance),
                "jobDependsOn": [*serving_ready, *secrets]}, in_ns)

        self.endpoint = pulumi.Output.from_input(m.endpoint_url(cfg, names))
        self.served_model_name = pulumi.Output.from_input(cfg.served_model_name)
        self.receipt_id = pulumi.Output.from_input(receipt.id)
        # Which receipt, by content: what `verify` and the policy pack hold the stack to.
        self.receipt_sha256 = pulumi.Output.from_input(receipt.sha256())
        self.receipt_status = pulumi.Output.from_input(receipt.status)
        self.engine_commit = self.engine.engine_commit
        self.engine_version = self.engine.engine_version
        self.wheel_sha256 = self.engine.wheel_sha256
        self.image_digest = self.engine.image_digest
        self.engine_profile = self.engine.profile_label
        self.weights_revision = pulumi.Output.from_input(inputs.build(lambda c: c.weights_revision))
        self.tree_digest = pulumi.Output.from_input(receipt.model.tree_digest)
        self.image = pulumi.Output.from_input(image)
        self.profile = pulumi.Output.from_input(cfg.profile)
        self.topology = pulumi.Output.from_input(
            topology.not_measured_text(receipt) if plan.multi_node
            else f"{topology.SINGLE_NODE}: {receipt.hardware.node} (the receipt's)")
        self.license_name = pulumi.Output.from_input(receipt.license.name)
        self.register_outputs(self.outputs())

    def outputs(self) -> dict[str, pulumi.Output]:
        return {"endpoint": self.endpoint, "servedModelName": self.served_model_name,
                "receiptId": self.receipt_id, "receiptSha256": self.receipt_sha256,
                "receiptStatus": self.receipt_status, "engineCommit": self.engine_commit,
                "engineVersion": self.engine_version, "wheelSha256": self.wheel_sha256,
                "imageDigest": self.image_digest, "engineProfile": self.engine_profile,
                "weightsRevision": self.weights_revision, "treeDigest": self.tree_digest,
                "image": self.image, "profile": self.profile, "topology": self.topology,
                "licenseName": self.license_name}
