"""`k3infra policy check DIR [--policy-config FILE]` and `k3infra policy list`."""
from __future__ import annotations

import argparse
from pathlib import Path

from pulumi_policy import StackValidationPolicy
from rich.table import Table

from k3infra.cli import UsageError
from k3infra.display import console as literal_console, styled, console
from k3infra.policies import POLICIES, level
from k3infra.policies.runner import PolicyRunError, check_plan, load_plan, load_policy_config


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="policy_command", metavar="SUBCOMMAND", required=True)
    check = sub.add_parser("check", help="run the policy pack over a render's plan.json; exit 1 "
                                         "on any mandatory violation")
    check.add_argument("dir", type=Path, help="a `k3infra render --out` directory (or plan.json)")
    check.add_argument("--policy-config", type=Path, metavar="FILE",
                       help="JSON in the form of `pulumi preview --policy-pack-config`: "
                            '{"<policy>"|"all": "<level>" | {"enforcementLevel": ..., ...}}')
    check.set_defaults(func=_check)
    listing = sub.add_parser("list", help="the pack's policies, levels and descriptions")
    listing.set_defaults(func=_list)


def _check(args: argparse.Namespace) -> int:
    pack_config = None
    if args.policy_config is not None:
        try:
            pack_config = load_policy_config(args.policy_config)
        except ValueError as exc:      # FileFormatError: the file and the field, one line
            raise UsageError(f"--policy-config {exc}") from None
    try:
        plan = load_plan(args.dir)
        report = check_plan(plan, pack_config=pack_config)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    except PolicyRunError as exc:
        # A plan no render writes can make a policy raise: refused, never a pass.
        raise UsageError(f"{args.dir}: not a plan the pack can judge ({exc})"[:2000]) from None

    console = literal_console()
    title = (f"k3infra policy check: stack {report.stack or '?'} — {len(report.policies)} "
             f"policies over {report.resources} resources")
    if report.findings:
        table = Table(title=title, show_lines=True)
        table.add_column("policy", no_wrap=True)
        table.add_column("level", no_wrap=True)
        table.add_column("resource", overflow="fold", max_width=28)
        table.add_column("message", ratio=1)
        for f in sorted(report.findings, key=lambda f: (f.level != "mandatory", f.policy)):
            style = "bold red" if f.level == "mandatory" else "yellow"
            table.add_row(f.policy, styled((f.level, style)), f.resource, f.message)
        console.print(table)
    else:
        console.print(f"{title}: no violations")
    mandatory = report.mandatory
    console.print(f"{len(mandatory)} mandatory, {len(report.advisory)} advisory violation(s)")
    if mandatory:
        names = sorted({f.policy for f in mandatory})
        console.print(styled(("FAILED", "bold red"), f": {', '.join(names)}"))
        return 1
    return 0


def _list(args: argparse.Namespace) -> int:
    table = Table(title="k3infra policy pack", show_lines=True)
    table.add_column("policy", no_wrap=True)
    table.add_column("level / scope / config", max_width=22)
    table.add_column("why", ratio=1)
    for p in POLICIES:
        config = ", ".join(p.config_schema.properties) if p.config_schema else "-"
        scope = "stack" if isinstance(p, StackValidationPolicy) else "resource"
        table.add_row(p.name, f"{level(p).value}\n{scope}\nconfig: {config}", p.description)
    console().print(table)
    return 0
