"""`k3infra receipt show`: print the measured receipt."""
from __future__ import annotations

import argparse


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="receipt_command", required=True)
    show = sub.add_parser("show", help="print the chosen receipt ($K3INFRA_RECEIPT, else the shipped one)")
    show.add_argument("--file", help="another receipt file of the same schema (default: $K3INFRA_RECEIPT, else the shipped one)")
    show.add_argument("--yaml", action="store_true", help="print the raw YAML")
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    from rich.table import Table

    from k3infra.display import console as literal_console, styled
    from k3infra.fileformats import read_text
    from k3infra.receipt import chosen_receipt_path, load_receipt

    r = load_receipt(args.file)          # a bad file: one line (ReceiptError), not a traceback
    if args.yaml:
        print(read_text(args.file or chosen_receipt_path(), "receipt"), end="")
        return 0
    console = literal_console()
    pins = Table(title=f"receipt {r.id} (measured {r.measured_on})", show_header=False)
    pins.add_row("model", f"{r.model.repo} ({r.model.quantization})")
    pins.add_row("weights", f"{r.model.shards} shards, {r.model.size_gb} GB, tree {r.model.tree_digest}")
    notes = ([f"PR {r.engine.pull_request}"] if r.engine.pull_request else []) + \
        ([f"excluded: {', '.join(r.engine.build_exclusions)}"] if r.engine.build_exclusions else [])
    pins.add_row("engine", f"{r.engine.name} {r.engine.version} @ {r.engine.commit}"
                 + (f" ({'; '.join(notes)})" if notes else ""))
    pins.add_row("hardware", f"{r.hardware.node}, {r.hardware.gpu_product_label}")
    pins.add_row("residency", f"{r.residency.weights_gib_per_gpu} GiB weights per GPU")
    pins.add_row("serve", "vllm serve " + " ".join(r.serve.engine_arg_tokens()))
    pins.add_row("env", " ".join(f"{k}={v}" for k, v in r.serve.engine_env_map().items()))
    w = r.workload_a
    pins.add_row("workload A", f"{w.description}; output <= {w.output_tokens_max}; "
                 f"concurrency {w.concurrencies}; {w.warmup_requests} warm-up + "
                 f"{w.measured_requests} measured")
    for m in r.measured:
        pins.add_row(f"measured c={m.concurrency}", f"{m.metric} p50 {m.p50_ms:g} ms / p99 {m.p99_ms:g} ms")
    pins.add_row("licence", f"{r.license.name}: {r.license.thresholds_text()}")
    console.print(pins)
    console.print(styled(("Not measured", "bold"), " (never implied):"))
    for item in r.not_measured:
        console.print(f"  - {item}")
    return 0
