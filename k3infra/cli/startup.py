"""`k3infra startup`: the timeline of each serving pod's last start, phase by phase,
against the budgets the render gave it (k3infra/serving/timeline.py, docs/coldstart.md).

Reads the serving pods and their vllm container's log (with timestamps) through the
`kubernetes` client and your kubeconfig; or, off a cluster, `--log FILE` (the container's
output, with or without `kubectl logs --timestamps` prefixes) with the pod's timestamps
from `--pod-json` (`kubectl get pod -o json`) or `--started`/`--scheduled`, else from the
start script's first k3-phase line, and the budgets from the pod or `--budget` (the
`k3infra.dev/startup-budget` annotation's JSON). Exit 0 when every recorded phase stayed
within its budget, 1 when one ran over (or the gate refused the weights), 2 when the
cluster or a file cannot be read.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from k3infra.cli import UsageError, add_cluster_args, flags
from k3infra.display import console as literal_console, styled
from k3infra.fileformats import FileFormatError, load_json, read_text
# The module, not its names: tests replace connect and KubeCluster on it.
from k3infra.live import cluster as live_cluster
from k3infra.naming import PROGRAM_INSTANCE
from k3infra.serve_argv import SERVING_CONTAINER
from k3infra.serving.timeline import PodFile, budgets_of, off_cluster_pod, parse_time, timeline


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default=PROGRAM_INSTANCE)
    parser.add_argument("--pod", help="one serving pod (default: every serving pod)")
    parser.add_argument("--previous", action="store_true",
                        help="the container's previous run (after a restart)")
    parser.add_argument("--log", type=Path, metavar="FILE",
                        help="off a cluster: the vllm container's log file")
    parser.add_argument("--pod-json", type=Path, metavar="FILE",
                        help="with --log: the pod as `kubectl get pod -o json` prints it")
    parser.add_argument("--budget", metavar="JSON",
                        help="with --log: the startup-budget annotation's JSON (or @FILE)")
    parser.add_argument("--started", help="with --log: the container's start (RFC 3339)")
    parser.add_argument("--scheduled", help="with --log: the pod's scheduling (RFC 3339)")
    parser.add_argument("--restarts", type=flags.count_from(0, 10 ** 9), default=0,
                        help="with --log: the container's restart count (0: a first start)")
    add_cluster_args(parser)
    parser.set_defaults(func=_startup)


def _startup(args: argparse.Namespace) -> int:
    console = literal_console()
    if args.log is not None:
        try:
            pods, logs = _off_cluster(args)
            return _report(console, pods, logs)
        except (OSError, ValueError) as exc:     # FileFormatError included: one line
            console.print(styled(("k3infra startup:", "red"), f" {exc}"), soft_wrap=True)
            return 2
    for flag in ("pod_json", "budget", "started", "scheduled"):
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} needs --log FILE (off a cluster)")
    try:
        cluster = live_cluster.KubeCluster(live_cluster.connect(args.kubeconfig, args.context),
                                           args.namespace)
        pods = [p for p in cluster.serving_pods()
                if args.pod is None or p["metadata"]["name"] == args.pod]
        if not pods:
            raise UsageError(f"no serving pod{' ' + args.pod if args.pod else ''} in "
                             f"namespace {args.namespace}")
        logs = {p["metadata"]["name"]: cluster.container_log(
            p["metadata"]["name"], SERVING_CONTAINER, previous=args.previous) for p in pods}
    except live_cluster.ClusterError as exc:
        console.print(styled(("k3infra startup:", "red"), f" {exc}"), soft_wrap=True)
        return 2
    try:
        return _report(console, pods, logs)
    except ValueError as exc:          # a pod the API served that is not one (FileFormatError)
        console.print(styled(("k3infra startup:", "red"), f" {exc}"), soft_wrap=True)
        return 2


def _off_cluster(args: argparse.Namespace) -> tuple[list[dict], dict[str, str]]:
    # The one bounded reader: a FIFO or /dev/zero as --log is refused at once.
    log = read_text(args.log, "container log", lenient=True)
    if args.pod_json is not None:
        pod = load_json(args.pod_json, "pod JSON", PodFile).model_dump()
    else:
        budgets = None
        if args.budget is not None:
            source = args.budget[1:] if args.budget.startswith("@") else "--budget"
            text = read_text(source, "startup budget") if source != "--budget" else args.budget
            try:
                budgets = budgets_of(text, source)
            except FileFormatError as exc:
                shown = repr(args.budget[:60]) if source == "--budget" else source
                raise ValueError(f"--budget {shown}: {exc.problem}; accepted: the "
                                 "k3infra.dev/startup-budget annotation, e.g. "
                                 '\'{"load": 1561, "engine": 3751}\'') from None
        for flag in ("started", "scheduled"):
            value = getattr(args, flag)
            if value is not None:
                try:
                    parse_time(value)
                except ValueError:
                    raise ValueError(f"--{flag} {value!r}: not an RFC 3339 time "
                                     "(2026-12-01T10:00:00.123Z)") from None
        pod = off_cluster_pod(budgets, started=args.started, scheduled=args.scheduled,
                              restarts=args.restarts)
    meta = pod.setdefault("metadata", {})
    meta["name"] = meta.get("name") or args.log.name
    return [pod], {meta["name"]: log}


def _report(console, pods: list[dict], logs: dict[str, str]) -> int:
    over = False
    for pod in pods:
        name = pod["metadata"]["name"]
        t = timeline(pod, logs[name])
        rows = t.rows()
        days = sorted({r[1][:10] for r in rows if r[1] != "-"})
        # The date once in the title, the time of day (milliseconds) in the rows.
        table = Table("phase", "started (UTC)", "took s", "budget s", "verdict",
                      title=f"cold start of {name}" + (f", {' / '.join(days)}" if days else ""))
        for row in rows:
            table.add_row(row[0], row[1][11:-1] if row[1] != "-" else "-", *row[2:])
            over = over or row[4].endswith("OVER")
        console.print(table)
        console.print(f"compile cache: {t.compile_cache}; key {t.cache_key or 'not recorded'}")
        if t.gate_failed:
            console.print(styled(("the weights gate refused the tree on this start", "red")))
            over = True
    return 1 if over else 0
