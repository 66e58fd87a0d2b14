"""`k3infra verify`: the live deployment against the receipt, in one table.

Reads the cluster through the `kubernetes` client and your kubeconfig: the serving
StatefulSet (image, args, env, readiness), the verified marker and lock inside each
serving pod, and the benchmark Job's latest results (fetched from its PVC through a
short-lived reader pod, or `--results DIR` from an earlier `k3infra bench fetch`).
Exit 0 when every check holds, 1 on any drift (a serving pod that cannot be read, such
as a Pending one, is a weights row), 2 when the cluster cannot be read.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional

from rich.table import Table

from k3infra.naming import PROGRAM_INSTANCE
from k3infra.cli import UsageError, add_cluster_args, add_receipt_args, receipt_of
from k3infra.cli.bench import tolerance_pct, _tolerance
from k3infra.bench import fetch
from k3infra.bench.compare import compare_results
from k3infra.bench.results import ResultError, load_result
from k3infra.display import console as literal_console, styled
from k3infra.host.inspect import DockerHost
from k3infra.live import drift
from k3infra.live.cluster import ClusterError, KubeCluster, connect
from k3infra.podcommon import JsonRefused, parse_json
from k3infra.weights import tree
from k3infra.weights.manifests import WeightsLayout
from k3infra.weights.tree import MARKER_NAME


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default=PROGRAM_INSTANCE)
    parser.add_argument("--docker-host", metavar="HOST",
                        help="verify a Docker host's containers instead (ssh://user@host or "
                             "unix:///var/run/docker.sock; needs --results or --no-results)")
    parser.add_argument("--instance",
                        help="with --docker-host: the K3HostStack instance whose "
                             "<instance>-vllm container is read (default: the stack "
                             "program's instance, kimi-k3)")
    add_cluster_args(parser)
    add_receipt_args(parser)
    parser.add_argument("--engine-image", help="the image you expect (repo@sha256:...)")
    parser.add_argument("--lock", type=Path,
                        help="the weights lock file (default: the lock on the weights volume)")
    parser.add_argument("--results", type=Path,
                        help="a run directory from `k3infra bench fetch` (default: fetch the "
                             "latest run into --fetch-dir)")
    parser.add_argument("--fetch-dir", type=Path, default=Path("k3-bench-results"))
    parser.add_argument("--no-results", action="store_true",
                        help="skip the benchmark check (no benchmark deployed)")
    parser.add_argument("--tolerance-pct", type=tolerance_pct, default=None,
                        help="as bench compare's (bounded like k3:benchmark.tolerancePct)")
    parser.set_defaults(func=_verify)


def verify_rows(cluster: Any, receipt, *, lock: Optional[dict] = None,
                expected_image: Optional[str] = None, results_dir: Optional[Path] = None,
                fetch_dir: Optional[Path] = None, check_results: bool = True,
                tolerance_pct: float) -> list:
    """Every drift row. `cluster` offers statefulset(), read_file(pod, container, path)
    and, for fetching, what k3infra.bench.fetch.fetch_results uses."""
    # A multi-node stack serves from LeaderWorkerSet groups (k3infra/serving/group.py):
    # every pod of every group is read, the leader's serve line judged like a node's.
    groups = cluster.groups() if hasattr(cluster, "groups") else []
    if groups:
        rows, pods = [], []
        for lws in groups:
            rows += drift.group_drift(lws, receipt, expected_image)
            pods += drift.group_pods(lws)
        workload = groups[0]
        tree = drift.group_model_dir(workload)
    else:
        workload = cluster.statefulset()
        rows = drift.statefulset_drift(workload, receipt, expected_image)
        tree = drift.model_dir(workload)
        name = workload["metadata"]["name"]
        pods = [f"{name}-{i}" for i in range(int(workload["spec"].get("replicas", 1)))]
    ann = workload["metadata"].get("annotations") or {}
    revision = ann.get("k3infra.dev/weights-revision")
    profile = ann.get("k3infra.dev/profile", "measured")
    for pod in pods:
        try:
            text = cluster.read_file(pod, drift.SERVING_CONTAINER, f"{tree}/{MARKER_NAME}") \
                if tree else None
            pod_lock = lock
            if pod_lock is None and revision:
                pod_lock = _json(cluster.read_file(
                    pod, drift.SERVING_CONTAINER, WeightsLayout(receipt.model.repo, revision).lock))
        except ClusterError as exc:
            # A pod not running (Pending, crash-looping on a bad flag) is drift to show in
            # the table beside the StatefulSet's rows, not a reason to hide them.
            rows.append(drift.DriftRow("weights", f"verified marker [{pod}]",
                                       "readable in the running serving container",
                                       f"cannot read: {exc}", False))
            continue
        marker = _json(text)
        for r in drift.weights_drift(marker, pod_lock, receipt, revision=revision,
                                     profile=profile):
            rows.append(drift.DriftRow(r.area, f"{r.check} [{pod}]", r.expected, r.actual, r.ok))

    if check_results:
        cmp, why = None, ""
        try:
            if results_dir is None:
                results_dir = fetch.fetch_results(cluster, cluster.namespace, fetch_dir)
            results = [load_result(p) for p in fetch.measured_results(results_dir)]
            cmp = compare_results(results, receipt, tolerance_pct)
        except (ClusterError, fetch.FetchError, ResultError, OSError, ValueError) as exc:
            why = str(exc)
        rows += drift.benchmark_drift(cmp, why)
    return rows


def _json(text: Optional[str]) -> Optional[dict]:
    """A marker or lock read from a pod (the weights volume's writers are not trusted):
    podcommon's bounded JSON parser; anything else is no file."""
    if text is None:
        return None
    try:
        data = parse_json(text)
    except JsonRefused:
        return None
    return data if isinstance(data, dict) else None


def print_rows(rows, console=None) -> None:
    console = console or literal_console()
    table = Table(title="k3infra verify: live deployment vs receipt")
    for col in ("area", "check", "expected", "actual", ""):
        table.add_column(col, overflow="fold")
    for r in rows:
        # Literal: "[kimi-k3-0]" in a check's name is the pod, not rich markup.
        table.add_row(r.area, r.check, r.expected, r.actual,
                      styled(("ok", "green")) if r.ok else styled(("DRIFT", "bold red")))
    console.print(table)
    bad = [r for r in rows if not r.ok]
    console.print(styled(("no drift", "green")) if not bad
                  else styled((f"{len(bad)} check(s) drift from the receipt", "bold red")))


def _verify(args: argparse.Namespace) -> int:
    receipt = receipt_of(args).receipt
    lock = None
    if args.lock:
        try:     # the one lock reader: bounded, typed, its digest recomputed
            parsed, _sha = tree.load_lock(str(args.lock))
        except tree.LockError as exc:
            raise UsageError(f"--lock: {exc}") from None
        lock = {"tree_digest": parsed.tree_digest, "revision": parsed.revision}
    try:
        if args.docker_host:
            if args.results is None and not args.no_results:
                raise UsageError("--docker-host: pass --results DIR (a run of `vllm bench "
                                 "serve` against the host) or --no-results")

            cluster = DockerHost(args.docker_host, args.instance or PROGRAM_INSTANCE)
        else:
            cluster = KubeCluster(connect(args.kubeconfig, args.context), args.namespace)
        rows = verify_rows(cluster, receipt, lock=lock, expected_image=args.engine_image,
                           results_dir=args.results, fetch_dir=args.fetch_dir,
                           check_results=not args.no_results,
                           tolerance_pct=_tolerance(args.tolerance_pct))
    except ClusterError as exc:
        raise UsageError(str(exc)) from None
    print_rows(rows)
    return 0 if all(r.ok for r in rows) else 1
