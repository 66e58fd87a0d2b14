"""`compose.yaml`: the host plan for `docker compose up`, without Pulumi.

Same image digest, command, env names, GPUs, healthcheck and start order as
`K3HostStack`. Secrets never appear in the file: the containers name them and Compose
reads each value from its own env file next to it (ENV_FILES, created by the
operator, mode 0600), so a container receives only the secrets it uses. The runtime files
and the proxy config are Compose `configs` from files written beside it (CONFIG_DIR), which
Compose bind-mounts read-only: inline `content` configs are refused for a `read_only`
service ("`file` is the sole supported option", docker compose 2.40 on the host tier's
daemon, tests/e2e/test_host_compose.py), and every service here is read-only.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

import yaml

from k3infra.host.plan import HostContainer, HostPlan, container_name

ENV_FILES = {"VLLM_API_KEY": "k3-api-key.env", "HF_TOKEN": "k3-hf-token.env"}
COMPOSE_FILE = "compose.yaml"
CONFIG_DIR = "configs"               # beside compose.yaml: one file per config
# Compose interpolates `$` in every string value: `$$` is a literal dollar.
_DOLLAR = re.compile(r"\$")


def _escape(value: Any) -> Any:
    if isinstance(value, str):
        return _DOLLAR.sub("$$", value)
    if isinstance(value, list):
        return [_escape(v) for v in value]
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    return value


def _config_name(path: str, content: str) -> str:
    """A stable, valid Compose config name (and file name) for a container path and its
    content: two containers that mount one path with other bytes get two configs."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", path.strip("/")).strip("-")
    digest = hashlib.sha256(path.encode() + b"\0" + content.encode()).hexdigest()
    return f"{slug}-{digest[:8]}"


def config_files(plan: HostPlan) -> dict[str, str]:
    """The files the configs name, relative to compose.yaml -> content."""
    return {f"{CONFIG_DIR}/{_config_name(path, content)}": content
            for c in plan.containers for path, content in c.files.items()}


def _ulimit(soft: int, hard: int) -> Any:
    return soft if soft == hard else {"soft": soft, "hard": hard}


def _service(instance: str, c: HostContainer, configs: dict[str, dict]) -> dict:
    # The container names K3HostStack gives them: one instance, whichever tool made it.
    svc: dict[str, Any] = {"image": c.image, "container_name": container_name(instance, c.name),
                           "command": _escape(c.command), "user": c.user,
                           "read_only": c.read_only_rootfs,
                           "cap_drop": ["ALL"], "security_opt": ["no-new-privileges:true"]}
    if c.env:
        svc["environment"] = _escape(dict(c.env))
    if c.secret_env:
        # Values from the env file; only the names it must hold appear here.
        svc["env_file"] = [{"path": ENV_FILES[n], "required": True} for n in c.secret_env]
    if c.files:
        svc["configs"] = []
        for path, content in c.files.items():
            name = _config_name(path, content)
            configs[name] = {"file": f"./{CONFIG_DIR}/{name}"}
            svc["configs"].append({"source": name, "target": path})
    volumes = []
    tmpfs = []
    for m in c.mounts:
        if m.kind == "tmpfs":
            tmpfs.append(m.target)
        else:
            volumes.append({"type": m.kind, "source": m.source, "target": m.target,
                            "read_only": m.read_only,
                            **({"bind": {"create_host_path": False}} if m.kind == "bind" else {})})
    if volumes:
        svc["volumes"] = volumes
    if tmpfs:
        svc["tmpfs"] = tmpfs
    if c.gpus:
        svc["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": c.gpus, "capabilities": ["gpu"]}]}}}
    if c.shm_size_bytes:
        svc["shm_size"] = c.shm_size_bytes
    if c.ulimits:
        svc["ulimits"] = {k: _ulimit(*v) for k, v in c.ulimits.items()}
    if c.ports:
        svc["ports"] = [{"host_ip": p.host_ip, "published": str(p.host_port),
                         "target": p.container_port, "protocol": "tcp"} for p in c.ports]
    if c.healthcheck:
        hc = c.healthcheck
        svc["healthcheck"] = {"test": _escape(hc.test), "interval": f"{hc.interval_seconds}s",
                              "timeout": f"{hc.timeout_seconds}s", "retries": hc.retries,
                              "start_period": f"{hc.start_period_seconds}s"}
    svc["restart"] = c.restart
    if c.network_mode:
        svc["network_mode"] = c.network_mode
    if c.depends_on:
        svc["depends_on"] = {name: {"condition": cond} for name, cond in c.depends_on.items()}
    return svc


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, nginx.conf) as literal blocks, readable in the file."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value and not value.startswith((" ", "\t")) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def compose_document(plan: HostPlan, header: dict[str, str]) -> dict:
    configs: dict[str, dict] = {}
    services = {c.name: _service(plan.instance, c, configs) for c in plan.containers}
    doc: dict[str, Any] = {"name": plan.instance, "services": services, "configs": configs}
    volumes = sorted({m.source for c in plan.containers for m in c.mounts if m.kind == "volume"})
    if volumes:
        # `name:` keeps Compose from prefixing the project: the same volume K3HostStack makes.
        doc["volumes"] = {v: {"name": v} for v in volumes}
    doc["x-k3infra"] = header
    return doc


def compose_yaml(plan: HostPlan, header: dict[str, str]) -> str:
    env_names = sorted({n for c in plan.containers for n in c.secret_env})
    intro = ("# Kimi K3 on one 8-GPU host, written by `k3infra render --stack <host stack>`.\n"
             "# Secrets: create next to this file (chmod 600), one variable each:\n"
             + "".join(f"#   {ENV_FILES[n]}: {n}=...\n" for n in env_names)
             + "# then: docker compose up -d   (prefetch runs first; vllm starts only after\n"
             "# it exited 0, and its gate re-checks the tree before `vllm serve`).\n")
    return intro + yaml.dump(compose_document(plan, header), Dumper=_Dumper,
                             sort_keys=False, width=1000)
