"""`K3ServingStack`: namespace + weights + serving (and the node pool, engine build,
benchmark and operations parts), composed from the `k3:*` config keys.

    from k3infra import K3ServingStack, K3ServingStackArgs
    stack = K3ServingStack("k3", K3ServingStackArgs(weightsRevision="<40 hex>",
                                                    apiKey=pulumi.Output.secret(key), ...))

Args are the same keys as the stack config (without the `k3:` prefix), validated before
any resource is registered.
"""
from __future__ import annotations

from typing import Any, Optional, TypedDict

import pulumi

from k3infra import gates
from k3infra.config import StackConfig, parse_stack_config
from k3infra.engine import EngineBuild, engine_gates, resolve_engine
from k3infra.hbm import hbm_fit
from k3infra.kube import apply_manifest
from k3infra.nodepool.component import B300NodePool
from k3infra.operations.component import ServingOperations
from k3infra.preflight import run_preflight
from k3infra.receipt import Receipt, load_receipt
from k3infra.serving import manifests as m
from k3infra.serving.component import VllmServing
from k3infra.weights.component import WeightsPrefetch
from k3infra.weights.lockcheck import load_stack_lock


class K3ServingStackArgs(TypedDict, total=False):
    """The `k3:*` keys (see Pulumi.yaml and docs/configuration.md for each one)."""

    weightsRevision: str          # 40-hex Hub commit of moonshotai/Kimi-K3 (required)
    apiKey: Any                   # secret: the vLLM API key (required)
    hfToken: Any                  # secret: HF token, when the repo is gated
    gpuProduct: str               # GPU feature discovery product label
    gpuMemoryGib: float           # per-GPU memory, only for products not in the receipt
    engineImage: str              # repo@sha256:<64 hex> (prebuilt / upstream)
    replicas: int                 # serving replicas = 8-GPU nodes
    profile: str                  # measured | upstream | custom
    acceptModelLicense: bool      # Kimi K3 License acknowledgement
    namespace: str
    servedModelName: str
    surface: dict                 # allow-listed serving-surface args / env
    custom: dict                  # engine-path changes (profile custom only)
    serving: dict
    weights: dict
    engine: dict
    nodePool: dict
    benchmark: dict
    monitoring: dict
    network: dict


BASE = m.APP   # Kubernetes object names inside the namespace


class K3ServingStack(pulumi.ComponentResource):
    """Kimi K3 on 8x B300 with vLLM, deployed exactly as the receipt measured it."""

    endpoint: pulumi.Output[str]
    served_model_name: pulumi.Output[str]
    receipt_id: pulumi.Output[str]
    engine_commit: pulumi.Output[Optional[str]]
    engine_version: pulumi.Output[Optional[str]]
    wheel_sha256: pulumi.Output[Optional[str]]
    image_digest: pulumi.Output[str]
    engine_profile: pulumi.Output[str]
    weights_revision: pulumi.Output[str]
    tree_digest: pulumi.Output[str]
    image: pulumi.Output[str]
    profile: pulumi.Output[str]
    license_name: pulumi.Output[str]

    def __init__(self, name: str, args: K3ServingStackArgs,
                 opts: Optional[pulumi.ResourceOptions] = None,
                 receipt: Optional[Receipt] = None):
        # Everything that can refuse does so before the first registration.
        receipt = receipt or load_receipt()
        cfg = args if isinstance(args, StackConfig) else parse_stack_config(dict(args))
        self.config = cfg
        self.fit = hbm_fit(receipt, cfg.gpu_product, cfg.gpu_memory_gib)
        m.check_shutdown(receipt, cfg)
        lock = load_stack_lock(receipt, cfg)
        resolve_engine(receipt, cfg)      # k3:engine / k3:profile refusals, before anything
        gates.enforce(gates.deployment_gates(receipt, cfg) + engine_gates(cfg))
        self.preflight = run_preflight(cfg, receipt, lock.total_bytes if lock else None)

        super().__init__("k3infra:index:K3ServingStack", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # Nodes + GPU add-ons first; weights and serving wait for them (k3:nodePool).
        self.pool = B300NodePool(f"{name}-pool", cfg, receipt, child)
        names = m.ServingNames(BASE, cfg.namespace)
        instance = name

        ns = apply_manifest(f"{name}-namespace",
                            m.namespace(cfg.namespace, instance, m.pod_security_level(cfg)), child)
        in_ns = pulumi.ResourceOptions(parent=self, depends_on=[ns])
        # NetworkPolicies first (no pod of the stack runs unpoliced), then the metrics
        # objects and dashboard that k3:monitoring asks for.
        self.operations = ServingOperations(f"{name}-operations", receipt, cfg, names, instance, in_ns)

        # The engine image by digest: k3:engineImage, or the build's pushed digest.
        self.engine = EngineBuild(f"{name}-engine", {
            "config": cfg, "receipt": receipt, "base": BASE,
            "labels": m.labels(instance, "engine-build"), "gatesEnforced": True},
            pulumi.ResourceOptions(parent=self, depends_on=[ns]))
        image: Any = self.engine.image
        secrets = [apply_manifest(f"{name}-api-key", m.api_key_secret(
            cfg, names, instance, pulumi.Output.secret(cfg.api_key.reveal())), in_ns)]
        hf_secret_name = None
        if cfg.hf_token is not None:
            hf_secret_name = names.hf_token_secret
            secrets.append(apply_manifest(f"{name}-hf-token", m.hf_token_secret(
                names, instance, pulumi.Output.secret(cfg.hf_token.reveal())), in_ns))

        self.weights = WeightsPrefetch(
            f"{name}-weights", receipt, cfg, BASE, cfg.namespace,
            m.labels(instance, "weights-prefetch"), image, hf_secret_name,
            lock.text if lock else None,
            pulumi.ResourceOptions(parent=self, depends_on=[ns, *secrets, self.pool]))

        self.serving = VllmServing(
            f"{name}-serving", receipt, cfg, image, self.weights.parts, names, instance,
            depends_on=[self.weights.job, *secrets, self.pool], opts=in_ns)

        # k3:benchmark.enabled: re-measure the receipt once serving is ready.
        self.benchmark = None
        if cfg.benchmark.enabled:
            from k3infra.bench.component import Benchmark

            self.benchmark = Benchmark(
                f"{name}-benchmark", receipt, cfg, image, self.weights.parts, base=BASE,
                namespace=cfg.namespace, labels=m.labels(instance, "benchmark"),
                base_url=m.endpoint_url(cfg, names), api_key_secret=names.api_key_secret,
                api_key_secret_key=m.API_KEY_SECRET_KEY,
                serving_selector=m.selector_labels(instance),
                depends_on=[self.serving.statefulset, *secrets], opts=in_ns)

        self.endpoint = pulumi.Output.from_input(m.endpoint_url(cfg, names))
        self.served_model_name = pulumi.Output.from_input(cfg.served_model_name)
        self.receipt_id = pulumi.Output.from_input(receipt.id)
        self.engine_commit = self.engine.engine_commit
        self.engine_version = self.engine.engine_version
        self.wheel_sha256 = self.engine.wheel_sha256
        self.image_digest = self.engine.image_digest
        self.engine_profile = self.engine.profile_label
        self.weights_revision = pulumi.Output.from_input(cfg.weights_revision)
        self.tree_digest = pulumi.Output.from_input(receipt.model.tree_digest)
        self.image = pulumi.Output.from_input(image)
        self.profile = pulumi.Output.from_input(cfg.profile)
        self.license_name = pulumi.Output.from_input(receipt.license.name)
        self.register_outputs(self.outputs())

    def outputs(self) -> dict[str, pulumi.Output]:
        return {"endpoint": self.endpoint, "servedModelName": self.served_model_name,
                "receiptId": self.receipt_id, "engineCommit": self.engine_commit,
                "engineVersion": self.engine_version, "wheelSha256": self.wheel_sha256,
                "imageDigest": self.image_digest, "engineProfile": self.engine_profile,
                "weightsRevision": self.weights_revision, "treeDigest": self.tree_digest,
                "image": self.image, "profile": self.profile,
                "licenseName": self.license_name}
