"""`k3infra engine build-args` and `k3infra engine plan`: the receipt's engine build, for
building images/ by hand (docs/engine.md) or checking what a stack will run."""
from __future__ import annotations

import argparse
import json

from pydantic import ValidationError
from rich.table import Table

from k3infra.cli import add_receipt_args, UsageError, receipt_of
from k3infra.config import (ConfigError, EngineConfig, StackConfig, chosen_receipt,
                            parse_stack_config)
from k3infra.display import console, styled
from k3infra.engine.plan import build_args, resolve_engine
from k3infra.render import load_config, project_root


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="engine_command", required=True)
    args = sub.add_parser("build-args", help="the Dockerfile's build args, from the receipt")
    args.add_argument("--cpu", type=int, default=None, help="build node vCPUs (default: k3:engine.buildCpu's)")
    args.add_argument("--memory-gi", type=int, default=None, help="build node memory, GiB")
    args.add_argument("--format", choices=("docker", "env", "json"), default="docker",
                      help="docker: --build-arg K=V lines; env: K=V lines; json")
    add_receipt_args(args)
    args.set_defaults(func=_build_args)
    plan = sub.add_parser("plan", help="the engine a stack file resolves to")
    plan.add_argument("--stack", required=True, help="stacks/Pulumi.<stack>.yaml")
    plan.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    plan.set_defaults(func=_plan)


def _build_args(a: argparse.Namespace) -> int:
    engine = {}
    if a.cpu is not None:
        engine["buildCpu"] = a.cpu
    if a.memory_gi is not None:
        engine["buildMemoryGi"] = a.memory_gi
    try:
        cfg = StackConfig.model_construct(engine=EngineConfig.model_validate(engine))
        values = build_args(receipt_of(a).receipt, cfg)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    except ValidationError as exc:      # --cpu / --memory-gi out of range
        err = exc.errors()[0]
        raise UsageError(f"--{'cpu' if err['loc'][0] == 'buildCpu' else 'memory-gi'} = "
                         f"{err['input']!r}: {err['msg']}") from None
    if a.format == "json":
        print(json.dumps(values, indent=2))
    else:
        prefix = "--build-arg " if a.format == "docker" else ""
        for key, value in values.items():
            print(f"{prefix}{key}={value}")
    return 0


def _plan(a: argparse.Namespace) -> int:
    try:
        root = project_root()
        raw, secrets = load_config(a.stack, a.config, root)
        receipt = chosen_receipt(raw, root).receipt       # the stack's own (k3:receipt)
        plan = resolve_engine(receipt, parse_stack_config(raw, tuple(secrets), receipt=receipt))
    except (ConfigError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from None
    table = Table(title=f"engine: stack {a.stack}", show_header=False)
    table.add_row("label", plan.label if plan.measured else styled((plan.label, "bold red")))
    table.add_row("mode", plan.mode)
    table.add_row("image", plan.image or f"{plan.tagged_ref} -> pushed digest at `pulumi up`")
    for key, value in plan.build_args.items():
        table.add_row(f"build-arg {key}", value)
    console().print(table)
    return 0
