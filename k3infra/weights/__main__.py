"""`python3 -m k3weights lock|verify|prefetch ...`: the weights runtime's command line in pods.

Plain-text progress on stdout, every problem on stderr (one line per offending path).
Exit status: 0 exact match (and marker written, for prefetch); 1 verification or
prefetch failed; 2 bad arguments or a malformed lock.
"""
from __future__ import annotations

import argparse
import os
import sys

from . import gate, tree, verify

# .prefetch and .sources are imported by the commands that download (lock --hub,
# prefetch), not here: they bring the HTTP client (http.client, ssl, email, logging:
# +0.05 s, python -X importtime), which `verify` and `gate` never use.

PROG = f"python3 -m {__package__ or 'k3weights'}"


# Bounded like the stack keys they mirror: a thread or attempt count is at most 1024.
MAX_COUNT = 1024


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be an integer from 1 to "
                                         f"{MAX_COUNT}") from None
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be an integer from 1 to {MAX_COUNT}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be a number of seconds, more than "
                                         "0 and at most 86400")
    return value


def add_commands(sub) -> dict[str, argparse.ArgumentParser]:
    """The lock / verify / prefetch subcommands and their arguments, on `sub` (an
    argparse subparsers object). The `k3infra weights` CLI adds the same ones and only
    swaps the handlers, so both command lines accept exactly the same arguments."""
    lock = sub.add_parser("lock", help="write a k3-tree-v1 lock from a local tree or from Hub metadata")
    lock.add_argument("dir", nargs="?", help="local tree to hash (omit with --hub)")
    lock.add_argument("--hub", metavar="REPO", help="build the lock from Hub metadata (no shard download)")
    lock.add_argument("--sources", help="with --hub: take the lock from these sources in order "
                      "(comma-separated: 'hub' or an in-cluster source's http:// URL; default hub)")
    lock.add_argument("--repo", help="repo recorded for a local tree")
    lock.add_argument("--revision", help="40-hex commit (for a local tree: inferred from "
                      "huggingface_hub's local-dir metadata when present)")
    lock.add_argument("--out", required=True, help="lock file to write (atomically)")
    lock.add_argument("--workers", type=_positive, help="hashing threads (default: usable CPUs)")
    lock.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                      help="with --hub: every request of the command ends by then (default "
                      "900; each request within 60)")
    lock.set_defaults(func=_lock)

    ver = sub.add_parser("verify", help="verify a tree against its lock (exit 0 only on an exact match)")
    ver.add_argument("dir")
    ver.add_argument("--lock", required=True)
    ver.add_argument("--full", action="store_true",
                     help="re-hash every file (always the case: no stamp on the volume is trusted)")
    ver.add_argument("--workers", type=_positive, help="hashing threads (default: usable CPUs)")
    ver.add_argument("--require-marker", action="store_true",
                     help="also require the prefetch's marker naming this lock's digest and revision")
    ver.set_defaults(func=_verify)

    add_gate_command(sub)

    pre = sub.add_parser("prefetch", help="download the locked tree, verify as files land, write the marker")
    pre.add_argument("--lock", required=True)
    pre.add_argument("--dest", required=True)
    pre.add_argument("--workers", type=_positive, help="hashing threads (default: usable CPUs)")
    pre.add_argument("--max-download-workers", type=_positive, default=8,
                     help="files downloaded at once (default 8)")
    pre.add_argument("--no-overlap", action="store_true",
                     help="hash only after all downloads finished (for comparison)")
    pre.add_argument("--attempts", type=_positive, default=3, help="downloads per file at most (default 3)")
    pre.add_argument("--expect-digest", help="refuse a lock whose tree digest is not this one")
    pre.add_argument("--sources", help="where bytes come from, tried in order per file "
                     "(comma-separated: 'hub' or an in-cluster source's http:// URL; default hub)")
    pre.set_defaults(func=_prefetch)
    return {"lock": lock, "verify": ver, "prefetch": pre}


def add_gate_command(sub) -> argparse.ArgumentParser:
    """`gate`: what runs before every `vllm serve` start (k3weights.gate)."""
    gate = sub.add_parser("gate", help="before vLLM starts: the pinned lock (read once) and a full "
                          "read-and-hash of the tree (or this pod's own stamps)")
    gate.add_argument("dir")
    gate.add_argument("--lock", required=True, help="lock file (read once)")
    gate.add_argument("--expect-digest", required=True,
                      help="tree digest the stack pins (sha256:<64 hex>); a lock with another is refused")
    gate.add_argument("--repo", required=True)
    gate.add_argument("--revision", required=True)
    gate.add_argument("--mode", default="warm", choices=("warm", "stamps"),
                      help="warm: full read-and-hash on every start (default); stamps: full at "
                      "the pod's first start, then this pod's own stamps from --state-dir")
    gate.add_argument("--state-dir", help="pod-private directory for stamps mode (an emptyDir)")
    gate.add_argument("--workers", type=_positive, help="hashing threads (default: usable CPUs)")
    gate.add_argument("--require-marker", action="store_true",
                      help="also refuse unless the prefetch's marker names the pinned tree "
                      "(the in-cluster source's start check)")
    gate.set_defaults(func=_gate)
    return gate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    return parser


def _out(line: str) -> None:
    print(line, flush=True)


def _fail(command: str, problems, summary: str = "") -> int:
    print(f"{PROG} {command}: {summary or 'FAILED'}", file=sys.stderr)
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    sys.stderr.flush()
    return 1


def _lock(args: argparse.Namespace) -> int:
    if bool(args.dir) == bool(args.hub):
        raise tree.LockError("give either a local DIR or --hub REPO (not both)")
    try:
        tree.output_target(args.out)      # refused before any work, not after
    except OSError as exc:
        raise tree.LockError(f"--out {tree.describe_oserror(exc)}") from None
    if args.hub:
        from . import prefetch, sources as sources_mod      # the HTTP client: see the top

        if not args.revision:
            raise tree.LockError("--hub needs --revision <40-hex commit>")
        client = sources_mod.lock_client(args)
        lock = sources_mod.lock_from_sources(
            sources_mod.parse_sources(args.sources), args.hub, args.revision, emit=_out,
            client=client, hub_lock=lambda: prefetch.lock_from_hub(
                args.hub, args.revision, emit=_out, client=client))
    else:
        revision = args.revision or tree.revision_from_hf_metadata(args.dir)
        if not revision:
            raise tree.LockError(f"{args.dir}: no --revision given and none recorded by "
                                 "huggingface_hub in the tree; pass --revision <40-hex commit>")
        if not args.repo:
            raise tree.LockError("a local tree needs --repo <owner>/<name>")
        lock = verify.lock_from_dir(args.dir, args.repo, revision, workers=args.workers, emit=_out)
    try:
        tree.atomic_write(args.out, tree.lock_to_json(lock).encode("utf-8"))
    except OSError as exc:      # the one output writer's refusal (a device, a FIFO...)
        raise tree.LockError(f"--out {tree.describe_oserror(exc)}") from None
    _out(f"lock: {lock.repo}@{lock.revision}: {len(lock.files)} files, {lock.total_bytes} bytes, "
         f"{lock.tree_digest} -> {args.out}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    lock, _sha = tree.load_lock(args.lock)
    if args.require_marker:
        problem = verify.marker_problem(args.dir, lock)
        if problem:
            # Fail fast: without a marker the prefetch has not finished; do not hash.
            return _fail("verify", [tree.Problem(tree.MARKER_NAME, problem)],
                         f"FAILED: {args.dir} is not a verified tree")
    report = verify.verify_tree(args.dir, lock, workers=args.workers, emit=_out)
    if not report.ok:
        _out(report.summary())
        return _fail("verify", report.problems, f"FAILED: {len(report.problems)} offending path(s) "
                     f"in {args.dir} against {args.lock}")
    _out(report.summary())
    return 0


def _gate(args: argparse.Namespace) -> int:
    try:
        report = gate.run_gate(args.dir, args.lock, expect_digest=args.expect_digest,
                               repo=args.repo, revision=args.revision, mode=args.mode,
                               state_dir=args.state_dir, workers=args.workers, emit=_out,
                               require_marker=args.require_marker)
    except gate.GateRefused as exc:
        print(f"{PROG} gate: REFUSED: {exc}", file=sys.stderr)
        return 1
    _out(report.summary().replace("verify", f"gate ({args.mode})", 1))
    if not report.ok:
        return _fail("gate", report.problems, f"REFUSED: {len(report.problems)} offending "
                     f"path(s) in {args.dir}; vLLM does not start")
    return 0


def _prefetch(args: argparse.Namespace) -> int:
    from . import prefetch, sources as sources_mod      # the HTTP client: see the top

    sources = sources_mod.parse_sources(args.sources)
    lock, lock_sha = tree.load_lock(args.lock)
    if args.expect_digest and lock.tree_digest != args.expect_digest:
        raise tree.LockError(f"not the measured tree: lock {args.lock} describes "
                             f"{lock.tree_digest}, the stack pins {args.expect_digest}")
    report = prefetch.prefetch(lock, lock_sha, args.dest, workers=args.workers,
                               download_workers=args.max_download_workers,
                               overlap=not args.no_overlap, attempts=args.attempts, emit=_out,
                               sources=sources)
    _out(report.summary())
    if not report.ok:
        return _fail("prefetch", report.problems, f"FAILED: {len(report.problems)} problem(s) "
                     f"in {args.dest}; no marker written")
    return 0


def main(argv: list | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except tree.LockError as exc:
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:           # e.g. a malformed K3_WEIGHTS_FREE_BYTES
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:   # the Hub's errors (repo not found, gated, offline...)
        if os.environ.get("K3_WEIGHTS_DEBUG"):
            raise
        print(f"{PROG} {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
