"""What `k3infra render` adds for a Docker-host stack: the containers as the program
registered them, the host preflight, and `compose.yaml` built from the same host plan
with the image the program used."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional

from k3infra.config import StackConfig
from k3infra.host.compose import COMPOSE_FILE, CONFIG_DIR, compose_yaml, config_files
from k3infra.host.plan import SERVER, HostPlan, container_name, host_plan
from k3infra.host.preflight import host_preflight_report
from k3infra.plan import ServingPlan
from k3infra.receipt import Receipt
from k3infra.serve_argv import serve_args_of
from k3infra.podcommon import atomic_write_text, output_directory

CONTAINER_TYPE = "docker:index/container:Container"
COMPONENT_TYPE = "k3infra:index:K3HostStack"


def rendered_instance(render: Any) -> str:
    """The K3HostStack's instance name as the program registered it."""
    return render.by_type(COMPONENT_TYPE)[0]["name"]


def rendered_image(render: Any, instance: str) -> Optional[str]:
    """The serving container's image as the program registered it."""
    for res in render.by_type(CONTAINER_TYPE):
        if res["name"] == container_name(instance, SERVER):
            return res["inputs"].get("image")
    return None


def rendered_serve_line(render: Any, instance: str) -> str:
    """`vllm serve ...` exactly as the rendered server container runs it (after the gate)."""
    for res in render.by_type(CONTAINER_TYPE):
        if res["name"] == container_name(instance, SERVER):
            i = res["inputs"]
            args = serve_args_of([*i.get("entrypoints", []), *i.get("command", [])])
            if args is not None:
                return " ".join(["vllm", "serve", *args])
    raise ValueError(f"the render has no {container_name(instance, SERVER)} container "
                     "running `vllm serve`")


def render_plan(plan: ServingPlan, cfg: StackConfig, render: Any,
                lock_text: Optional[str]) -> HostPlan:
    instance = rendered_instance(render)
    image = rendered_image(render, instance) or cfg.engine_image
    return host_plan(plan, cfg, instance, image, lock_text)


def container_rows(render: Any) -> list[tuple[str, str, str]]:
    """(container, image, what it runs and where) per registered container."""
    rows = []
    for res in render.by_type(CONTAINER_TYPE):
        i = res["inputs"]
        command = [*i.get("entrypoints", []), *i.get("command", [])]
        shown = " ".join(command)
        extra = []
        if i.get("gpus"):
            extra.append(f"gpus={i['gpus']}")
        for p in i.get("ports", []):
            extra.append(f"{p.get('ip')}:{p.get('external')}->{p.get('internal')}")
        if i.get("networkMode") not in (None, "bridge"):
            extra.append(f"network={i['networkMode']}")
        if i.get("mustRun") is False:
            extra.append("one-shot, must exit 0")
        rows.append((res["name"], str(i.get("image")), shown + ("  [" + ", ".join(extra) + "]"
                                                                 if extra else "")))
    return rows


def write_compose(plan: HostPlan, receipt: Receipt, cfg: StackConfig, out: Path) -> Path:
    header = {"receipt": receipt.id, "profile": cfg.profile,
              "weightsRevision": cfg.weights_revision, "treeDigest": receipt.model.tree_digest,
              "serveCommand": " ".join(plan.serve_command)}

    path = out / COMPOSE_FILE
    atomic_write_text(path, compose_yaml(plan, header))     # the one output writer
    # The configs' files, read-only (Compose bind-mounts them as they are); the folder
    # is written anew, so no file of an earlier render is mounted. A link or a file in
    # its place is refused, never followed or replaced.
    configs = out / CONFIG_DIR
    output_directory(configs, create=False)
    shutil.rmtree(configs, ignore_errors=True)
    output_directory(configs)
    for rel, content in config_files(plan).items():
        f = out / rel
        atomic_write_text(f, content)
        f.chmod(0o444)
    return path


def preflight_lines(plan: ServingPlan, cfg: StackConfig,
                    lock_total_bytes: Optional[int]) -> list[str]:
    return host_preflight_report(cfg, plan.receipt, lock_total_bytes, plan.fit)
