"""`k3infra weights lock|verify|prefetch`: thin wrappers over the pod runtime.

`verify` runs as an init container on every serving pod start, so this module imports
nothing heavy at load time and the verify path never loads pulumi, pydantic or yaml;
`rich` only dresses the output when a person is watching (a TTY).
Exit status: 0 success; 1 verification or prefetch failed (every bad path on stderr);
2 bad input (k3infra.cli.UsageError).
"""
from __future__ import annotations

import argparse
import sys


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive integer")
    return value


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="weights_command", metavar="COMMAND", required=True)

    lock = sub.add_parser("lock", help="write a k3-tree-v1 lock from a local tree or from Hub metadata")
    lock.add_argument("dir", nargs="?", help="local tree to hash (omit with --hub)")
    lock.add_argument("--hub", metavar="REPO", help="build the lock from Hub metadata (no shard download)")
    lock.add_argument("--repo", help="repo recorded for a local tree (default: the receipt's model repo)")
    lock.add_argument("--revision", help="40-hex commit (local tree: default from huggingface_hub's "
                      "local-dir metadata)")
    lock.add_argument("--out", required=True, help="lock file to write (atomically)")
    lock.add_argument("--workers", type=_positive, help="hashing threads (default: usable CPUs)")
    lock.set_defaults(func=_lock)

    ver = sub.add_parser("verify", help="verify a tree against its lock (exit 0 only on an exact match)")
    ver.add_argument("dir")
    ver.add_argument("--lock", required=True)
    ver.add_argument("--full", action="store_true", help="ignore stamps: re-hash every file")
    ver.add_argument("--workers", type=_positive, help="hashing threads (default: usable CPUs)")
    ver.add_argument("--require-marker", action="store_true",
                     help="also require the prefetch marker naming this lock's digest and revision")
    ver.set_defaults(func=_verify)

    pre = sub.add_parser("prefetch", help="download the locked tree, verify as files land, write the marker")
    pre.add_argument("--lock", required=True)
    pre.add_argument("--dest", required=True)
    pre.add_argument("--workers", type=_positive, help="hashing threads (default: usable CPUs)")
    pre.add_argument("--max-download-workers", type=_positive, default=8, help="files at once (default 8)")
    pre.add_argument("--no-overlap", action="store_true", help="hash only after all downloads finished")
    pre.add_argument("--attempts", type=_positive, default=3, help="downloads per file at most (default 3)")
    pre.set_defaults(func=_prefetch)


class _Out:
    """Plain lines for logs; rich when stdout is a terminal (imported only then)."""

    def __init__(self) -> None:
        self.console = None
        if sys.stdout.isatty():
            from rich.console import Console

            self.console = Console(highlight=False)

    def line(self, text: str, style: str = "") -> None:
        if self.console is not None:
            self.console.print(text, style=style or None, markup=False)
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
        if args.hub:
            if not args.revision:
                raise UsageError("--hub needs --revision <40-hex commit> (a branch name moves)")
            from k3infra.weights.prefetch import lock_from_hub

            try:
                lock = lock_from_hub(args.hub, args.revision, emit=out.line)
            except tree.LockError:
                raise
            except Exception as exc:    # the Hub's answer: not found, gated, offline...
                first = (str(exc).strip().splitlines() or [""])[0]
                print(f"k3infra weights lock: {args.hub}@{args.revision}: {type(exc).__name__}: {first}",
                      file=sys.stderr)
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
    tree.atomic_write(args.out, tree.lock_to_json(lock).encode("utf-8"))
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
    report = verify.verify_tree(args.dir, lock, full=args.full, workers=args.workers, emit=out.line)
    if report.state_note:
        print(f"k3infra weights: note: {report.state_note}", file=sys.stderr)
    out.line(report.summary(), "green" if report.ok else "red")
    if not report.ok:
        return out.problems(f"verify FAILED: {len(report.problems)} offending path(s) in {args.dir} "
                            f"against {args.lock}", report.problems)
    return 0


def _prefetch(args: argparse.Namespace) -> int:
    from k3infra.weights import prefetch

    out = _Out()
    lock, lock_sha = _load(args.lock)
    try:
        report = prefetch.prefetch(lock, lock_sha, args.dest, workers=args.workers,
                                   download_workers=args.max_download_workers,
                                   overlap=not args.no_overlap, attempts=args.attempts, emit=out.line)
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
