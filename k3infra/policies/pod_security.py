"""Pods stay inside their sandbox: no privileged containers, no host namespaces, no added
capabilities, host paths only for the node-local weights root, sized resources."""
from __future__ import annotations

import posixpath

from pulumi_policy import (EnforcementLevel, PolicyConfigSchema, ReportViolation,
                           ResourceValidationArgs, ResourceValidationPolicy)

from k3infra.policies.workloads import get, items, workloads

from k3infra.policies import stack_config
_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")


def _sandbox(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for wl in workloads(args.resource_type, args.props):
        for field in HOST_NAMESPACES:
            if get(wl.pod_spec, field) is True:
                report(f"{wl.kind} {wl.name}: pod sets {field}: true", None)
        for c in wl.containers():
            where = f"{wl.kind} {wl.name} container {c.name}"
            if get(c.spec, "securityContext", "privileged") is True:
                report(f"{where}: securityContext.privileged is true", None)
            added = items(get(c.spec, "securityContext", "capabilities", "add"))
            if added:
                report(f"{where}: adds capabilities {', '.join(map(str, added))}", None)


pod_sandbox = ResourceValidationPolicy(
    name="k3-pod-sandbox",
    description=("No privileged container, no host network, PID or IPC namespace and no added "
                 "Linux capability in any pod: vLLM reaches its GPUs through the device plugin "
                 f"({_receipt().measured_gpu.gpus_per_node} nvidia.com/gpu) and NCCL through /dev/shm, "
                 "neither of which needs host privileges; a privileged pod on an 8-GPU node "
                 "owns the node."),
    validate=_sandbox,
    enforcement_level=EnforcementLevel.MANDATORY,
)


def _norm(path: str) -> str:
    return posixpath.normpath(path) if path else path


def _host_path(args: ResourceValidationArgs, report: ReportViolation) -> None:
    allowed = {_norm(str(p)) for p in items(args.get_config().get("allowedPaths"))}
    for wl in workloads(args.resource_type, args.props):
        for name, volume in wl.volumes().items():
            path = get(volume, "hostPath", "path")
            if path is None:
                continue
            if _norm(str(path)) not in allowed:
                shown = ", ".join(sorted(allowed)) or "none"
                report(f"{wl.kind} {wl.name} volume {name}: hostPath {path!r} is not an "
                       f"allowed host path (allowed: {shown}; node-local weights are local "
                       "PersistentVolumes, never a hostPath)", None)


host_path = ResourceValidationPolicy(
    name="k3-host-path",
    description=("No pod of the stack mounts a host path (unless the policy's allowedPaths "
                 f"names it): node-local weights, the {_receipt().model.size_gb:g} GB tree on each "
                 "node's NVMe, are local PersistentVolumes claimed through PVCs, so the "
                 "serving namespace stays Pod Security `restricted`. A host path exposes "
                 "the node's file system to the pod."),
    validate=_host_path,
    enforcement_level=EnforcementLevel.MANDATORY,
    config_schema=PolicyConfigSchema(properties={
        "allowedPaths": {
            "type": "array", "items": {"type": "string"}, "default": [],
            "description": "further host paths your cluster allows (absolute)"}}),
)


def _resources(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for wl in workloads(args.resource_type, args.props):
        for c in wl.containers():
            if c.list_name == "ephemeralContainers":
                continue   # the API does not allow resources on ephemeral containers
            missing = [f"{part}.{res}" for part in ("requests", "limits")
                       for res in ("cpu", "memory", "ephemeral-storage")
                       if get(c.spec, "resources", part, res) is None]
            if missing:
                report(f"{wl.kind} {wl.name} container {c.name}: no resources "
                       f"{', '.join(missing)}", None)


resources = ResourceValidationPolicy(
    name="k3-resources",
    description=(f"Every container states CPU, memory and ephemeral-storage requests and limits: "
                 f"a serving node is one replica of a {_receipt().model.total_params}-parameter model, "
                 f"and an unbounded neighbour (or an unbounded prefetch hashing "
                 f"{_receipt().model.size_gb:g} GB) must not starve it, nor fill the node's disk "
                 "with logs or scratch, which gets pods evicted with nothing said in advance."),
    validate=_resources,
    enforcement_level=EnforcementLevel.MANDATORY,
)

POLICIES = [pod_sandbox, host_path, resources]
