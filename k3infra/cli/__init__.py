"""`k3infra` command line. Thin: parse arguments, call the layers, print.

Each subcommand lives in its own module with `register(subparsers)`; only the module
named on the command line is imported, so a short command (`k3infra weights verify` of a
1.5 TB tree, `k3infra startup`) does not load the Pulumi SDK or the policy pack.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from k3infra.cli.flags import output_dir

COMMANDS = {
    "receipt": ("k3infra.cli.receipt", "show the measured serving receipt"),
    "render": ("k3infra.cli.render", "render a stack offline (Pulumi SDK mocks)"),
    "weights": ("k3infra.cli.weights", "weights lock / verify / prefetch"),
    "policy": ("k3infra.cli.policy", "run the policy pack over a render"),
    "bench": ("k3infra.cli.bench", "compare benchmark results with the receipt"),
    "accuracy": ("k3infra.cli.accuracy", "accuracy smoke test with lm-eval (run, compare, fetch)"),
    "verify": ("k3infra.cli.verify", "check a live deployment against the receipt"),
    "startup": ("k3infra.cli.startup", "the last cold start's phases against their budgets"),
    "engine": ("k3infra.cli.engine", "engine image: build args and plan from the receipt"),
    "pins": ("k3infra.cli.pins", "resolve, record and check every pin of a stack"),
}


class UsageError(Exception):
    """Bad input: printed as one clear line, exit status 2."""


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    """The cluster a command reads: your kubeconfig and context, as kubectl takes them."""
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")


def add_receipt_args(parser: argparse.ArgumentParser, *, stack: bool = True) -> None:
    """Which receipt a command judges against: --receipt (a shipped id or a file), or
    --stack (the receipt stacks/Pulumi.<stack>.yaml names in k3:receipt); neither: the
    receipt a stack naming none runs (the shipped default)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--receipt", metavar="ID|FILE",
                       help="a shipped receipt's id (k3infra receipt list) or a receipt file")
    if stack:
        group.add_argument("--stack", metavar="NAME",
                           help="the receipt the stack names (k3:receipt of "
                                "stacks/Pulumi.<NAME>.yaml)")


def stack_receipt_of(stack: str):
    """The ChosenReceipt stacks/Pulumi.<stack>.yaml names, resolved in this project."""
    # Here and in receipt_of and add_fetch_parser, not at the top: this module is loaded by
    # every command, and the config and receipt models load pydantic (k3infra.config with
    # it 0.24 s, k3infra.receipt 0.16 s, python -X importtime), which `weights verify`
    # never pays.
    from k3infra.config import ConfigError, chosen_receipt
    from k3infra.render import load_config, project_root

    root = project_root()
    try:
        raw, _secrets = load_config(stack, [], root)
        return chosen_receipt(raw, root)
    except (ConfigError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from None


def receipt_of(args: argparse.Namespace):
    """The ChosenReceipt of add_receipt_args' flags."""
    from k3infra.receipt import receipt_named, stack_receipt     # pydantic: see stack_receipt_of

    if getattr(args, "receipt", None):
        return receipt_named(args.receipt)
    if getattr(args, "stack", None):
        return stack_receipt_of(args.stack)
    return stack_receipt(None)


def add_fetch_parser(sub, what: str, image_default: str, func):
    """`fetch`: copy a client Job's run directory off its volume (bench and accuracy)."""
    from k3infra.naming import PROGRAM_INSTANCE     # loads k3infra.config: see stack_receipt_of

    fe = sub.add_parser("fetch", help=f"copy the {what}'s files from the cluster")
    fe.add_argument("--out", required=True, type=output_dir)
    fe.add_argument("--namespace", default=PROGRAM_INSTANCE)
    add_cluster_args(fe)
    fe.add_argument("--run", help="a run id (default: the latest complete run)")
    fe.add_argument("--image", help=f"image for the short-lived reader pod (default: {image_default})")
    fe.set_defaults(func=func)
    return fe


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="k3infra", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        # With a command named, only its parser is built: every other parser costs ~1 ms
        # (argparse looks up gettext catalogs) and imports its module.
        if only is None or name == only:
            importlib.import_module(module).register(sub.add_parser(name, help=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Text from files and servers may hold what the terminal's encoding cannot (a lone
    # surrogate from JSON): escaped when printed, never an encoding traceback.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    only = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(only).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"k3infra {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A file the command reads or writes (the one bounded reader or output writer
        # refused it, or the system did): one line naming it.
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"k3infra {args.command}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        # A file of a known format that is not one (k3infra.fileformats): one line.
        formats = sys.modules.get("k3infra.fileformats")
        if formats is not None and isinstance(exc, formats.FileFormatError):
            print(f"k3infra {args.command}: {exc}", file=sys.stderr)
            return 2
        # K3INFRA_RECEIPT (or --receipt) names a bad receipt: one line, like bad input.
        # Looked up, not imported: `weights verify` in a pod never loads pydantic.
        receipt = sys.modules.get("k3infra.receipt")
        if receipt is not None and isinstance(exc, receipt.ReceiptError):
            print(f"k3infra {args.command}: {exc}", file=sys.stderr)
            return 2
        # An API server that does not answer (verify, startup, fetch): one line naming it.
        urllib3 = sys.modules.get("urllib3.exceptions")
        if urllib3 is not None and isinstance(exc, urllib3.MaxRetryError):
            pool = getattr(exc, "pool", None)
            where = f"{pool.scheme}://{pool.host}:{pool.port}" if pool is not None else "?"
            reason = getattr(exc.reason, "args", [exc.reason])[-1] if exc.reason else exc
            reason = str(reason).rsplit(": ", 1)[-1]
            print(f"k3infra {args.command}: the cluster's API server at {where} did not answer "
                  f"({reason}); check --kubeconfig and --context", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
