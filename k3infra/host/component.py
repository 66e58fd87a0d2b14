"""`K3HostStack`: Kimi K3 on one 8-GPU Docker host, no Kubernetes (pulumi-docker).

    from k3infra.receipt import load_receipt
    stack = K3HostStack("kimi-k3", {**keys, "receipt": load_receipt()})   # keys: k3:* with k3:host

Like `K3ServingStack` (docs/component.md): the receipt is a required arg, names
derive from the instance (containers `<instance>-prefetch|vllm|proxy`, the volume
`<instance>-cache`), and only `k3infra render` passes `offlineRender=True`.
The Docker daemon is Pulumi's `docker:host` setting (ssh://user@host or the local
socket), or a `docker.Provider` passed in `opts.providers`. In order: the engine image
pulled by digest, the prefetch container (must exit 0), the authenticating proxy (it
owns the network namespace and the ports), the vLLM container in it (the weights gate,
then `vllm serve` with the receipt's args and env). The containers are the host plan's
(k3infra/host/plan.py), the same ones `compose.yaml` describes.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import pulumi
import pulumi_docker as docker

from k3infra import gates, naming
from k3infra.componentargs import StackConfigArgs, top_level_args
from k3infra.config import ConfigError, StackConfig, parse_stack_config
from k3infra.engine import EngineBuild, engine_gates
from k3infra.kube import child_options
from k3infra.host.plan import (CACHE_OWNER, PROXY, SERVER, HostContainer, HostPlan, cache_volume,
                               check_host_engine, container_name, host_plan)
from k3infra.host.preflight import run_host_preflight
from k3infra.plan import ServingPlan, resolve_plan
from k3infra.plugin.shapes import K3HostStackArgs
from k3infra.serving import manifests as serving
from k3infra.weights.lockcheck import load_stack_lock

LOG_TAIL_LINES = 30
MIB = 2**20


class PrefetchFailed(RuntimeError):
    """The weights prefetch container exited non-zero: nothing serves."""


def prefetch_verdict(exit_code: Optional[int], logs: Optional[str],
                     offline_render: bool) -> str:
    """'ok' after exit 0; raise with the container's last log lines otherwise. Unknown
    passes only when this is not an update (a preview, or `offline_render`)."""
    if exit_code is None:
        if gates.is_update(offline_render):
            raise PrefetchFailed("the weights prefetch container reported no exit code; "
                                 "refusing to create the server")
        return "unknown until pulumi up"
    if exit_code != 0:
        tail = "\n".join((logs or "").rstrip("\n").splitlines()[-LOG_TAIL_LINES:])
        raise PrefetchFailed(f"the weights prefetch container exited {exit_code}; "
                             f"its last log lines:\n{tail}")
    return "ok"


class K3HostStack(pulumi.ComponentResource):
    """Kimi K3 on one 8-GPU host with Docker, deployed exactly as the receipt measured it."""

    endpoint: pulumi.Output[str]
    image_digest: pulumi.Output[str]
    weights_revision: pulumi.Output[str]
    tree_digest: pulumi.Output[str]
    profile: pulumi.Output[str]
    license_name: pulumi.Output[str]

    def __init__(self, name: str, args: Union[K3HostStackArgs, StackConfigArgs],
                 opts: Optional[pulumi.ResourceOptions] = None):
        """`args["receipt"]`: what "measured" means for this instance (required, explicit).
        `args["offlineRender"]`: set by `k3infra render` only; gates then warn instead of
        refusing and builds show placeholder digests. `pulumi up` never sets it. The
        keys are plain values (no Output: nothing here is wired)."""
        # Everything that can refuse does so before the first registration.
        given = top_level_args(args, "K3HostStack")
        receipt, offline_render = given.receipt, given.offline_render
        instance = naming.check_instance_name(name, "K3HostStack name")
        if isinstance(given.config, StackConfig):
            cfg = given.config
        elif given.config is not None:      # wired values: nothing on a host is wired
            raise TypeError("K3HostStack: args['config'] must be a StackConfig "
                            "(k3infra.config.parse_stack_config)")
        else:
            cfg = parse_stack_config(given.keys, receipt=receipt)
        self.config = cfg
        if cfg.host is None:
            raise ConfigError("k3:host", None, "is required for K3HostStack")
        check_host_engine(cfg)
        # Every figure the children read, once (k3infra/plan.py): the HBM fit and the
        # k3:engine / k3:profile refusals come here. No instance: a host has no
        # Kubernetes names.
        self.serving_plan: ServingPlan = resolve_plan(receipt, cfg)
        lock = load_stack_lock(receipt, cfg)
        gates.enforce(gates.deployment_gates(receipt, cfg) + engine_gates(receipt, cfg), offline_render)
        self.preflight = run_host_preflight(cfg, receipt, lock.total_bytes if lock else None,
                                            self.serving_plan.fit)
        if cfg.host.publish_all_interfaces:
            pulumi.log.warn(f"k3:host.publishAllInterfaces: the API is published on every "
                            f"interface ({self._where(cfg)}): only the proxy's bearer key "
                            "guards it; firewall the port (docs/host.md)")

        super().__init__("k3infra:index:K3HostStack", name, None, opts)
        # Children carry this component's depends_on themselves (docs/component.md).
        self._opts = opts
        child = child_options(self, opts)
        self.engine = EngineBuild(f"{name}-engine", {
            "config": cfg, "receipt": receipt, "base": instance,
            "labels": serving.labels(instance, "engine-build"), "gatesEnforced": True,
            "offlineRender": offline_render, "plan": self.serving_plan}, child)
        image = self.engine.image
        self.plan: HostPlan = host_plan(self.serving_plan, cfg, instance, image,
                                        lock.text if lock else None)

        # The image by digest, pulled once; every container names the same reference.
        self.image = docker.RemoteImage(f"{name}-engine-image", name=image, keep_locally=True,
                                        opts=child)
        proxy_spec = self.plan.container("proxy")
        self.proxy_image = docker.RemoteImage(f"{name}-proxy-image", name=proxy_spec.image,
                                              keep_locally=True, opts=child)
        self.cache = docker.Volume(f"{name}-cache", name=cache_volume(instance),
                                   labels=[docker.VolumeLabelArgs(label=k, value=v) for k, v
                                           in serving.labels(instance, "cache").items()],
                                   opts=child)
        secrets = {"VLLM_API_KEY": pulumi.Output.secret(cfg.api_key.reveal())}
        if cfg.hf_token is not None:
            secrets["HF_TOKEN"] = pulumi.Output.secret(cfg.hf_token.reveal())

        spec = self.plan.container("prefetch")
        self.prefetch = self._container(instance, spec, secrets, [self.image], attach=True)
        verdict = pulumi.Output.all(self.prefetch.exit_code, self.prefetch.container_logs) \
            .apply(lambda a: prefetch_verdict(a[0], a[1], offline_render))

        # The cache volume to the engine's user, once it exists (plan.CACHE_OWNER says why).
        self.cache_owner = self._container(instance, self.plan.container(CACHE_OWNER), secrets,
                                           [self.image, self.cache], attach=True)

        # The proxy owns the network namespace and the ports (plan.py says why).
        self.proxy = self._container(instance, proxy_spec, secrets, [self.proxy_image])
        spec = self.plan.container(SERVER)
        joined = (self.proxy.name.apply(lambda n: f"container:{n}")
                  if spec.network_mode == f"service:{PROXY}" else None)
        # The verdict is an input: a failed prefetch fails `pulumi up` before this exists.
        # The pins describe the engine the container really runs (the build's plan).
        self.server = self._container(instance, spec, secrets,
                                      [self.prefetch, self.cache, self.cache_owner, self.proxy],
                                      network_mode=joined,
                                      # The receipt by content, as on a StatefulSet (a
                                      # Docker label is the container's own: a new
                                      # receipt content recreates it).
                                      extra_labels={"k3infra.dev/weights-prefetch": verdict,
                                                    **serving.workload_receipt(receipt)},
                                      pins=serving.pin_annotations(receipt, cfg,
                                                                   self.engine.plan.pins()))

        self.endpoint = pulumi.Output.from_input(self.plan.endpoint)
        self.image_digest = self.engine.image_digest
        self.weights_revision = pulumi.Output.from_input(cfg.weights_revision)
        self.tree_digest = pulumi.Output.from_input(receipt.model.tree_digest)
        self.profile = pulumi.Output.from_input(cfg.profile)
        self.license_name = pulumi.Output.from_input(receipt.license.name)
        self.image_ref = pulumi.Output.from_input(image)
        self.receipt_id = pulumi.Output.from_input(receipt.id)
        self.receipt_sha256 = pulumi.Output.from_input(receipt.sha256())
        self.receipt_status = pulumi.Output.from_input(receipt.status)
        self.served_model_name = pulumi.Output.from_input(cfg.served_model_name)
        self.register_outputs(self.outputs())

    @staticmethod
    def _where(cfg: StackConfig) -> str:
        h = cfg.host
        return ("network_mode host" if h.network_mode == "host"
                else f"{h.publish_address}:{cfg.serving.port}")

    def _container(self, instance: str, c: HostContainer, secrets: dict[str, pulumi.Output],
                   depends_on: list, attach: bool = False, network_mode: Any = None,
                   extra_labels: Optional[dict] = None,
                   pins: Optional[dict] = None) -> docker.Container:
        # An Output value (the engine image of a build) joins its name once resolved.
        envs: list[Any] = [pulumi.Output.concat(k, "=", v) if isinstance(v, pulumi.Output)
                           else f"{k}={v}" for k, v in c.env.items()]
        envs += [secrets[n].apply(lambda v, n=n: f"{n}={v}") for n in c.secret_env]
        labels = {**serving.labels(instance, c.name), **(pins or {}), **(extra_labels or {})}
        mounts, tmpfs = [], {}
        for m in c.mounts:
            if m.kind == "tmpfs":
                tmpfs[m.target] = "rw,nosuid,nodev,size=16g"
            else:
                source = self.cache.name if m.kind == "volume" else m.source
                mounts.append(docker.ContainerMountArgs(target=m.target, type=m.kind,
                                                        source=source, read_only=m.read_only))
        hc = c.healthcheck
        return docker.Container(
            container_name(instance, c.name),
            name=container_name(instance, c.name),
            image=c.image,
            # The image's entrypoint is replaced by the plan's full command line.
            entrypoints=c.command[:1], command=c.command[1:],
            # Each secret entry stays a secret on its own (plan and state show [secret]).
            envs=envs,
            labels=[docker.ContainerLabelArgs(label=k, value=v) for k, v in labels.items()],
            uploads=[docker.ContainerUploadArgs(file=p, content=t) for p, t in c.files.items()],
            mounts=mounts, tmpfs=tmpfs or None,
            gpus="all" if c.gpus else None,
            shm_size=c.shm_size_bytes // MIB if c.shm_size_bytes else None,
            ulimits=[docker.ContainerUlimitArgs(name=k, soft=s, hard=h)
                     for k, (s, h) in c.ulimits.items()],
            ports=[docker.ContainerPortArgs(internal=p.container_port, external=p.host_port,
                                            ip=p.host_ip, protocol="tcp") for p in c.ports],
            healthcheck=docker.ContainerHealthcheckArgs(
                tests=hc.test, interval=f"{hc.interval_seconds}s", timeout=f"{hc.timeout_seconds}s",
                retries=hc.retries, start_period=f"{hc.start_period_seconds}s") if hc else None,
            restart=c.restart, user=c.user, read_only=c.read_only_rootfs,
            privileged=False,
            capabilities=docker.ContainerCapabilitiesArgs(drops=["ALL"]),
            security_opts=["no-new-privileges:true"],
            network_mode=network_mode or c.network_mode or "bridge",
            must_run=not c.one_shot, attach=attach, logs=attach,
            # `pulumi up` returns once the server is healthy (gate, load and compile).
            wait=bool(hc),
            wait_timeout=(hc.start_period_seconds + hc.interval_seconds * hc.retries) if hc else None,
            opts=child_options(self, self._opts, *depends_on,
                               additional_secret_outputs=["envs"]))

    def outputs(self) -> dict[str, pulumi.Output]:
        return {"endpoint": self.endpoint, "imageDigest": self.image_digest,
                "weightsRevision": self.weights_revision, "treeDigest": self.tree_digest,
                "profile": self.profile, "licenseName": self.license_name,
                "image": self.image_ref, "receiptId": self.receipt_id,
                "receiptSha256": self.receipt_sha256, "receiptStatus": self.receipt_status,
                "servedModelName": self.served_model_name}
