"""`k3infra pins [--stack NAME] [--write] [--take-revision] [--check]`: resolve every pin
the render warns about (image digests, the engine commit, the Hub revision, the API
server's CIDRs), show them, and with --write record them in stacks/Pulumi.<stack>.yaml.
`--check` (CI) re-resolves the recorded tags and PR head and fails on a moved one."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.table import Table

from k3infra.cli import flags, UsageError
import k3infra.pins as p
from k3infra.config import ConfigError, chosen_receipt, parse_stack_config
from k3infra.config.stackfile import STACK_DIR, stack_file, read_stack_file
from k3infra.display import console as literal_console, styled
from k3infra.gates import is_placeholder
from k3infra.pins import cluster, gitref, hub, oci
from k3infra.pins.stackwrite import StackWriteError, set_values
from k3infra.podcommon import atomic_write_text
from k3infra.render import load_config, project_root

DEFAULT_STACK = "existing"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", default=DEFAULT_STACK,
                        help=f"stacks/Pulumi.<stack>.yaml (default: {DEFAULT_STACK})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true",
                      help="record the resolved values in the stack file (comments kept)")
    mode.add_argument("--check", action="store_true",
                      help="re-resolve recorded tags and the PR head; exit 1 naming a moved one")
    parser.add_argument("--take-revision", action="store_true",
                        help="take the Hub branch's commit today as k3:weightsRevision")
    parser.add_argument("--branch", default="main", help="the Hub branch offered (default: main)")
    parser.add_argument("--kubeconfig", help="the cluster for the API server's CIDRs "
                        "(default: $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--timeout", type=flags.seconds, default=None, metavar="SECONDS",
                        help="every registry, Hub and git call of the command ends by then "
                        "(default 300; each call within 20)")
    parser.set_defaults(func=_pins)


def _pins(args: argparse.Namespace) -> int:
    console = literal_console()
    root = project_root()
    path = stack_file(args.stack, root)
    if not path.is_file():
        raise UsageError(f"--stack {args.stack}: no {path}")
    try:
        raw, secrets = load_config(args.stack, [], root)   # as `render` reads it
        receipt = chosen_receipt(raw, root).receipt        # the stack's own (k3:receipt)
        cfg = parse_stack_config(raw, tuple(secrets), receipt=receipt)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.write and path.parent != root / STACK_DIR:
        raise UsageError(f"--write: {path.relative_to(root)} is a shipped template; copy it "
                         f"first: cp {path.relative_to(root)} {STACK_DIR}/")

    pins = _resolve(cfg, receipt, args, root)
    table = Table("key", "current", "resolved", "state", "source",
                  title=f"k3infra pins: stack {args.stack} ({path.relative_to(root)})")
    for pin in pins:
        table.add_row(pin.key, _show(pin.current), _show(pin.resolved, "-"), pin.state, pin.source)
    console.print(table)

    if args.check:
        return _check(console, pins)
    writable = [pin for pin in pins if pin.writable]
    if args.write and writable:
        _write(console, path, raw, secrets, receipt, writable)
    elif writable:
        console.print(f"{len(writable)} value(s) resolved; nothing written (--write records them)")
    for pin in pins:        # whole, not wrapped in a cell: what to do next
        if pin.state in (p.UNRESOLVED, p.CHOICE) and pin.source:
            console.print(f"{pin.state}: {pin.key}: {pin.source}", soft_wrap=True)
    moved = [pin for pin in pins if pin.state == p.MOVED]
    for pin in moved:
        console.print(styled(("moved:", "red"), f" {pin.key}: {pin.source}"), soft_wrap=True)
    return 1 if moved else 0


def _resolve(cfg, receipt, args, root: Path) -> list:
    # One client for the command: its deadline covers every registry and Hub call.
    http = oci.client(args.timeout or oci.DEADLINE_S)
    check = args.check
    pins = []
    for key, image in p.image_pins(cfg):
        if check and is_placeholder(image):
            pins.append(p.Pin(key, image, state=p.UNRESOLVED, source="not pinned yet: nothing to check"))
            continue
        pins.append(p.image_pin(key, image, lambda ref: oci.resolve(ref, http=http)))
    commit = p.engine_commit_pin(cfg, receipt, lambda repo, ref: gitref.ls_remote(
        repo, ref, timeout=max(1.0, min(gitref.TIMEOUT_S, http.deadline.left()))))
    if commit is not None and not (check and commit.current is None):
        pins.append(commit)
    if not check:
        branch_commit = lambda repo, branch, endpoint: hub.branch_commit(  # noqa: E731
            repo, branch, endpoint, http=http)
        for pin in (p.revision_pin(cfg, receipt, branch_commit, args.branch, args.take_revision),
                    p.cidrs_pin(cfg, lambda: cluster.discovery_api(args.kubeconfig))):
            if pin is not None:
                pins.append(pin)
        full = commit.resolved if commit is not None and commit.state != p.MOVED else None
        pins += p.lock_pins(cfg, root / "images", full or cfg.engine.commit)
    return pins


def _check(console, pins) -> int:
    bad = [pin for pin in pins if pin.state == p.MOVED
           or (pin.state == p.UNRESOLVED and pin.current and pin.resolved is None
               and "not pinned yet" not in pin.source)]

    for pin in bad:
        console.print(styled(("refused:", "red"), f" {pin.key}: {pin.source}"), soft_wrap=True)
    if not bad:
        checked = sum(pin.state == p.PINNED for pin in pins)
        console.print(f"{checked} recorded pin(s) still name what was measured")
    return 1 if bad else 0


def _write(console, path: Path, raw, secrets, receipt, writable) -> None:
    try:
        text = set_values(path, [(pin.path, pin.resolved) for pin in writable])
    except StackWriteError as exc:
        raise UsageError(str(exc)) from None
    # The written file is validated as a hand-typed one would be, before it replaces the old.
    with tempfile.TemporaryDirectory() as tmp:
        candidate = Path(tmp) / path.name
        atomic_write_text(candidate, text)
        try:
            new_raw, new_secrets = read_stack_file(candidate)
        except ConfigError as exc:
            raise UsageError(f"not written: {exc}") from None
    for key in set(raw) - set(new_raw):        # the API key render stands in for
        new_raw[key] = raw[key]
        new_secrets.append(key)
    try:
        parse_stack_config(new_raw, tuple(new_secrets), receipt=receipt)
    except ConfigError as exc:
        raise UsageError(f"not written: {exc}") from None
    try:
        atomic_write_text(path, text)    # the one output writer (a regular file, renamed)
    except OSError as exc:
        raise UsageError(f"not written: {exc.filename}: {exc.strerror}") from None
    console.print(f"wrote {len(writable)} value(s) to {path}: "
                  + ", ".join(pin.key for pin in writable), soft_wrap=True)


def _show(value, none: str = "unset") -> str:
    if value is None:
        return none
    if isinstance(value, list):
        return ", ".join(value)
    return str(value)
