"""`k3infra startup`: the timeline of each serving pod's last start, phase by phase,
against the budgets the render gave it (k3infra/serving/timeline.py, docs/coldstart.md).

Reads the serving pods and their vllm container's log (with timestamps) through the
`kubernetes` client and your kubeconfig. Exit 0 when every recorded phase stayed within
its budget, 1 when one ran over (or the gate refused the weights), 2 when the cluster
cannot be read.
"""
from __future__ import annotations

import argparse

from k3infra.naming import PROGRAM_INSTANCE


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default=PROGRAM_INSTANCE)
    parser.add_argument("--pod", help="one serving pod (default: every serving pod)")
    parser.add_argument("--previous", action="store_true",
                        help="the container's previous run (after a restart)")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    parser.set_defaults(func=_startup)


def _startup(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from k3infra.cli import UsageError
    from k3infra.live.cluster import ClusterError, KubeCluster, connect
    from k3infra.serve_argv import SERVING_CONTAINER
    from k3infra.serving.timeline import timeline

    console = Console()
    try:
        cluster = KubeCluster(connect(args.kubeconfig, args.context), args.namespace)
        pods = [p for p in cluster.serving_pods()
                if args.pod is None or p["metadata"]["name"] == args.pod]
        if not pods:
            raise UsageError(f"no serving pod{' ' + args.pod if args.pod else ''} in "
                             f"namespace {args.namespace}")
        logs = {p["metadata"]["name"]: cluster.container_log(
            p["metadata"]["name"], SERVING_CONTAINER, previous=args.previous) for p in pods}
    except ClusterError as exc:
        console.print(f"[red]k3infra startup:[/red] {escape(str(exc))}")
        return 2
    over = False
    for pod in pods:
        name = pod["metadata"]["name"]
        t = timeline(pod, logs[name])
        table = Table("phase", "started (UTC)", "took s", "budget s", "verdict",
                      title=f"cold start of {name}")
        for row in t.rows():
            table.add_row(*(escape(c) for c in row))
            over = over or row[4].endswith("OVER")
        console.print(table)
        console.print(f"compile cache: {escape(t.compile_cache)}; key "
                      f"{escape(t.cache_key or 'not recorded')}")
        if t.gate_failed:
            console.print("[red]the weights gate refused the tree on this start[/red]")
            over = True
    return 1 if over else 0
