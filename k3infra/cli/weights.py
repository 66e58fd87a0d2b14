"""`k3infra weights lock|verify|prefetch`: thin wrappers over the pod runtime.

The pods run the same runtime as `python3 -m k3weights`; this module imports nothing
heavy at load time and the verify path never loads pulumi, pydantic or yaml;
`rich` only dresses the output when a person is watching (a TTY).
Exit status: 0 success; 1 verification or prefetch failed (every bad path on stderr);
2 bad input (k3infra.cli.UsageError).
"""
from __future__ import annotations

import argparse
import sys


def register(parser: argparse.ArgumentParser) -> None:
    from k3infra.weights.__main__ import add_commands

    sub = parser.add_subparsers(dest="weights_command", metavar="COMMAND", required=True)
    commands = add_commands(sub)          # the pod runtime's own arguments, exactly
    commands["lock"].set_defaults(func=_lock)
    commands["verify"].set_defaults(func=_verify)
    commands["prefetch"].set_defaults(func=_prefetch)


class _Out:
    """Plain lines for logs; rich when stdout is a terminal (imported only then)."""

    def __init__(self) -> None:
        self.console = None
        if sys.stdout.isatty():
            from k3infra.display import console

            self.console = console()

    def line(self, text: str, style: str = "") -> None:
        if self.console is not None:
            self.console.print(text, style=style or None)
        else:
            print(text, flush=True)

    def problems(self, headline: str, problems) -> int:
        print(f"k3infra weights: {headline}", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        sys.stderr.flush()
        return 1


def _load(path: str):
    from k3infra.cli import UsageError
    from k3infra.weights import tree

    try:
        return tree.load_lock(path)
    except tree.LockError as exc:
        raise UsageError(str(exc)) from None


def _lock(args: argparse.Namespace) -> int:
    from k3infra.cli import UsageError
    from k3infra.weights import tree

    out = _Out()
    if bool(args.dir) == bool(args.hub):
        raise UsageError("give either a local DIR or --hub REPO (not both)")
    try:
        tree.output_target(args.out)      # refused before any work, not after
    except OSError as exc:
        raise UsageError(f"--out {tree.describe_oserror(exc)}") from None
    try:
        if args.hub:
            if not args.revision:
                raise UsageError("--hub needs --revision <40-hex commit> (a branch name moves)")
            from k3infra.weights.prefetch import lock_from_hub
            from k3infra.weights.sources import lock_client, lock_from_sources, parse_sources

            tree.check_repo(args.hub)
            tree.check_revision(args.revision)
            try:
                sources = parse_sources(args.sources)
            except ValueError as exc:
                raise UsageError(f"--sources: {exc}") from None
            client = lock_client(args)
            try:
                lock = lock_from_sources(
                    sources, args.hub, args.revision, emit=out.line, client=client,
                    hub_lock=lambda: lock_from_hub(args.hub, args.revision, emit=out.line,
                                                   client=client))
            except Exception as exc:    # the Hub's or a source's answer: one line
                first = (str(exc).strip().splitlines() or [""])[0]
                if not first.startswith(f"{args.hub}@"):
                    first = f"{args.hub}@{args.revision}: {first}"
                print(f"k3infra weights lock: {first}", file=sys.stderr)
                return 1
        else:
            from k3infra.weights.verify import lock_from_dir

            revision = args.revision or tree.revision_from_hf_metadata(args.dir)
            if not revision:
                raise UsageError(f"{args.dir}: no --revision given and none recorded by huggingface_hub "
                                 "in the tree; pass --revision <40-hex commit>")
            repo = args.repo
            if not repo:
                from k3infra.receipt import load_receipt

                repo = load_receipt().model.repo
            lock = lock_from_dir(args.dir, repo, revision, workers=args.workers, emit=out.line)
    except tree.LockError as exc:
        raise UsageError(str(exc)) from None
    try:
        tree.atomic_write(args.out, tree.lock_to_json(lock).encode("utf-8"))
    except OSError as exc:      # the one output writer's refusal (a device, a FIFO...)
        raise UsageError(f"--out {tree.describe_oserror(exc)}") from None
    out.line(f"lock {args.out}: {lock.repo}@{lock.revision}, {len(lock.files)} files, "
             f"{lock.total_bytes} bytes, {lock.tree_digest}")
    from k3infra.receipt import load_receipt
    from k3infra.weights.lockcheck import compare_with_receipt

    verdict = compare_with_receipt(lock, load_receipt().model.tree_digest)
    out.line("matches the receipt's measured tree" if verdict is True
             else f"note: {verdict} (serving it needs k3:profile custom)",
             "green" if verdict is True else "yellow")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from k3infra.weights import tree, verify

    out = _Out()
    lock, _sha = _load(args.lock)
    if args.require_marker:
        problem = verify.marker_problem(args.dir, lock)
        if problem:
            return out.problems(f"{args.dir} is not a verified tree",
                                [tree.Problem(tree.MARKER_NAME, problem)])
    report = verify.verify_tree(args.dir, lock, workers=args.workers, emit=out.line)
    out.line(report.summary(), "green" if report.ok else "red")
    if not report.ok:
        return out.problems(f"verify FAILED: {len(report.problems)} offending path(s) in {args.dir} "
                            f"against {args.lock}", report.problems)
    return 0


def _prefetch(args: argparse.Namespace) -> int:
    from k3infra.weights import prefetch

    out = _Out()
    lock, lock_sha = _load(args.lock)
    if args.expect_digest and lock.tree_digest != args.expect_digest:
        return out.problems(f"not the measured tree: {args.lock} describes {lock.tree_digest}, "
                            f"expected {args.expect_digest}", [])
    try:
        from k3infra.weights.sources import parse_sources

        report = prefetch.prefetch(lock, lock_sha, args.dest, workers=args.workers,
                                   download_workers=args.max_download_workers,
                                   overlap=not args.no_overlap, attempts=args.attempts, emit=out.line,
                                   sources=parse_sources(args.sources))
    except ValueError as exc:
        from k3infra.cli import UsageError

        raise UsageError(str(exc)) from None
    for note in report.notes:
        print(f"k3infra weights: note: {note}", file=sys.stderr)
    out.line(report.summary(), "green" if report.ok else "red")
    if not report.ok:
        return out.problems(f"prefetch FAILED: {len(report.problems)} problem(s) in {args.dest}; "
                            "no marker written", report.problems)
    return 0
