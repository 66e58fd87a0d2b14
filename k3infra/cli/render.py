"""`k3infra render [--stack NAME] [--config KEY=VALUE ...] [--out DIR] [--show [CONTAINER]]`:
by default the `existing` stack (bring-your-own cluster) into build/render/<stack>/, as
`make render`. `--show` prints, instead of the summary, every container of the serving
pod, the prefetch Job and the benchmark Job as it will run, each line with its origin
(k3infra/containerview.py): a flag of render, not a command of its own, because the view
is of the same render that writes plan.json."""
from __future__ import annotations

import argparse
from collections import Counter

from rich.table import Table

from k3infra.cli import UsageError, flags
from k3infra.containerview import ViewError, show
from k3infra.config import ConfigError, parse_stack_config
from k3infra.display import console as literal_console, styled
from k3infra.hbm import HbmError
from k3infra.host import report
from k3infra.plan import resolve_plan
from k3infra.preflight import preflight_report
from k3infra.receipt import ReceiptError
# A module, not its names: tests replace project_root and render_stack on it.
from k3infra import render as rendering
from k3infra.summary import summary_rows
from k3infra.weights.lockcheck import load_stack_lock


DEFAULT_STACK = "existing"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", default=DEFAULT_STACK,
                        help=f"stacks/Pulumi.<stack>.yaml (default: {DEFAULT_STACK})")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="override a k3:* key (dotted paths for objects); repeatable")
    parser.add_argument("--out", type=flags.output_dir,
                        help="output directory (default: build/render/<stack>); a directory "
                        "or a new one, never a file or a link")
    parser.add_argument("--show", nargs="?", const="", metavar="CONTAINER",
                        help="print every container of the serving pod, the prefetch Job "
                        "and the benchmark Job as it will run (image, command, args, env), "
                        "each line with its origin; CONTAINER: only the containers of that "
                        "name (vllm, proxy, prefetch, bench, weights-gate)")
    parser.set_defaults(func=_render)


def _render(args: argparse.Namespace) -> int:
    console = literal_console()
    try:
        root = rendering.project_root()
        args.out = args.out or root / "build" / "render" / args.stack
        render = rendering.render_stack(args.stack, args.config, root)
    except (ConfigError, HbmError, FileNotFoundError, ReceiptError) as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # the program's own refusal, surfaced by the mock runtime
        cause = _root_cause(exc)
        if isinstance(cause, (ConfigError, HbmError)):
            raise UsageError(str(cause)) from None
        raise
    written = rendering.write_render(render, args.out)
    receipt = render.receipt.receipt
    cfg = parse_stack_config(render.raw_config, tuple(render.secret_keys), receipt=receipt)

    if args.show is not None:
        return _show(console, args, render, cfg, receipt)
    # The figures the summary and the preflight print, resolved once as the program did.
    plan = resolve_plan(receipt, cfg)
    if cfg.host is not None:          # one Docker host (k3infra/host)
        return _render_host(console, args, render, cfg, plan, root)

    table = Table(title=f"k3infra render: stack {args.stack}", show_header=False)
    for key, value in summary_rows(cfg, render, plan):
        table.add_row(key, value)
    console.print(table)
    counts = Table("resource type", "count", title="resources")
    for typ, n in sorted(Counter(r["type"] for r in render.resources).items()):
        counts.add_row(typ, str(n))
    console.print(counts)
    lock = load_stack_lock(receipt, cfg, root)
    for line in preflight_report(cfg, receipt, lock_total_bytes=lock.total_bytes if lock else None,
                                 fit=plan.fit):
        console.print(f"preflight {line}")
    parents = {r["urn"] for r in render.resources
               if r["type"] in ("k3infra:index:B300NodePool", "k3infra:index:ClusterAddons")}
    for res in render.resources:
        if res["parent"] in parents:
            inputs = res["inputs"]
            what = (f"{inputs['chart']} {inputs['version']} from {inputs['repositoryOpts']['repo']}"
                    if res["type"] == "kubernetes:helm.sh/v4:Chart" else res["name"])
            console.print(f"node pool: {res['type']} {what}")
    for warning in render.warnings:
        console.print(styled(("warning:", "yellow"), f" {warning}"))
    console.print("every container of the serving pod, the prefetch and benchmark Jobs as it "
                  "will run, each value with its origin: k3infra render --show")
    console.print(f"wrote {args.out / 'plan.json'} and {len(written)} manifests in "
                  f"{args.out / 'manifests'}")
    return 0


def _show(console, args, render, cfg, receipt) -> int:
    if cfg.host is not None:
        raise UsageError(f"--show prints the pods of a cluster stack; stack {args.stack} is "
                         f"one Docker host: `k3infra render --stack {args.stack}` lists its "
                         "containers and writes them to compose.yaml")
    try:
        lines = show(render, receipt.id, cfg.profile, args.show)
    except ViewError as exc:
        raise UsageError(str(exc)) from None
    for line in lines:
        console.print(line, soft_wrap=True)
    return 0


def _render_host(console, args, render, cfg, plan, root) -> int:
    receipt = plan.receipt
    table = Table(title=f"k3infra render: stack {args.stack} (one Docker host)", show_header=False)
    instance = report.rendered_instance(render)
    for key, value in summary_rows(cfg, render, plan,
                                   serve_line=report.rendered_serve_line(render, instance)):
        if key not in ("placement", "rollout", "weights storage"):
            table.add_row(key, value)
    table.add_row("endpoint", str(render.outputs.get("endpoint")))
    console.print(table)
    containers = Table("container", "image", "command", title="containers, in order")
    for row in report.container_rows(render):
        containers.add_row(*row)
    console.print(containers)
    lock = load_stack_lock(receipt, cfg, root)
    for line in report.preflight_lines(plan, cfg, lock.total_bytes if lock else None):
        console.print(f"preflight {line}")
    for warning in render.warnings:
        console.print(styled(("warning:", "yellow"), f" {warning}"))
    host = report.render_plan(plan, cfg, render, lock.text if lock else None)
    compose = report.write_compose(host, receipt, cfg, args.out)
    console.print(f"wrote {args.out / 'plan.json'} and {compose}")
    return 0


def _root_cause(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while exc.__cause__ is not None or exc.__context__ is not None:
        nxt = exc.__cause__ or exc.__context__
        if id(nxt) in seen:          # asyncio can chain an exception to itself
            break
        seen.add(id(nxt))
        exc = nxt
    return exc
