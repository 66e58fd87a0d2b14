"""`k3infra accuracy run | compare | fetch`: the accuracy smoke test (docs/accuracy.md).

compare  exit 0 every task inside the baseline's band, 1 outside it or no baseline,
         2 unreadable run, 3 a run whose task configuration is not the baseline's.
"""
from __future__ import annotations

import argparse
import os
import shlex
import tempfile
from importlib import resources
from pathlib import Path

import yaml

from k3infra.cli import UsageError, add_fetch_parser, add_receipt_args, flags, receipt_of
from k3infra.accuracy import runner
from k3infra.accuracy.compare import (CONFIDENCE, EXIT_OUTSIDE, RunError, baseline_section,
                                      compare_run, load_run)
from k3infra.accuracy.manifests import JOB_SELECTOR
from k3infra.accuracy.report import accuracy_table, plot_accuracy
from k3infra.bench.fetch import FetchError, fetch_results
from k3infra.config import AccuracyConfig
from k3infra.display import console as literal_console, styled
from k3infra.fieldtypes import HTTP_URL, API_KEY
from k3infra.fileformats import FileFormatError, read_text
from k3infra.live.cluster import ClusterError, KubeCluster, connect
from k3infra.podcommon import atomic_write_text
from k3infra.receipt import load_receipt


def _defaults():
    return AccuracyConfig()


def register(parser: argparse.ArgumentParser) -> None:
    d = _defaults()
    sub = parser.add_subparsers(dest="accuracy_command", required=True)

    run = sub.add_parser("run", help="run the smoke test against an endpoint with lm-eval")
    run.add_argument("--endpoint", required=True, type=_endpoint,
                     help="http(s)://host:port of the API")
    run.add_argument("--model", default="kimi-k3", help="the served model name")
    run.add_argument("--out", required=True, type=flags.output_dir, help="results directory")
    run.add_argument("--api-key-file", type=Path,
                     help="file holding the API key (default: $OPENAI_API_KEY, lm-eval's own)")
    run.add_argument("--tasks", default=",".join(d.tasks))
    run.add_argument("--tasks-dir", type=Path, help="task YAML files (default: the shipped ones)")
    # Bounded exactly like the k3:accuracy keys they mirror (k3infra.cli.flags).
    run.add_argument("--limit", type=_key("limit"), default=d.limit)
    run.add_argument("--max-tokens", type=_key("max_tokens", "maxTokens"), default=d.max_tokens)
    run.add_argument("--seed", type=_key("seed"), default=d.seed)
    run.add_argument("--concurrency", type=_key("concurrency"), default=d.concurrency)
    run.add_argument("--request-timeout", type=flags.count_from(1, flags.MAX_SECONDS), default=300)
    run.add_argument("--max-retries", type=flags.count_from(0, 100), default=3)
    run.add_argument("--timeout", type=flags.count_from(1, 1440 * 60),
                     default=d.timeout_minutes * 60)
    run.add_argument("--lm-eval", default="lm_eval",
                     help="the lm-eval command (requirements-accuracy.txt installs it)")
    run.add_argument("--run-id", default="")
    run.set_defaults(func=_run)

    cmp = sub.add_parser("compare", help="judge a run against the receipt's accuracy baseline")
    cmp.add_argument("result", type=Path, metavar="RUN_DIR",
                     help="a run directory (scores.json, SHA256SUMS)")
    add_receipt_args(cmp)      # the receipt holding the baseline
    cmp.add_argument("--accept", action="store_true",
                     help="no baseline yet: write this run into a copy of the receipt (--out)")
    cmp.add_argument("--out", type=flags.output_file, help="the receipt YAML --accept writes")
    cmp.add_argument("--plot", type=flags.figure_file, metavar="FILE.png",
                     help="draw scores against the baseline's tolerance band")
    cmp.set_defaults(func=_compare)

    add_fetch_parser(sub, "AccuracySmoke Job", "the Job's own image", _fetch)


def _key(field: str, name: str = ""):
    return flags.mirrors("AccuracyConfig", field, f"k3:accuracy.{name or field}")


def _endpoint(text: str) -> str:
    """http(s)://host[:port][/path], no credentials in it (the key goes in a file): the
    one URL rule first (flags.url), so a refusal never prints them."""
    text = flags.url(text)
    if not HTTP_URL.matches(text):
        raise argparse.ArgumentTypeError(f"{text[:80]!r}: must be an http(s):// URL (the key "
                                         "goes in --api-key-file)")
    return text


def shipped_tasks_dir() -> Path:
    return Path(str(resources.files("k3infra.accuracy").joinpath("tasks")))


def _run(args: argparse.Namespace) -> int:
    env_key = None
    if args.api_key_file:
        try:      # the one bounded reader: a regular file, never a FIFO or a device
            env_key = read_text(args.api_key_file, "API key file").strip()
        except FileFormatError as exc:
            raise UsageError(f"--api-key-file {exc}") from None
        if not API_KEY.matches(env_key):    # named, never printed
            raise UsageError(f"--api-key-file {args.api_key_file}: {API_KEY.accepted}")
    if not (env_key or os.environ.get("OPENAI_API_KEY")):
        raise UsageError("no API key: pass --api-key-file or set OPENAI_API_KEY")
    argv = ["--endpoint", args.endpoint, "--model", args.model, "--results", str(args.out),
            "--tasks-dir", str(args.tasks_dir or shipped_tasks_dir()), "--tasks", args.tasks,
            "--limit", str(args.limit), "--max-tokens", str(args.max_tokens),
            "--seed", str(args.seed), "--concurrency", str(args.concurrency),
            "--request-timeout", str(args.request_timeout),
            "--max-retries", str(args.max_retries), "--timeout", str(args.timeout),
            "--lm-eval", shlex.join(shlex.split(args.lm_eval)), "--run-id", args.run_id]
    previous = os.environ.get("OPENAI_API_KEY")
    if env_key:
        os.environ["OPENAI_API_KEY"] = env_key      # lm-eval's own variable, child only
    try:
        return runner.main(argv)
    finally:
        if env_key:
            if previous is None:
                os.environ.pop("OPENAI_API_KEY", None)
            else:
                os.environ["OPENAI_API_KEY"] = previous


def _compare(args: argparse.Namespace) -> int:
    console = literal_console()
    try:
        run = load_run(args.result)
    except RunError as exc:
        raise UsageError(str(exc)) from None
    chosen = receipt_of(args)
    receipt = chosen.receipt
    if receipt.accuracy is None:
        if not args.accept:
            console.print(f"receipt {receipt.id} has no accuracy baseline: accept this run "
                          "with --accept --out RECEIPT.yaml (smoke test)")
            return EXIT_OUTSIDE
        if not args.out:
            raise UsageError("--accept needs --out: the receipt copy to write")
        written = write_baseline(chosen.path, baseline_section(run, receipt), args.out)
        console.print(f"accepted run {run.run_id} as receipt {receipt.id}'s accuracy "
                      f"baseline (smoke test): wrote {written}")
        receipt = load_receipt(str(written))
    elif args.accept:
        raise UsageError(f"receipt {receipt.id} already has an accuracy baseline "
                         f"(run {receipt.accuracy.run_id}); compare without --accept")
    cmp = compare_run(run, receipt.accuracy)
    console.print(accuracy_table(cmp, receipt))
    status = cmp.exit_status()
    console.print({0: styled(("PASS", "green"), ": every task inside its band (smoke test)"),
                   1: styled(("FAIL", "bold red"), ": outside the baseline's band (smoke test)"),
                   3: styled(("NOT COMPARABLE", "bold red"),
                             ": not the baseline's task configuration")}[status])
    for reason in cmp.reasons():
        console.print(f"  - {reason}")
    console.print(f"tolerance: Wilson score interval of the baseline score at its sample "
                  f"count, {CONFIDENCE:.0%} two-sided")
    if args.plot:
        plot_accuracy(cmp, receipt, args.plot)
        print(f"plot: {args.plot}")
    return status


def write_baseline(base: Path, section: dict, out: Path) -> Path:
    """The base receipt's text with an `accuracy:` section appended (comments kept),
    validated by loading it back before it is left in place."""
    text = read_text(base, "receipt")     # the one bounded reader
    text = (text.rstrip("\n") + "\n# The first accepted accuracy smoke test "
            "(k3infra accuracy compare --accept): a smoke test, not a benchmark claim.\n"
            + yaml.safe_dump({"accuracy": section}, sort_keys=False, width=100))
    with tempfile.TemporaryDirectory() as tmp:    # validated before it is left in place
        candidate = Path(tmp) / out.name
        atomic_write_text(candidate, text)
        try:
            load_receipt(str(candidate))
        except Exception as exc:
            raise UsageError(f"the receipt with this baseline does not validate: {exc}") from None
    try:
        atomic_write_text(out, text)         # the one output writer
    except OSError as exc:
        raise UsageError(f"--out {exc.filename}: {exc.strerror}") from None
    return out


def _fetch(args: argparse.Namespace) -> int:
    try:
        cluster = KubeCluster(connect(args.kubeconfig, args.context), args.namespace)
        run_dir = fetch_results(cluster, args.namespace, args.out, image=args.image,
                                run_id=args.run or "", job_selector=JOB_SELECTOR,
                                enabled_by="k3:accuracy.enabled")
    except (ClusterError, FetchError) as exc:
        raise UsageError(str(exc)) from None
    literal_console().print(f"fetched {run_dir} (each file checked against the run's SHA256SUMS); "
                    f"compare with: k3infra accuracy compare {run_dir}")
    return 0
