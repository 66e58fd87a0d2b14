"""`k3infra weights lock|verify|prefetch|mirror`: thin wrappers over the pod runtime, and
the mirror into your object store (k3infra/weights/mirror.py).

The pods run the same runtime as `python3 -m k3weights`; this module imports nothing
heavy at load time and the verify path never loads pulumi, pydantic or yaml;
`rich` only dresses the output when a person is watching (a TTY).
Exit status: 0 success; 1 verification or prefetch failed (every bad path on stderr);
2 bad input (k3infra.cli.UsageError).
"""
from __future__ import annotations

import argparse
import os
import sys

from k3infra.cli import UsageError, flags
# Modules, not their names, where tests replace a function (verify.lock_from_dir).
from k3infra.weights import tree, verify
from k3infra.weights.__main__ import add_commands

# Imported by the commands that download (lock --hub, prefetch, mirror), not here:
# k3infra.weights.prefetch, .sources and .store bring the HTTP client (http.client, ssl,
# email, logging: +0.05 s, python -X importtime, twice what `weights verify` takes to
# load), which `weights verify` never uses.


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="weights_command", metavar="COMMAND", required=True)
    commands = add_commands(sub)          # the pod runtime's own arguments, exactly
    commands["lock"].set_defaults(func=_lock)
    commands["verify"].set_defaults(func=_verify)
    commands["prefetch"].set_defaults(func=_prefetch)
    add_mirror_command(sub)


def add_mirror_command(sub) -> None:
    mi = sub.add_parser("mirror", help="copy the pinned tree (Hub or a local tree) into your object "
                        "store, verified against the lock; the lock beside it")
    mi.add_argument("dir", nargs="?", help="a local tree to upload (with --lock); omit to take the "
                    "files from the Hub")
    mi.add_argument("--to", metavar="URL", type=flags.url,
                    help="s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX] or az://ACCOUNT/CONTAINER[/PREFIX] "
                    "(k3:weights.store.url)")
    mi.add_argument("--stack", help="take the store, the revision and the lock from this stack "
                    "(k3:weights.store, k3:weightsRevision, k3:weights.lockFile; the receipt's "
                    "repo) instead of --to and the flags below")
    mi.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                    help="with --stack: override a key, as `k3infra render --config` does")
    mi.add_argument("--lock", help="the lock to mirror (default: built from Hub metadata at --revision)")
    mi.add_argument("--hub", metavar="REPO", help="the Hub repo (default: the receipt's model)")
    mi.add_argument("--revision", help="40-hex commit (default: the lock's)")
    mi.add_argument("--endpoint", type=flags.url, help="an S3-compatible, GCS or Azure endpoint (k3:weights.store.endpoint)")
    mi.add_argument("--region", type=flags.mirrors("StoreConfig", "region", "k3:weights.store.region"),
                    help="the S3 region (k3:weights.store.region)")
    mi.add_argument("--allow-http", action="store_true", help="allow a plain-HTTP endpoint")
    mi.add_argument("--virtual-hosted", action="store_true",
                    help="S3: the bucket in the host name (the endpoint is https://BUCKET.host)")
    mi.add_argument("--check", action="store_true",
                    help="read and hash every object already in the store (default: trust the "
                    "k3sha256 metadata this command writes; others are read)")
    mi.add_argument("--dry-run", action="store_true",
                    help="report what does not match the lock; upload nothing (exit 1 if anything)")
    # No key sets the mirror's parallelism: bounded like k3:weights.hashWorkers (files
    # hashed at once), since every file is hashed before its upload.
    mi.add_argument("--workers", type=flags.count_from(1, 256), default=4,
                    help="files judged or uploaded at once (default 4, at most 256)")
    mi.add_argument("--timeout", type=flags.seconds, default=None, metavar="SECONDS",
                    help="every Hub read of the command ends by then (default a day; one file "
                    "within a minute plus its size at 1 MiB/s)")
    mi.add_argument("--staging", help="where Hub files wait for their upload (default: a temporary "
                    "directory; each file is deleted once uploaded)")
    mi.set_defaults(func=_mirror)


class _Out:
    """Plain lines for logs; rich when stdout is a terminal (imported only then)."""

    def __init__(self) -> None:
        self.console = None
        if sys.stdout.isatty():
            # Here, not at the top: k3infra.display brings typing (and rich once called),
            # which the verify path in every pod's gate must not load (issue 18: ~25 ms of
            # start-up; tests/test_weights_runtime.py holds it to that).
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
    try:
        return tree.load_lock(path)
    except tree.LockError as exc:
        raise UsageError(str(exc)) from None


def _lock(args: argparse.Namespace) -> int:
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
            # The HTTP client: see the top.
            from k3infra.weights import prefetch, sources as sources_mod

            tree.check_repo(args.hub)
            tree.check_revision(args.revision)
            try:
                sources = sources_mod.parse_sources(args.sources)
            except ValueError as exc:
                raise UsageError(f"--sources: {exc}") from None
            client = sources_mod.lock_client(args)
            try:
                lock = sources_mod.lock_from_sources(
                    sources, args.hub, args.revision, emit=out.line, client=client,
                    hub_lock=lambda: prefetch.lock_from_hub(args.hub, args.revision, emit=out.line,
                                                            client=client))
            except Exception as exc:    # the Hub's or a source's answer: one line
                first = (str(exc).strip().splitlines() or [""])[0]
                if not first.startswith(f"{args.hub}@"):
                    first = f"{args.hub}@{args.revision}: {first}"
                print(f"k3infra weights lock: {first}", file=sys.stderr)
                return 1
        else:
            revision = args.revision or tree.revision_from_hf_metadata(args.dir)
            if not revision:
                raise UsageError(f"{args.dir}: no --revision given and none recorded by huggingface_hub "
                                 "in the tree; pass --revision <40-hex commit>")
            repo = args.repo
            if not repo:
                repo = _shipped_receipt().model.repo
            lock = verify.lock_from_dir(args.dir, repo, revision, workers=args.workers, emit=out.line)
    except tree.LockError as exc:
        raise UsageError(str(exc)) from None
    try:
        tree.atomic_write(args.out, tree.lock_to_json(lock).encode("utf-8"))
    except OSError as exc:      # the one output writer's refusal (a device, a FIFO...)
        raise UsageError(f"--out {tree.describe_oserror(exc)}") from None
    out.line(f"lock {args.out}: {lock.repo}@{lock.revision}, {len(lock.files)} files, "
             f"{lock.total_bytes} bytes, {lock.tree_digest}")
    # Here, not at the top: k3infra.weights.lockcheck loads pydantic and the config models
    # (0.24 s, python -X importtime), which `weights verify` never pays.
    from k3infra.weights.lockcheck import compare_with_receipt

    verdict = compare_with_receipt(lock, _shipped_receipt().model.tree_digest)
    out.line("matches the receipt's measured tree" if verdict is True
             else f"note: {verdict} (serving it needs k3:profile custom)",
             "green" if verdict is True else "yellow")
    return 0


def _shipped_receipt():
    """The shipped default receipt."""
    # Here, not at the top: k3infra.receipt loads pydantic (0.16 s with it, python -X
    # importtime), which `weights verify` never pays.
    from k3infra.receipt import load_receipt

    return load_receipt()


def _verify(args: argparse.Namespace) -> int:
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
    from k3infra.weights import prefetch, sources as sources_mod      # HTTP: see the top

    out = _Out()
    try:
        sources = sources_mod.parse_sources(args.sources)
    except ValueError as exc:
        raise UsageError(f"--sources: {exc}") from None
    lock, lock_sha = _load(args.lock)
    if args.expect_digest and lock.tree_digest != args.expect_digest:
        return out.problems(f"not the measured tree: {args.lock} describes {lock.tree_digest}, "
                            f"expected {args.expect_digest}", [])
    try:
        report = prefetch.prefetch(lock, lock_sha, args.dest, workers=args.workers,
                                   download_workers=args.max_download_workers,
                                   overlap=not args.no_overlap, attempts=args.attempts, emit=out.line,
                                   sources=sources)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for note in report.notes:
        print(f"k3infra weights: note: {note}", file=sys.stderr)
    out.line(report.summary(), "green" if report.ok else "red")
    if not report.ok:
        return out.problems(f"prefetch FAILED: {len(report.problems)} problem(s) in {args.dest}; "
                            "no marker written", report.problems)
    return 0


def _from_stack(args: argparse.Namespace) -> None:
    """--stack NAME: the store, revision and lock the stack's prefetch will read, so the
    mirror fills exactly what the stack pins (the stack file read as `render` reads it)."""
    # Here, not at the top: the stack's config models load pydantic (k3infra.config with
    # it 0.24 s, python -X importtime), which `weights verify` never pays.
    from k3infra.config import ConfigError, chosen_receipt, parse_stack_config
    from k3infra.render import load_config, project_root
    from k3infra.weights.lockcheck import load_stack_lock

    given = [f for f, v in (("--to", args.to), ("--endpoint", args.endpoint), ("--region", args.region),
                            ("--revision", args.revision), ("--hub", args.hub), ("--lock", args.lock))
             if v] + [f for f, v in (("--allow-http", args.allow_http),
                                     ("--virtual-hosted", args.virtual_hosted)) if v]
    if given:
        raise UsageError(f"--stack {args.stack} takes the store, revision and lock from the stack: "
                         f"drop {', '.join(given)} (or override keys with --config)")
    root = project_root()
    try:
        raw, secrets = load_config(args.stack, args.config, root)
        receipt = chosen_receipt(raw, root).receipt       # the stack's own (k3:receipt)
        cfg = parse_stack_config(raw, tuple(secrets), receipt=receipt)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    st = cfg.weights.store
    if st is None:
        raise UsageError(f"--stack {args.stack}: k3:weights.store is not set (the stack reads the "
                         "Hub); set k3:weights.store.url first")
    args.to, args.endpoint, args.region = st.url, st.endpoint, st.region
    args.allow_http, args.virtual_hosted = st.allow_http, st.virtual_hosted_style
    args.hub, args.revision = receipt.model.repo, cfg.weights_revision
    if cfg.weights.lock_file is not None:
        try:
            args.lock = load_stack_lock(receipt, cfg, root).path
        except ConfigError as exc:
            raise UsageError(str(exc)) from None


def _mirror(args: argparse.Namespace) -> int:
    from k3infra.weights import prefetch, store      # the HTTP client: see the top

    out = _Out()
    if args.stack:
        _from_stack(args)
    elif not args.to:
        raise UsageError("give --to URL (or --stack NAME: the stack's k3:weights.store)")
    options = store.StoreOptions(endpoint=args.endpoint, region=args.region,
                                 allow_http=args.allow_http, virtual_hosted=args.virtual_hosted)
    try:
        url = store.parse_store_url(args.to, aws=not args.endpoint)
        if args.endpoint:
            problem = store.endpoint_problem(args.endpoint, args.allow_http)
            if problem:
                raise store.StoreError(f"--endpoint {args.endpoint!r} {problem}")
    except store.StoreError as exc:
        raise UsageError(f"--to {args.to!r}: {exc}" if "--endpoint" not in str(exc) else str(exc)) from None
    if args.lock:
        lock, _sha = _load(args.lock)
        for flag, want, have in (("--hub", args.hub, lock.repo), ("--revision", args.revision, lock.revision)):
            if want and want != have:
                raise UsageError(f"{flag} {want}: the lock {args.lock} pins {have}")
    else:
        if args.dir:
            raise UsageError("a local tree needs --lock FILE: every file is verified against it "
                             "before it is uploaded")
        if not args.revision:
            raise UsageError("--revision <40-hex commit> (or --lock FILE): the mirror copies one "
                             "pinned revision")
        repo = args.hub or _shipped_receipt().model.repo
        try:
            lock = prefetch.lock_from_hub(repo, args.revision, emit=out.line)
        except tree.LockError as exc:
            raise UsageError(str(exc)) from None
        except Exception as exc:    # the Hub's answer: not found, gated, offline...
            first = (str(exc).strip().splitlines() or [""])[0]
            print(f"k3infra weights mirror: {repo}@{args.revision}: {type(exc).__name__}: {first}",
                  file=sys.stderr)
            return 1
    # Here, not at the top: the mirror needs obstore, an optional dependency (the `store`
    # extra), and `weights verify` never loads it.
    from k3infra.weights.mirror import HUB_DEADLINE_SECONDS, mirror

    try:
        report = mirror(lock, url, options=options, source_dir=args.dir, check=args.check,
                        dry_run=args.dry_run, workers=args.workers, staging=args.staging,
                        token=os.environ.get("HF_TOKEN") or None, emit=out.line,
                        hub_seconds=args.timeout or HUB_DEADLINE_SECONDS)
    except Exception as exc:     # the store's answer: no credentials, denied, unreachable...
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"k3infra weights mirror: {args.to}: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1
    out.line(report.summary(), "green" if report.ok else "red")
    if not report.ok:
        verb = "does not match" if args.dry_run else "could not be made to match"
        return out.problems(f"mirror: {args.to} {verb} the lock {lock.tree_digest} in "
                            f"{len(report.problems)} file(s)", report.problems)
    return 0
