"""Offline render: run the real stack program (`__main__.py`) under the Pulumi SDK's mock
monitor and record every registration, with no CLI, cloud account or cluster.

Writes `plan.json` ({"stack", "resources": [{"type", "name", "urn", "parent",
"dependsOn", "customTimeouts", "inputs"}], "outputs", "warnings"}) and
`manifests/NNN-<kind>-<name>.yaml` (one Kubernetes object per file, ints as ints).
Secret values never reach either file: anything Pulumi marks secret becomes `[secret]`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from k3infra import origin
from k3infra.receipt import ChosenReceipt
from k3infra.config import (CONFIG_NAMESPACE, SECRET_KEYS, SECRET_PLACEHOLDER, apply_override,
                            chosen_receipt, parse_stack_config,
                            read_stack_file, stack_file, stack_names, to_pulumi_config)
from k3infra.podcommon import atomic_write_text, output_directory

# `__main__.py` reads this global of its own run; only the renderer sets it.
RENDER_MODE_GLOBAL = "__k3infra_render_mode__"
# The resource protocol's signature key of a wrapped value ({sig: secret-sig, value}): a
# wire constant of Pulumi's gRPC protocol, the same in every SDK.
_SECRET_SIG = "4dabf18193072939515e22adb298388d"


@dataclass
class Render:
    stack: str
    raw_config: dict[str, Any]
    secret_keys: list[str]
    resources: list[dict] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The containers as their builders tagged them (k3infra.origin), for `render --show`;
    # never written to plan.json.
    sources: list = field(default_factory=list)
    # The stack's receipt (k3:receipt resolved): plan.json records which, by content sha256.
    receipt: Optional[ChosenReceipt] = None

    def manifests(self) -> list[dict]:
        """Kubernetes objects, in registration order (CRDs included, Helm charts not, nor
        a patch of an object: the rollout gate's promotion is in plan.json only)."""
        out = []
        for r in self.resources:
            inputs = r["inputs"]
            if r["type"].startswith("kubernetes:") and "kind" in inputs and "apiVersion" in inputs \
                    and not r["type"].startswith("kubernetes:helm") \
                    and not r["type"].endswith("Patch"):
                out.append(inputs)
        return out

    def by_type(self, typ: str) -> list[dict]:
        return [r for r in self.resources if r["type"] == typ]

    def plan(self) -> dict:
        return {"stack": self.stack, "project": CONFIG_NAMESPACE,
                "config": {k: (SECRET_PLACEHOLDER if k in self.secret_keys else v)
                           for k, v in self.raw_config.items()},
                "receipt": self.receipt.record() if self.receipt else None,
                "resources": self.resources, "outputs": self.outputs,
                "warnings": self.warnings}


def redact(value: Any) -> Any:
    """Secret-wrapped values -> placeholder; integral floats -> ints (wire numbers are
    floats); everything else unchanged."""
    if isinstance(value, dict):
        if _SECRET_SIG in value:
            return _mask(value.get("value"))
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _mask(value: Any) -> Any:
    """Keep the shape of a secret value (a Secret's keys), never its content."""
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    return SECRET_PLACEHOLDER


def project_root(start: Optional[Path] = None) -> Path:
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "Pulumi.yaml").is_file() and (d / "__main__.py").is_file():
            return d
    raise FileNotFoundError(f"no Pulumi.yaml with __main__.py at or above {here}")


def load_config(stack: str, overrides: list[str], root: Path) -> tuple[dict, list[str]]:
    path = stack_file(stack, root)
    if not path.is_file():
        raise FileNotFoundError(f"--stack {stack}: no {path}; known stacks: {', '.join(stack_names(root))}")
    raw, secrets = read_stack_file(path)
    for assignment in overrides:
        apply_override(raw, assignment)
    # A secret given with --config is still a secret.
    secrets += [k for k in raw if k.rpartition(":")[2] in SECRET_KEYS and k not in secrets]
    # Templates carry no ciphertext: a render shows the API key it never needs as [secret];
    # the real CLI refuses the stack until `pulumi config set --secret k3:apiKey` ran.
    api_key = f"{CONFIG_NAMESPACE}:apiKey"
    if api_key not in raw:
        raw[api_key] = SECRET_PLACEHOLDER
        secrets.append(api_key)
    return raw, secrets


def run_program(stack: str, raw: dict, secret_keys: list[str], root: Path,
                mocks: Optional[Any] = None) -> Render:
    """Run `root/__main__.py` under the mock monitor; raise what the program raises."""
    # The Pulumi SDK here, not at the top: 0.18 s to import (python -X importtime), and
    # this module is loaded by commands that never render (`receipt list`, `weights
    # mirror --stack`, `engine plan`); the node pool's cluster access brings
    # pulumi-kubernetes as well.
    import pulumi
    from pulumi.runtime import config as runtime_config, mocks as pulumi_mocks, rpc
    from pulumi.runtime.proto import resource_pb2  # noqa: F401  (loads the protos)

    from k3infra.nodepool.cluster_access import RENDER_LOOKUPS

    result = Render(stack, raw, list(secret_keys))
    # The SDK's MockMonitor gives each executor thread it runs in an event loop of its own
    # and never closes them: after a refusal, interpreter exit then printed a traceback per
    # loop (BaseEventLoop.__del__). They are closed with the render's own loop.
    thread_loops: set = set()

    def _keep_thread_loop() -> None:
        try:
            thread_loops.add(asyncio.get_event_loop_policy().get_event_loop())
        except RuntimeError:    # this thread has none (the call did not need one)
            pass

    class Recorder(pulumi_mocks.MockMonitor):
        def Invoke(self, request):  # noqa: N802 (gRPC name)
            try:
                return super().Invoke(request)
            finally:
                _keep_thread_loop()

        def ReadResource(self, request):  # noqa: N802 (gRPC name)
            try:
                return super().ReadResource(request)
            finally:
                _keep_thread_loop()

        def RegisterResource(self, request):  # noqa: N802 (gRPC name)
            try:
                response = super().RegisterResource(request)
            finally:
                _keep_thread_loop()
            if request.type != "pulumi:pulumi:Stack":
                timeouts = request.customTimeouts
                result.resources.append({
                    "type": request.type, "name": request.name, "urn": response.urn,
                    "parent": request.parent or None,
                    # The provider reference ("<urn>::<id>") the resource was sent with.
                    "provider": request.provider or None,
                    "dependsOn": list(request.dependencies),
                    "customTimeouts": {k: getattr(timeouts, k) for k in ("create", "update", "delete")
                                       if getattr(timeouts, k)},
                    "inputs": redact(rpc.deserialize_properties(request.object)),
                })
            return response

    class Outputs(pulumi.runtime.Mocks):
        def new_resource(self, args):
            if mocks is not None:
                return mocks.new_resource(args)
            return f"{args.name}-id", dict(args.inputs)

        def call(self, args):
            if mocks is not None:
                return mocks.call(args)
            return dict(RENDER_LOOKUPS.get(args.token, {}))

    class Warnings(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                result.warnings.append(record.getMessage())

    logger = logging.getLogger(f"k3infra.render.{stack}")
    logger.propagate = False
    logger.handlers = [Warnings()]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        runtime_config.set_all_config(to_pulumi_config(raw), list(secret_keys))
        monitor_mocks = Outputs()
        pulumi.runtime.set_mocks(monitor_mocks, project=CONFIG_NAMESPACE, stack=stack, preview=False,
                                 logger=logger, monitor=Recorder(monitor_mocks))
        root_stack = pulumi.runtime.get_root_resource()
        exported: dict[str, tuple[Any, bool]] = {}

        # The SDK's public mock runner: it runs the program, waits for every registration
        # and for the Output it returns (the stack outputs, with their secret flags).
        @pulumi.runtime.test
        def program():
            # The render mode is handed to the program explicitly (a global of its run),
            # never through the environment: `pulumi up` cannot inherit it.
            runpy.run_path(str(root / "__main__.py"), run_name="__main__",
                           init_globals={RENDER_MODE_GLOBAL: "offline"})

            async def outputs() -> None:
                for key, value in (root_stack.outputs or {}).items():
                    out = pulumi.Output.from_input(value)
                    exported[key] = (await out.future(), await out.is_secret())
            return pulumi.Output.from_input(asyncio.ensure_future(outputs()))

        try:
            with origin.recording() as sources:
                program()
            result.sources = sources
        except pulumi.RunError as exc:
            # The program wraps k3infra's refusals for the CLI; a render raises the refusal.
            raise (exc.__cause__ or exc) from None
        for key, (value, secret) in exported.items():
            result.outputs[key] = SECRET_PLACEHOLDER if secret else redact(value)
    finally:
        runtime_config.set_all_config({}, [])
        for other in thread_loops - {loop}:
            if not other.is_running():
                other.close()
        loop.close()
        asyncio.set_event_loop(None)
    return result


def render_stack(stack: str, overrides: list[str] = (), root: Optional[Path] = None) -> Render:
    root = root or project_root()
    raw, secrets = load_config(stack, list(overrides), root)
    # Validate first: a clear ConfigError beats a traceback from inside the program.
    chosen = chosen_receipt(raw, root)
    parse_stack_config(raw, tuple(secrets), receipt=chosen.receipt)
    cwd = os.getcwd()
    os.chdir(root)       # relative paths in config (lock files) resolve like under `pulumi`
    try:
        render = run_program(stack, raw, secrets, root)
    finally:
        os.chdir(cwd)
    render.receipt = chosen
    return render


def _yaml_dumper():
    """safe_dump, with multi-line strings (nginx.conf, scripts) as literal blocks, so a
    rendered file reads like the file it holds."""
    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return Dumper


def write_render(render: Render, out: Path) -> list[Path]:
    """plan.json and manifests/*.yaml into `out` (podcommon.output_directory: a directory,
    never a link or a file), each file by the one output writer; OSError naming the path
    that is refused."""
    manifests = render.manifests()
    manifests_dir = out / "manifests"
    output_directory(out)
    if os.path.lexists(manifests_dir):
        output_directory(manifests_dir)       # a link or a file there is refused
        for old in manifests_dir.glob("*.yaml"):
            if old.is_file() and not old.is_symlink():
                old.unlink()
        # A render without Kubernetes objects (the Docker host) leaves no empty folder.
        if not manifests and not any(manifests_dir.iterdir()):
            manifests_dir.rmdir()
    if manifests:
        output_directory(manifests_dir)
    atomic_write_text(out / "plan.json", json.dumps(render.plan(), indent=2, sort_keys=False) + "\n")
    written = []
    for i, obj in enumerate(manifests, 1):
        name = obj.get("metadata", {}).get("name", "unnamed")
        path = manifests_dir / f"{i:03d}-{obj['kind'].lower()}-{name}.yaml"
        head = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
        atomic_write_text(path, yaml.dump({**head, **obj}, Dumper=_yaml_dumper(), sort_keys=False))
        written.append(path)
    return written
