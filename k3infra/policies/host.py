"""Policies for a Docker host's resources (pulumi-docker, k3infra/host): the same rules
as for pods, read from `docker:index/container:Container` inputs.

- k3-host-image-digest: container images and pulled images by digest;
- k3-host-serve-flags: the serving container's `vllm serve` line and env are the
  receipt's (engine path exact and in order, surface allow-listed);
- k3-host-container-safety: never privileged, no added capabilities, no host PID/IPC,
  host network only with k3:host.publishAllInterfaces;
- k3-host-port-binding: a published port on 0.0.0.0 / :: (or no address, which Docker
  reads as every interface) only with k3:host.publishAllInterfaces.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from pulumi_policy import (EnforcementLevel, ReportViolation, ResourceValidationArgs,
                           ResourceValidationPolicy)
from pulumi.runtime import config as runtime_config

from k3infra.fieldtypes import is_wildcard
from k3infra.policies.images import image_problem
from k3infra.policies.serve_args import serve_drift
from k3infra.policies.workloads import get, items
from k3infra.serve_argv import serve_args_of

from k3infra.policies import stack_config
_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs
CONTAINER = "docker:index/container:Container"
REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"
# The variables the weights gate reads before `exec vllm serve` (vLLM reads no K3_*).
GATE_ENV_PREFIX = "K3_"


def _config_bool(key: str) -> bool:
    """A `k3:host` setting as the program saw it (the analyzer has the stack's config)."""
    raw = runtime_config.get_config("k3:host")
    if not raw:
        return False
    try:
        host = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return False
    return bool(isinstance(host, dict) and host.get(key) is True)


def _tokens(props: Any) -> list[str]:
    return [str(t) for t in [*items(get(props, "entrypoints")), *items(get(props, "command"))]]


def _env(props: Any) -> Optional[list[dict]]:
    envs = get(props, "envs")
    if envs is None or isinstance(envs, str):
        return None          # a secret list in an offline render: not readable here
    out = []
    for entry in items(envs):
        name, _, value = str(entry).partition("=")
        out.append({"name": name, "value": value})
    return out


def serves(resource_type: str, props: Any) -> bool:
    """A Docker container that runs `vllm serve` (the host stack's serving container)."""
    return resource_type == CONTAINER and serve_args_of(_tokens(props)) is not None


def _name(args: ResourceValidationArgs) -> str:
    return f"container {get(args.props, 'name') or args.name}"


def _images(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type == CONTAINER:
        problem = image_problem(get(args.props, "image"))
        if problem:
            report(f"{_name(args)}: {problem}", None)
    elif args.resource_type == REMOTE_IMAGE:
        problem = image_problem(get(args.props, "name"))
        if problem:
            report(f"remote image {args.name}: {problem}", None)


def _serve(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != CONTAINER:
        return
    tokens = serve_args_of(_tokens(args.props))
    if tokens is None:
        return
    env = _env(args.props)
    if env is None:
        env_checked: list[dict] = []
    else:
        env_checked = [e for e in env if not e["name"].startswith(GATE_ENV_PREFIX)]
    for problem in serve_drift(_receipt(), tokens, env_checked):
        if env is None and problem.startswith("engine env"):
            continue   # the env list is secret here; the real preview sees it
        report(f"{_name(args)}: {problem}", None)


def _safety(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != CONTAINER:
        return
    p = args.props
    if get(p, "privileged") is True:
        report(f"{_name(args)}: privileged; no k3infra container needs it", None)
    caps = get(p, "capabilities")
    added = list(items(get(caps, "adds"))) if caps else []
    if added:
        report(f"{_name(args)}: adds capabilities {added}", None)
    for key in ("pidMode", "ipcMode", "usernsMode"):
        if get(p, key) == "host":
            report(f"{_name(args)}: {key} host shares the host's namespace", None)
    if get(p, "networkMode") == "host" and not _config_bool("publishAllInterfaces"):
        report(f"{_name(args)}: network mode host puts the proxy on every interface; "
               "set k3:host.networkMode = host together with publishAllInterfaces = true", None)


def _ports(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != CONTAINER or _config_bool("publishAllInterfaces"):
        return
    if get(args.props, "publishAllPorts") is True:
        report(f"{_name(args)}: publishAllPorts publishes every exposed port on every "
               "interface", None)
    for port in items(get(args.props, "ports")):
        ip = get(port, "ip")
        wide = not ip
        if ip:
            try:     # parsed, every spelling of the wildcard (::ffff:0.0.0.0 too)
                wide = is_wildcard(str(ip))
            except ValueError:
                wide = True          # not an address: nothing shows it is not every interface
        if wide:
            report(f"{_name(args)}: port {get(port, 'external')} is published on every "
                   f"interface ({ip or 'no address'}); bind 127.0.0.1 (default) or another "
                   "address, or set k3:host.publishAllInterfaces = true", None)


host_image_digest = ResourceValidationPolicy(
    name="k3-host-image-digest",
    description=(f"Docker host: every container image and pulled image is pinned by digest "
                 f"(no tag, no `latest`): the receipt's engine is one build ({_receipt().engine.name} "
                 f"{_receipt().engine.version} @ {_receipt().engine.commit})."),
    validate=_images, enforcement_level=EnforcementLevel.MANDATORY)

host_serve_flags = ResourceValidationPolicy(
    name="k3-host-serve-flags",
    description=(f"Docker host: the serving container runs `vllm serve` with receipt "
                 f"{_receipt().id}'s engine flags and env exactly and in order; beyond them only "
                 "allow-listed surface flags and env (and the weights gate's K3_* inputs)."),
    validate=_serve, enforcement_level=EnforcementLevel.MANDATORY)

host_container_safety = ResourceValidationPolicy(
    name="k3-host-container-safety",
    description=(f"Docker host: no privileged container (the {_receipt().measured_gpu.gpus_per_node} "
                 "GPUs come through the NVIDIA runtime's device requests), no added "
                 "capabilities, no host PID/IPC/user namespace, host network only when chosen."),
    validate=_safety, enforcement_level=EnforcementLevel.MANDATORY)

host_port_binding = ResourceValidationPolicy(
    name="k3-host-port-binding",
    description=(f"Docker host serving receipt {_receipt().id}: ports are published on a chosen "
                 "address (127.0.0.1 by default); every interface only with "
                 "k3:host.publishAllInterfaces = true."),
    validate=_ports, enforcement_level=EnforcementLevel.MANDATORY)

POLICIES = [host_image_digest, host_serve_flags, host_container_safety, host_port_binding]
