"""`k3infra receipt list | show | diff`: the receipts a stack can name, one of them whole,
and what changes from one to the next (a table for people, --json for CI).

diff  exit 0 when the two receipts are the same, 1 when they differ (as diff(1)), 2 on
      a receipt that cannot be read.
"""
from __future__ import annotations

import argparse
import json

from rich.table import Table

from k3infra.cli import add_receipt_args, receipt_of
from k3infra.config import read_stack_file, stack_file, stack_names
from k3infra.display import console as literal_console, styled
from k3infra.fileformats import read_text
from k3infra.receipt import (DEFAULT_RECEIPT, NOTHING_MEASURED, Receipt, receipt_named,
                             shipped_receipts)
from k3infra.receipt.diff import diff_receipts


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="receipt_command", required=True)
    ls = sub.add_parser("list", help="the receipts shipped in the package and which one each "
                        "stack file names")
    ls.add_argument("--json", action="store_true", help="one JSON document")
    ls.set_defaults(func=_list)
    show = sub.add_parser("show", help="print one receipt (default: the shipped default)")
    add_receipt_args(show)
    show.add_argument("--yaml", action="store_true", help="print the raw YAML")
    show.add_argument("--json", action="store_true", help="print it as JSON")
    show.set_defaults(func=_show)
    diff = sub.add_parser("diff", help="every difference from receipt A to receipt B")
    diff.add_argument("a", metavar="A", help="a shipped receipt's id or a receipt file")
    diff.add_argument("b", metavar="B", help="a shipped receipt's id or a receipt file")
    diff.add_argument("--json", action="store_true", help="the differences as JSON rows")
    diff.set_defaults(func=_diff)


def _figures(r: Receipt) -> str:
    if r.is_candidate:
        return f"candidate: {NOTHING_MEASURED}"
    return "; ".join(f"c={m.concurrency} {m.metric} p50 {m.p50_ms:g} / p99 {m.p99_ms:g} ms"
                     for m in r.measured)


def _list(args: argparse.Namespace) -> int:
    # Here, not at the top: k3infra.render brings asyncio, ssl and subprocess (+0.05 s,
    # python -X importtime), which `receipt show` and `diff` do not need.
    from k3infra.render import project_root

    rows = []
    for rid in shipped_receipts():
        r = receipt_named(rid).receipt
        rows.append({"id": r.id, "status": r.status, "engine": r.engine.describe(),
                     "figures": _figures(r), "sha256": r.sha256()})
    stacks = {}
    try:
        root = project_root()
    except FileNotFoundError:      # outside a project: only the shipped receipts
        root = None
    for name in (stack_names(root) if root else []):
        raw, _ = read_stack_file(stack_file(name, root))
        named = raw.get("k3:receipt", raw.get("receipt"))
        stacks[name] = named if isinstance(named, str) else None
    if args.json:
        print(json.dumps({"receipts": rows, "stacks": stacks}, indent=2))
        return 0
    console = literal_console()
    table = Table("id", "status", "engine", "measured", title="shipped receipts")
    for row in rows:
        table.add_row(row["id"], row["status"], row["engine"], row["figures"])
    console.print(table)
    if stacks:
        named = Table("stack", "k3:receipt", title="what each stack file names")
        for name, rid in stacks.items():
            named.add_row(name, rid or f"(unset: {DEFAULT_RECEIPT})")
        console.print(named)
    return 0


def _show(args: argparse.Namespace) -> int:
    chosen = receipt_of(args)          # a bad file: one line (ReceiptError), not a traceback
    r = chosen.receipt
    if args.yaml:
        print(read_text(chosen.path, "receipt"), end="")
        return 0
    if args.json:
        print(json.dumps({**chosen.record(), "receipt": r.model_dump(mode="json", by_alias=True)},
                         indent=2))
        return 0
    console = literal_console()
    pins = Table(title=f"receipt {r.id} ({r.standing()})", show_header=False)
    if r.source:
        pins.add_row("source", r.source)
    pins.add_row("model", f"{r.model.repo} ({r.model.quantization})")
    pins.add_row("weights", f"{r.model.shards} shards, {r.model.size_gb} GB, tree {r.model.tree_digest}")
    notes = ([f"PR {r.engine.pull_request}"] if r.engine.pull_request else []) + \
        ([f"excluded: {', '.join(r.engine.build_exclusions)}"] if r.engine.build_exclusions else [])
    pins.add_row("engine", r.engine.describe() + (f" ({'; '.join(notes)})" if notes else ""))
    pins.add_row("hardware", f"{r.hardware.node}, {r.hardware.gpu_product_label}")
    pins.add_row("residency", f"{r.residency.weights_gib_per_gpu} GiB weights per GPU")
    if r.kv_cache:
        pins.add_row("kv cache", f"{r.kv_cache.dtype}, at most {r.kv_cache.bytes_per_token_max} B "
                     f"per token ({r.kv_cache.basis})")
    pins.add_row("serve", "vllm serve " + " ".join(r.serve.engine_arg_tokens()))
    pins.add_row("env", " ".join(f"{k}={v}" for k, v in r.serve.engine_env_map().items()))
    w = r.workload_a
    pins.add_row("workload A", f"{w.description}; output <= {w.output_tokens_max}; "
                 f"concurrency {w.concurrencies}; {w.warmup_requests} warm-up + "
                 f"{w.measured_requests} measured")
    if r.is_candidate:
        pins.add_row("measured", f"candidate: {NOTHING_MEASURED}")
    for m in r.measured:
        pins.add_row(f"measured c={m.concurrency}", f"{m.metric} p50 {m.p50_ms:g} ms / p99 {m.p99_ms:g} ms")
    pins.add_row("sha256", f"{chosen.sha256} (content; chosen by {chosen.chosen_by})")
    pins.add_row("licence", f"{r.license.name}: {r.license.thresholds_text()}")
    console.print(pins)
    console.print(styled(("Not measured", "bold"), " (never implied):"))
    for item in r.not_measured:
        console.print(f"  - {item}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    a, b = receipt_named(args.a, "A").receipt, receipt_named(args.b, "B").receipt
    changes = diff_receipts(a, b)
    if args.json:
        print(json.dumps({"a": a.identity(), "b": b.identity(),
                          "changes": [c.as_dict() for c in changes]}, indent=2))
        return 1 if changes else 0
    console = literal_console()
    if not changes:
        console.print(f"receipts {a.id} and {b.id} are the same (sha256 {a.sha256()})")
        return 0
    table = Table("area", "item", "change", f"A: {a.id}", f"B: {b.id}",
                  title=f"receipt diff: {len(changes)} difference(s)")
    for c in changes:
        table.add_row(c.area, c.item, c.kind, c.a or "-", c.b or "-")
    console.print(table)
    return 1
