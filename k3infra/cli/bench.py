"""`k3infra bench compare | receipt | prompts | fetch`: the receipt re-measured.

compare  exit 0 within tolerance, 1 outside it (or nothing comparable), 2 unreadable or
         malformed file, 3 a file whose workload is not the receipt's.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from k3infra.cli import (UsageError, add_fetch_parser, add_receipt_args, flags, receipt_of,
                         stack_receipt_of)
from k3infra.bench import workload
from k3infra.bench.compare import compare_results
from k3infra.bench.cost import cost_rows
from k3infra.bench.fetch import FetchError, fetch_results
from k3infra.bench.receipt_writer import (ReceiptInputs, ReceiptWriteError, StatefulSetFile,
                                          write_receipt)
from k3infra.bench.report import print_comparison, plot_latencies, plot_cost, print_cost
from k3infra.bench.results import ResultError, load_result
from k3infra.config import BenchmarkConfig
from k3infra.display import console
from k3infra.fileformats import FileFormatError, load_json
from k3infra.live.cluster import ClusterError, KubeCluster, connect
from k3infra.receipt import receipt_named, stack_receipt
from k3infra.serving.rollout import GATE_SELECTOR
from k3infra.weights import tree


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True)

    cmp = sub.add_parser("compare", help="compare vllm bench serve results with the receipt")
    cmp.add_argument("results", nargs="+", type=Path, metavar="RESULT.json")
    cmp.add_argument("--tolerance-pct", type=tolerance_pct, default=None,
                     help="allowed |measured - receipt| in %% of the receipt, both directions "
                          "(default: k3:benchmark.tolerancePct's default, 10; bounded like it)")
    cmp.add_argument("--plot", type=flags.figure_file, metavar="FILE.png",
                     help="draw per-request latencies against the receipt's p50/p99")
    add_receipt_args(cmp)
    cmp.add_argument("--topology", choices=("single-node", "multi-node"),
                     help="the serving topology of files that do not record it (k3_topology); "
                          "multi-node marks the comparison cross-topology")
    cmp.set_defaults(func=_compare)

    rec = sub.add_parser("receipt", help="write a receipt for your deployment from results")
    rec.add_argument("results", nargs="+", type=Path, metavar="RESULT.json")
    rec.add_argument("--out", required=True, type=flags.output_file,
                     help="the receipt YAML to write (and <out>.sha256 beside it)")
    rec.add_argument("--id", required=True, help="the new receipt's id (lowercase, digits, . -)")
    base = rec.add_mutually_exclusive_group()
    base.add_argument("--base", metavar="ID|FILE",
                      help="the receipt to start from: a shipped id or a file, such as the "
                           "candidate the run measured (default: the shipped default)")
    base.add_argument("--stack", metavar="NAME",
                      help="start from the receipt stacks/Pulumi.<NAME>.yaml names (k3:receipt)")
    rec.add_argument("--statefulset", type=Path,
                     help="the serving StatefulSet as deployed (kubectl get sts -o json): "
                          "its vllm serve flags and env become the receipt's")
    rec.add_argument("--lock", type=Path, help="the weights lock file (tree digest, revision)")
    rec.add_argument("--measured-on", help="YYYY-MM-DD (default: the results' date)")
    rec.add_argument("--engine-version")
    rec.add_argument("--engine-commit", help="7-40 hex")
    rec.add_argument("--engine-pull-request", type=flags.count_from(0, 10 ** 9),
                     help="0 when the engine is a release, not a pull request build")
    rec.add_argument("--gpu-product", help="GPU feature discovery product label")
    rec.add_argument("--gpu-memory-bytes", type=flags.count_from(1, 1 << 44),
                     help="per GPU, as CUDA reports it")
    rec.add_argument("--node", help="a one-line description of the node")
    rec.add_argument("--single-run", action="store_true",
                     help="accept one run per concurrency (no run-to-run agreement figure)")
    rec.set_defaults(func=_receipt)

    pr = sub.add_parser("prompts", help="generate Workload A's prompt files")
    pr.add_argument("--tokenizer", required=True,
                    help="the served model's directory (its tokenizer), or tiktoken:<encoding>")
    pr.add_argument("--corpus", default="package:vllm",
                    help="a source directory, or package:<name> (default: the vllm package, "
                         "as in the engine image)")
    pr.add_argument("--out", required=True, type=flags.output_dir)
    pr.add_argument("--seed", type=flags.mirrors("BenchmarkConfig", "seed", "k3:benchmark.seed"), default=0)
    pr.add_argument("--run-id", required=True,
                    help="the benchmark run's id (its nonces); the Job records it")
    pr.add_argument("--runs", type=flags.mirrors("BenchmarkConfig", "runs", "k3:benchmark.runs"), default=1)
    pr.add_argument("--concurrencies", type=_concurrencies,
                    help="comma-separated (default: the receipt's; bounded like "
                         "k3:benchmark.concurrencies)")
    add_receipt_args(pr)
    pr.set_defaults(func=_prompts)

    co = sub.add_parser("cost", help="USD per million tokens at each measured concurrency")
    co.add_argument("results", nargs="+", type=Path, metavar="RESULT.json")
    co.add_argument("--node-rate", required=True, type=_node_rate, metavar="USD_PER_HOUR",
                    help="what one 8-GPU serving node costs per hour (bounded like "
                         "k3:monitoring.nodeRateUsdPerHour)")
    co.add_argument("--nodes", type=_nodes, default=1,
                    help="serving nodes behind the endpoint the results measured (default 1; "
                         "bounded like k3:replicas)")
    co.add_argument("--plot", type=flags.figure_file, metavar="FILE.png",
                    help="draw USD per million tokens against concurrency")
    co.set_defaults(func=_cost)

    fe = add_fetch_parser(sub, "benchmark Job", "the benchmark Job's own image", _fetch)
    fe.add_argument("--gate", action="store_true",
                    help="the rollout gate's Job instead (the canary's run, k3:rollout.gate)")


# Flags bounded exactly like the stack keys they mirror (k3infra.cli.flags).
tolerance_pct = flags.mirrors("BenchmarkConfig", "tolerance_pct", "k3:benchmark.tolerancePct")
_node_rate = flags.mirrors("MonitoringConfig", "node_rate_usd_per_hour",
                           "k3:monitoring.nodeRateUsdPerHour")
_nodes = flags.mirrors("StackConfig", "replicas", "k3:replicas")


_concurrencies = flags.mirrors("BenchmarkConfig", "concurrencies", "k3:benchmark.concurrencies",
                               comma_list=True)


def _load(paths: list[Path]):
    try:
        return [load_result(p) for p in paths]
    except ResultError as exc:
        raise UsageError(str(exc)) from None


def _tolerance(value) -> float:
    return BenchmarkConfig.model_fields["tolerance_pct"].default if value is None else value


def _compare(args: argparse.Namespace) -> int:
    receipt = receipt_of(args).receipt
    results = _load(args.results)
    cmp = compare_results(results, receipt, _tolerance(args.tolerance_pct), args.topology)
    print_comparison(cmp, receipt)
    if args.plot:
        plot_latencies(results, receipt, cmp.tolerance_pct, args.plot)
        print(f"plot: {args.plot}")
    return cmp.exit_status()


def _cost(args: argparse.Namespace) -> int:
    try:
        rows = cost_rows(_load(args.results), args.node_rate, args.nodes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not rows:
        raise UsageError("no measured result with a concurrency among the files: nothing to price")
    print_cost(rows, args.node_rate, args.nodes)
    if args.plot:
        plot_cost(rows, args.node_rate, args.nodes, args.plot)
        print(f"plot: {args.plot}")
    return 0


def _receipt(args: argparse.Namespace) -> int:
    results = _load(args.results)
    inputs = ReceiptInputs(
        id=args.id, measured_on=args.measured_on, engine_version=args.engine_version,
        engine_commit=args.engine_commit, engine_pull_request=args.engine_pull_request,
        gpu_product=args.gpu_product, gpu_memory_bytes=args.gpu_memory_bytes, node=args.node,
        single_run=args.single_run)
    try:
        if args.statefulset:
            inputs = inputs.with_statefulset(load_json(args.statefulset, "StatefulSet JSON",
                                                       StatefulSetFile))
        if args.lock:
            lock, _sha = tree.load_lock(str(args.lock))      # the one lock reader
            inputs = inputs.with_lock(lock)
        base = (receipt_named(args.base, "--base") if args.base else
                stack_receipt_of(args.stack) if args.stack else stack_receipt(None))
        written = write_receipt(base.receipt, results, inputs, args.out)
    except (ReceiptWriteError, FileFormatError, tree.LockError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:               # the one output writer's refusal
        raise UsageError(f"--out {exc.filename}: {exc.strerror}") from None
    out = console()
    for path in written:
        out.print(f"wrote {path}")
    return 0


def _prompts(args: argparse.Namespace) -> int:
    receipt = receipt_of(args).receipt
    w = receipt.workload_a
    concurrencies = args.concurrencies or ",".join(str(c) for c in w.concurrencies)
    block = next((a.value for a in receipt.serve.engine_args if a.flag == "--block-size"), None)
    argv = ["--tokenizer", args.tokenizer, "--corpus", args.corpus, "--out", str(args.out),
            "--seed", str(args.seed), "--run-id", args.run_id, "--runs", str(args.runs),
            "--concurrencies", concurrencies, "--warmups", str(w.warmup_requests),
            "--measured", str(w.measured_requests), "--min-tokens", str(w.prompt_tokens_min),
            "--max-tokens", str(w.prompt_tokens_max)]
    if block:
        argv += ["--block-size", block]
    return workload.main(argv)


def _fetch(args: argparse.Namespace) -> int:
    try:
        cluster = KubeCluster(connect(args.kubeconfig, args.context), args.namespace)
        run_dir = fetch_results(cluster, args.namespace, args.out, image=args.image,
                                run_id=args.run or "",
                                **({"job_selector": GATE_SELECTOR, "enabled_by": "k3:rollout.gate"}
                                   if args.gate else {}))
    except (ClusterError, FetchError) as exc:
        raise UsageError(str(exc)) from None
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    console().print(f"fetched {len(files)} files into {run_dir} (each checked against the "
                    "run's SHA256SUMS); compare with: k3infra bench compare "
                    f"{run_dir}/run*-measured.json")
    return 0
