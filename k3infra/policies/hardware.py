"""Policies on what a serving pod needs from its node: eight GPUs of an allowed product,
HBM that holds the weights, memory-backed /dev/shm, and a startup budget long enough to
load the weights."""
from __future__ import annotations

from pulumi_policy import (EnforcementLevel, PolicyConfigSchema, ReportViolation,
                           ResourceValidationArgs, ResourceValidationPolicy, StackValidationArgs,
                           StackValidationPolicy)

from k3infra import topology
from k3infra.config import ConfigError
from k3infra.hbm import HbmError, hbm_fit
from k3infra.placement import GPU_RESOURCE
from k3infra.policies import stack_config
from k3infra.policies.workloads import LEADER_WORKER_SET, as_int, get, items, workloads
from k3infra.serving import startup as budgets

_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs


def _gpus() -> int:
    return _receipt().measured_gpu.gpus_per_node


ENGINE_READY_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"
# Kubernetes' probe defaults when a field is left out.
_PROBE_DEFAULTS = {"periodSeconds": 10, "failureThreshold": 3, "initialDelaySeconds": 0}


# --- GPU count ----------------------------------------------------------------------------

def _gpu_count(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for wl in workloads(args.resource_type, args.props):
        group = wl.kind == LEADER_WORKER_SET
        # A multi-node group: nodesPerReplica pods x gpusPerNode = the receipt's TP world.
        want = topology.GPUS_PER_NODE if group else _gpus()
        if group and wl.role == "leader" and wl.vllm_servers():
            size = as_int(get(args.props, "spec", "leaderWorkerTemplate", "size"))
            if size != topology.NODES_PER_REPLICA:
                report(f"{wl.kind} {wl.name}: leaderWorkerTemplate.size is {size!r}, expected "
                       f"{topology.NODES_PER_REPLICA} pods x {want} GPUs = TP{_gpus()}", None)
        for c in wl.vllm_servers():
            for part in ("requests", "limits"):
                found = get(c.spec, "resources", part, GPU_RESOURCE)
                if as_int(found) != want:
                    report(f"{wl.kind} {wl.name} {wl.role + ' ' if wl.role else ''}container "
                           f"{c.name}: resources.{part}[{GPU_RESOURCE}] is {found!r}, "
                           f"expected {want}", None)


gpu_count = ResourceValidationPolicy(
    name="k3-gpu-count",
    description=(f"Each serving pod requests and limits exactly {_gpus()} {GPU_RESOURCE}: the "
                 f"receipt ran tensor parallel {_gpus()} with expert parallelism on one "
                 f"{_receipt().hardware.node}, with {_receipt().residency.weights_gib_per_gpu:.2f} GiB of "
                 "weights on every GPU."),
    validate=_gpu_count,
    enforcement_level=EnforcementLevel.MANDATORY,
)


# --- GPU product ---------------------------------------------------------------------------

# Multi-node groups (k3:topology = multi-node) run on the receipt's 4-GPU products.
def _multi_node_products() -> list[str]:
    return sorted(p for p, spec in _receipt().gpus.items()
                  if spec.gpus_per_node == topology.GPUS_PER_NODE)


def _allowed_products(args, group: bool = False) -> list[str]:
    key, default = (("allowedMultiNodeProducts", _multi_node_products()) if group
                    else ("allowedProducts", [_receipt().hardware.gpu_product_label]))
    found = args.get_config().get(key)
    return [str(p) for p in items(found)] if found is not None else list(default)


def _gpu_product(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for wl in workloads(args.resource_type, args.props):
        if not wl.is_serving:
            continue
        allowed = _allowed_products(args, wl.kind == LEADER_WORKER_SET)
        terms = wl.gpu_products()
        if terms is None:
            report(f"{wl.kind} {wl.name}: no required node affinity or nodeSelector on "
                   f"nvidia.com/gpu.product; the pod could land on any GPU (allowed: "
                   f"{', '.join(allowed)})", None)
            continue
        for i, products in enumerate(terms):
            if products is None:
                report(f"{wl.kind} {wl.name}: node selector term {i} does not constrain "
                       f"nvidia.com/gpu.product (allowed: {', '.join(allowed)})", None)
            elif not products or any(p not in allowed for p in products):
                bad = [p for p in products if p not in allowed] or ["(none)"]
                report(f"{wl.kind} {wl.name}: node selector term {i} admits GPU product(s) "
                       f"{', '.join(bad)}; allowed: {', '.join(allowed)}", None)


gpu_product = ResourceValidationPolicy(
    name="k3-gpu-product",
    description=(f"Serving pods are scheduled only onto the allowed B300 GPU products "
                 f"(default: the receipt's {_receipt().hardware.gpu_product_label}, compute capability "
                 f"{_receipt().hardware.compute_capability}) through a required node affinity: 8x B200 "
                 "does not fit the weights and 4-GPU GB300 nodes cannot hold one replica."),
    validate=_gpu_product,
    enforcement_level=EnforcementLevel.MANDATORY,
    # No schema defaults: they are the stack's receipt's (k3:receipt), read when the
    # policy runs (_allowed_products), not the receipt of the pack's import.
    config_schema=PolicyConfigSchema(properties={
        "allowedProducts": {
            "type": "array", "items": {"type": "string"}, "minItems": 1,
            "description": "nvidia.com/gpu.product values serving pods may run on "
                           "(unset: the stack's receipt's GPU product)"},
        "allowedMultiNodeProducts": {
            "type": "array", "items": {"type": "string"},
            "description": "nvidia.com/gpu.product values the pods of a multi-node group "
                           "(LeaderWorkerSet) may run on (unset: the stack's receipt's 4-GPU "
                           "products)"}}),
)


# --- HBM fit (stack) -----------------------------------------------------------------------

def _hbm_fit(args: StackValidationArgs, report: ReportViolation) -> None:
    memory = stack_config.gpu_memory_gib()
    for res in args.resources:
        for wl in workloads(res.resource_type, res.props):
            if not wl.is_serving:
                continue
            terms = wl.gpu_products()
            if terms is None or any(t is None for t in terms):
                report(f"{wl.kind} {wl.name}: the GPU product is not constrained, so HBM fit "
                       "cannot be established", res.urn)
                continue
            for product in sorted({p for t in terms for p in t}):
                try:
                    if wl.kind == LEADER_WORKER_SET:     # summed over the NVLink domain
                        topology.domain_fit(_receipt(), product, memory)
                    else:
                        hbm_fit(_receipt(), product, memory)
                except (HbmError, ConfigError) as exc:
                    report(f"{wl.kind} {wl.name}: {exc}", res.urn)


hbm_fit_policy = StackValidationPolicy(
    name="k3-hbm-fit",
    description=(f"Every GPU product a serving pod may land on holds the receipt's "
                 f"{_receipt().residency.weights_gib_per_gpu:.2f} GiB of weights per GPU at TP{_gpus()}+EP "
                 "with headroom for the KV cache (k3infra.hbm): the receipt's attempts on 8x "
                 "B200 failed because the weights alone filled the free memory."),
    validate=_hbm_fit,
    enforcement_level=EnforcementLevel.MANDATORY,
)


# --- /dev/shm -------------------------------------------------------------------------------

def _dev_shm(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for wl in workloads(args.resource_type, args.props):
        volumes = wl.volumes()
        for c in wl.vllm_servers():
            mount = next((m for m in c.mounts() if get(m, "mountPath") == "/dev/shm"), None)
            if mount is None:
                report(f"{wl.kind} {wl.name} container {c.name}: nothing is mounted at /dev/shm "
                       "(the runtime default is 64 MiB)", None)
                continue
            volume = volumes.get(str(get(mount, "name")))
            if get(volume, "emptyDir", "medium") != "Memory":
                report(f"{wl.kind} {wl.name} container {c.name}: /dev/shm volume "
                       f"{get(mount, 'name')!r} is not an emptyDir with medium Memory", None)


dev_shm = ResourceValidationPolicy(
    name="k3-dev-shm",
    description=(f"/dev/shm of every vLLM server is a memory-backed emptyDir: the {_gpus()} tensor-"
                 "parallel workers and NCCL exchange through shared memory, and a container "
                 "runtime's 64 MiB default fails them."),
    validate=_dev_shm,
    enforcement_level=EnforcementLevel.MANDATORY,
)


# --- startup budget -----------------------------------------------------------------------

def required_budget(args, pods: int = 1) -> budgets.StartupBudget:
    serving = stack_config.serving()
    override = args.get_config().get("storageReadGBps")
    if override is not None:
        serving = serving.model_copy(update={"storage_read_gbps": float(override)})
    return budgets.startup_budget(_receipt(), serving, stack_config.cold_start(),
                                  stack_config.weights().gate_mode, pods)


def _startup_budget(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for wl in workloads(args.resource_type, args.props):
        servers = wl.vllm_servers()
        if not servers:
            continue
        group = wl.kind == LEADER_WORKER_SET
        # A group's gates read the tree at once on every pod (serving/startup.py).
        budget = required_budget(args, topology.NODES_PER_REPLICA if group else 1)
        # The probe must outlast the gate and the engine's own deadline; the engine's
        # deadline must cover load + compile + profiling (k3infra.serving.startup).
        need, engine = budget.seconds("gate") + budget.engine_seconds, budget.engine_seconds
        for c in servers:
            probe = get(c.spec, "startupProbe")
            where = f"{wl.kind} {wl.name} {wl.role + ' ' if wl.role else ''}container {c.name}"
            if group and wl.role == "worker":
                pass            # headless: no server to probe; the leader's probe waits for it
            elif probe is None:
                report(f"{where}: no startupProbe; liveness would kill a pod still loading "
                       f"(needs more than {need} s)", None)
            else:
                fields = {k: as_int(get(probe, k, default=d)) for k, d in _PROBE_DEFAULTS.items()}
                if None in fields.values():
                    report(f"{where}: startupProbe timing is not a whole number: {fields}", None)
                else:
                    have = (fields["initialDelaySeconds"]
                            + fields["periodSeconds"] * fields["failureThreshold"])
                    if have <= need:
                        report(f"{where}: startupProbe allows {have} s (periodSeconds "
                               f"{fields['periodSeconds']} x failureThreshold "
                               f"{fields['failureThreshold']}); the weights gate and the engine's "
                               f"deadline take {need} s (failureThreshold > "
                               f"{(need - fields['initialDelaySeconds']) // max(fields['periodSeconds'], 1)})",
                               None)
            ready = as_int(c.env_value(ENGINE_READY_ENV))
            if ready is None or ready < engine:
                report(f"{where}: env {ENGINE_READY_ENV} is {c.env_value(ENGINE_READY_ENV)!r}; "
                       f"the engine would give up before the {engine} s that its start, the "
                       "load, compile and profiling need", None)


startup_budget = ResourceValidationPolicy(
    name="k3-startup-budget",
    description=(f"{ENGINE_READY_ENV} covers the engine's start, its load of the receipt's "
                 f"{_receipt().model.size_gb:g} GB, compile and profiling, and the vLLM startupProbe "
                 "(initialDelaySeconds + periodSeconds x failureThreshold) outlasts the weights "
                 "gate plus that deadline, each phase budgeted from the stack's k3:serving and "
                 "k3:coldStart (k3infra.serving.startup): nothing listens until the load and "
                 "graph capture finish, and a probe that fires early restarts the load."),
    validate=_startup_budget,
    enforcement_level=EnforcementLevel.MANDATORY,
    config_schema=PolicyConfigSchema(properties={
        "storageReadGBps": {
            "type": "number", "exclusiveMinimum": 0,
            "description": "storage read throughput (GB/s) to size the budget with, instead "
                           "of the stack's k3:serving.storageReadGBps"}}),
)

POLICIES = [gpu_count, gpu_product, hbm_fit_policy, dev_shm, startup_budget]
