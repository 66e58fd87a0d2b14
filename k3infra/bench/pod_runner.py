"""The benchmark Job's entry point (runs in the engine image; standard library only, plus
the tokenizer the image ships). Reaches the pod through the benchmark ConfigMap, next to
workload.py.

1. waits for the serving endpoint's /health, then checks /v1/models with the API key;
2. builds Workload A from the image's own vllm sources with the served model's
   tokenizer (every request its own prompt), and refuses prompts sharing a KV block;
3. per run, per concurrency: one `vllm bench serve` invocation for the warm-up set and
   one for the measured set. Warm-ups are NOT `--num-warmups`: vLLM sends its warm-up
   (and its ready-check) with the dataset's first prompt, so the first measured request
   would hit the prefix cache the warm-up filled. Measured invocations therefore run
   with `--num-warmups 0 --ready-check-timeout-sec 0`;
4. keeps every raw file (datasets, results with per-request arrays, logs) under
   <results>/<run id>/, writes SHA256SUMS and index.json, and points <results>/LATEST at
   the run only when every request of every invocation succeeded.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Sequence
from importlib.metadata import version

try:
    from k3infra import podcommon
    from k3infra.bench import verdict
    from k3infra.bench import workload as wl
except ImportError:  # in the pod: k3infra is not installed; its files sit next to us
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import podcommon  # noqa: E402
    import verdict  # noqa: E402
    import workload as wl  # noqa: E402

INDEX = "index.json"
SUMS = "SHA256SUMS"
LATEST = "LATEST"
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
METRIC_PERCENTILES = "50,99"

REQUIRED_FLAGS = (
    "--backend", "--base-url", "--endpoint", "--model", "--served-model-name", "--tokenizer",
    "--dataset-name", "--dataset-path", "--num-prompts", "--max-concurrency",
    "--request-rate", "--percentile-metrics", "--metric-percentiles", "--save-result",
    "--save-detailed", "--result-dir", "--result-filename", "--metadata", "--seed",
    "--custom-output-len",
    # Without it (older clients) vLLM always sends a test request with the first
    # measured prompt before measuring, which warms the prefix cache for it.
    "--ready-check-timeout-sec",
)
SKIP_TEMPLATE_FLAGS = ("--skip-chat-template", "--custom-skip-chat-template")
# No --trust-remote-code: the benchmark runs no Python shipped with the weights
# (docs/security.md); a tokenizer that needs it fails loudly instead.
OPTIONAL_FLAGS = ("--num-warmups", "--disable-shuffle", "--no-oversample",
                  "--disable-tqdm", "--request-id-prefix")


class BenchmarkError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"k3 bench: {msg}", flush=True)


# --- the server -----------------------------------------------------------------------

def _get(url: str, api_key: Optional[str], timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def wait_for_health(base_url: str, timeout_s: float, interval_s: float = 10.0,
                    api_key: Optional[str] = None) -> None:
    """Until the engine answers through the serving proxy. The API port serves only the
    OpenAI routes with the key (/health is on the proxy's health port, for kubelet):
    /v1/models is 200 once vLLM is up, 502 while it is not. A refused key is not
    something waiting fixes: check_model reports it."""
    deadline = time.monotonic() + timeout_s
    url = f"{base_url}/v1/models"
    while True:
        try:
            status, _ = _get(url, api_key)
            if status in (200, 401, 403):
                log(f"{url} answers ({status})")
                return
            log(f"{url} answered {status}; waiting")
        except OSError as exc:
            log(f"{url} not reachable ({exc}); waiting")
        if time.monotonic() >= deadline:
            raise BenchmarkError(f"{url} not 200 within {timeout_s:.0f} s")
        time.sleep(interval_s)


def check_model(base_url: str, served_name: str, api_key: Optional[str]) -> None:
    status, body = _get(f"{base_url}/v1/models", api_key)
    if status in (401, 403):
        raise BenchmarkError(f"{base_url}/v1/models refused the API key ({status}): "
                             "OPENAI_API_KEY must hold the serving Secret's key")
    if status != 200:
        raise BenchmarkError(f"{base_url}/v1/models answered {status}")
    ids = [m.get("id") for m in json.loads(body).get("data", [])]
    if served_name not in ids:
        raise BenchmarkError(f"the server serves {ids}, not {served_name!r}")


def _post_json(url: str, api_key: Optional[str], payload: dict,
               timeout: float = 120.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


TOKENIZE_PATH = "/tokenize"


def check_server_counts(base_url: str, served_name: str, api_key: Optional[str],
                        prompts: Sequence["wl.Prompt"]) -> int:
    """Workload A's lengths are tokens as the server counts them: every prompt's count
    here (the served tree's tokenizer) is checked against the server's own, vLLM's
    POST /tokenize behind the key (the same special tokens a /v1/completions prompt
    gets). A difference refuses the run: its lengths would not be the receipt's.
    (`vllm bench serve` itself calls /tokenize only for its random datasets, and
    without the key; the Job's custom dataset never reaches that path.)"""
    url = f"{base_url}{TOKENIZE_PATH}"
    differ = []
    for p in prompts:
        status, body = _post_json(url, api_key, {"model": served_name, "prompt": p.text,
                                                 "add_special_tokens": True})
        if status != 200:
            raise BenchmarkError(
                f"POST {url} answered {status}: the benchmark needs the server's token "
                "counts (the serving proxy passes POST /tokenize with the API key; "
                "docs/benchmark.md)")
        server = json.loads(body)["count"]
        if server != p.tokens:
            differ.append(f"{p.label}: {p.tokens} here, {server} on the server")
    if differ:
        raise BenchmarkError(
            f"{len(differ)} of {len(prompts)} prompt(s) count differently on the server "
            f"({'; '.join(differ[:3])}): the Job's tokenizer is not the served one")
    return len(prompts)


# --- vllm bench serve -----------------------------------------------------------------

def bench_flags(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", help_text))


def bench_help() -> str:
    """Every flag `vllm bench serve` takes. Newer vLLM (0.32.0 seen here) prints only
    its option groups for `--help` and the flags for `--help=all`; older argparse
    refuses `--help=all`, so then plain `--help`."""
    out = ""
    for flag in ("--help=all", "--help"):
        run = subprocess.run(["vllm", "bench", "serve", flag], capture_output=True, text=True,
                             check=False)
        out = run.stdout
        if run.returncode == 0 and "--base-url" in out:
            break
    return out


def check_flags(flags: set[str], ignore_eos: bool) -> None:
    missing = [f for f in REQUIRED_FLAGS if f not in flags]
    if ignore_eos and "--ignore-eos" not in flags:
        missing.append("--ignore-eos")
    if not any(f in flags for f in SKIP_TEMPLATE_FLAGS):
        missing.append(" or ".join(SKIP_TEMPLATE_FLAGS))
    if missing:
        raise BenchmarkError("this image's `vllm bench serve` lacks " + ", ".join(missing)
                             + "; Workload A cannot be run as specified")


def bench_command(flags: set[str], *, base_url: str, served_model_name: str, model_dir: str,
                  dataset: str, num_prompts: int, concurrency: int, output_tokens: int,
                  result_dir: str, result_file: str, seed: int, ignore_eos: bool,
                  metadata: dict[str, str], request_id_prefix: str) -> list[str]:
    """argv of one `vllm bench serve` invocation over one dataset file."""
    cmd = ["vllm", "bench", "serve",
           "--backend", "openai", "--endpoint", "/v1/completions",
           "--base-url", base_url,                       # no /v1: vLLM appends --endpoint
           "--model", model_dir, "--served-model-name", served_model_name,
           "--tokenizer", model_dir,
           "--dataset-name", "custom", "--dataset-path", dataset,
           # Prompts are raw text counted as the server counts them; a chat template
           # would add a shared leading block the prefix cache could reuse.
           next(f for f in SKIP_TEMPLATE_FLAGS if f in flags),
           "--custom-output-len", str(output_tokens),
           "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
           "--request-rate", "inf", "--seed", str(seed),
           "--ready-check-timeout-sec", "0",
           "--percentile-metrics", PERCENTILE_METRICS,
           "--metric-percentiles", METRIC_PERCENTILES,
           "--save-result", "--save-detailed",
           "--result-dir", result_dir, "--result-filename", result_file]
    if "--num-warmups" in flags:
        cmd += ["--num-warmups", "0"]
    if ignore_eos:
        cmd.append("--ignore-eos")
    for flag in ("--disable-shuffle", "--no-oversample", "--disable-tqdm"):
        if flag in flags:
            cmd.append(flag)
    if "--request-id-prefix" in flags:
        cmd += ["--request-id-prefix", request_id_prefix]
    cmd += ["--metadata", *[f"{k}={v}" for k, v in metadata.items()]]
    return cmd


def check_result(path: Path, expected: int) -> str:
    """'' when the result file exists and every request succeeded, else the problem."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"{path.name}: no readable result ({exc})"
    if data.get("failed") != 0 or data.get("completed") != expected:
        return (f"{path.name}: {data.get('completed')} of {expected} requests completed, "
                f"{data.get('failed')} failed")
    return ""


# --- evidence -------------------------------------------------------------------------

sha256_file = podcommon.sha256_file


def write_evidence(run_dir: Path, index: dict) -> dict[str, str]:
    """SHA256SUMS (sha256sum -c format) over every file of the run, then index.json."""
    sums = {}
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(run_dir).as_posix()
        if rel in (SUMS, INDEX) or path.name.startswith("."):
            continue
        sums[rel] = sha256_file(path)
    podcommon.atomic_write_text(run_dir / SUMS, "".join(f"{h}  {p}\n" for p, h in sums.items()))
    index["files"] = [{"path": p, "sha256": h, "bytes": (run_dir / p).stat().st_size}
                      for p, h in sums.items()]
    podcommon.atomic_write_text(run_dir / INDEX, json.dumps(index, indent=1, sort_keys=True) + "\n")
    return sums


def _engine_version() -> str:
    try:
        return version("vllm")
    except Exception:  # the index still records everything else
        return "unknown"


def run(args: argparse.Namespace) -> int:
    api_key = os.environ.get("OPENAI_API_KEY")
    started = datetime.datetime.now(datetime.timezone.utc)
    run_id = args.run_id or f"{started:%Y%m%dT%H%M%SZ}-{os.environ.get('HOSTNAME', 'local')}"
    run_dir = Path(args.results) / run_id
    (run_dir / "prompts").mkdir(parents=True, exist_ok=False)
    index = {"run_id": run_id, "receipt": args.receipt, "status": "running",
             "started": started.isoformat(timespec="seconds"),
             "engine_image": os.environ.get("K3_ENGINE_IMAGE", ""),
             "engine_version": _engine_version(), "base_url": args.base_url,
             "served_model_name": args.served_model_name, "workload": wl.WORKLOAD_ID,
             "seed": args.seed, "ignore_eos": args.ignore_eos, "sets": []}
    problems: list[str] = []
    try:
        wait_for_health(args.base_url, args.health_timeout, api_key=api_key)
        check_model(args.base_url, args.served_model_name, api_key)
        flags = bench_flags(bench_help())
        check_flags(flags, args.ignore_eos)

        corpus_root = (wl.package_dir(args.corpus.split(":", 1)[1])
                       if args.corpus.startswith("package:") else Path(args.corpus))
        corpus = wl.load_corpus(corpus_root)
        count, ids = wl.load_token_counter(args.tokenizer or args.model_dir,
                                           trust_remote_code=False)
        sets = wl.build_workload(corpus, count, seed=args.seed, run_id=run_id,
                                 concurrencies=args.concurrencies, runs=args.runs,
                                 warmup_requests=args.warmups,
                                 measured_requests=args.measured,
                                 min_tokens=args.min_tokens, max_tokens=args.max_tokens)
        clashes = wl.shared_leading_blocks([p for s in sets for p in s.prompts], ids,
                                           args.block_size)
        if clashes:
            raise BenchmarkError(f"prompts share their first KV block: {clashes}")
        checked = check_server_counts(args.base_url, args.served_model_name, api_key,
                                      [p for s in sets for p in s.prompts])
        log(f"{checked} prompt lengths agree with the server's {TOKENIZE_PATH}")
        meta = wl.manifest(sets, seed=args.seed, run_id=run_id, corpus_root=str(corpus_root),
                           corpus=corpus, min_tokens=args.min_tokens,
                           max_tokens=args.max_tokens,
                           tokenizer=args.tokenizer or args.model_dir)
        wl.write_workload(run_dir / "prompts", sets, meta)
        log(f"run {run_id}: {sum(len(s.prompts) for s in sets)} prompts from "
            f"{meta['corpus']['files']} files of {corpus_root}")

        for s, info in zip(sets, meta["sets"]):
            dataset = run_dir / "prompts" / f"{s.name}.jsonl"
            cmd = bench_command(
                flags, base_url=args.base_url, served_model_name=args.served_model_name,
                model_dir=args.model_dir, dataset=str(dataset), num_prompts=len(s.prompts),
                concurrency=s.concurrency, output_tokens=args.output_tokens,
                result_dir=str(run_dir), result_file=f"{s.name}.json", seed=args.seed,
                ignore_eos=args.ignore_eos, request_id_prefix=f"k3-{run_id}-{s.name}-",
                metadata={"k3_workload": wl.WORKLOAD_ID, "k3_role": s.role,
                          "k3_run": str(s.run), "k3_run_id": run_id,
                          "k3_seed": str(args.seed),
                          "k3_ignore_eos": "true" if args.ignore_eos else "false",
                          "k3_dataset_sha256": info["dataset_sha256"],
                          "k3_receipt": args.receipt, "k3_topology": args.topology})
            log(f"{s.name}: {len(s.prompts)} request(s) at concurrency {s.concurrency}")
            with open(run_dir / f"{s.name}.log", "w", encoding="utf-8") as out:
                rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    check=False).returncode
            problem = (f"{s.name}: vllm bench serve exited {rc}" if rc
                       else check_result(run_dir / f"{s.name}.json", len(s.prompts)))
            index["sets"].append({"name": s.name, "run": s.run, "concurrency": s.concurrency,
                                  "role": s.role, "result": f"{s.name}.json",
                                  "ok": not problem})
            if problem:
                problems.append(problem)
                log(problem)
            # Each invocation's raw files are hashed as soon as they exist: a Job cut
            # short by its deadline mid-sweep still leaves checkable evidence.
            write_evidence(run_dir, index)
    except (BenchmarkError, wl.WorkloadError) as exc:
        problems.append(str(exc))
        log(str(exc))
    index["status"] = "failed" if problems else "complete"
    index["problems"] = problems
    index["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    write_evidence(run_dir, index)
    if problems:
        log(f"run {run_id} FAILED; raw files kept in {run_dir}")
        return 1
    podcommon.atomic_write_text(Path(args.results) / LATEST, run_id + "\n")
    log(f"run {run_id} complete: {run_dir} (SHA256SUMS, index.json)")
    return judge(args, run_dir, index) if args.gate else 0


# --- the rollout gate (k3infra/serving/rollout.py) -------------------------------------

# The kubelet keeps at most 4096 bytes of a termination message: the verdict's last lines.
TERMINATION_BYTES = 4000


def measured_points(run_dir: Path, index: dict) -> list[tuple[int, str, float]]:
    """(concurrency, p50|p99, e2el ms) of every measured invocation of the run, as vLLM
    computed them (the figures `bench compare` reads from the same files)."""
    points = []
    for s in index["sets"]:
        if s["role"] != "measured":
            continue
        data = json.loads((run_dir / s["result"]).read_text())
        points += [(int(s["concurrency"]), stat, float(data[f"{stat}_e2el_ms"]))
                   for stat in ("p50", "p99")]
    return points


def judge(args: argparse.Namespace, run_dir: Path, index: dict) -> int:
    """The canary's run against the receipt (--gate): 0 promotes, 1 refuses. The table is
    the container's termination message, which `pulumi up` prints when the Job fails."""
    spec = json.loads(args.gate)
    points = measured_points(run_dir, index)
    if spec.get("candidate"):
        rows = verdict.gate_rows([], points, 0.0)
        text = (verdict.gate_table(spec["receipt"], 0.0, rows).rsplit("\n", 1)[0]
                + f"\nRECORDED: receipt {spec['receipt']} is a candidate, nothing to judge; "
                f"run {index['run_id']} is its first measurement (k3infra bench fetch --gate, "
                f"then k3infra bench receipt --base {spec['receipt']}); nothing is promoted")
        passed = True
    else:
        rows = verdict.gate_rows(spec["figures"], points, float(spec["tolerance_pct"]))
        text = verdict.gate_table(spec["receipt"], float(spec["tolerance_pct"]), rows)
        passed = verdict.gate_passes(rows)
    print(text, flush=True)
    index["gate"] = {"receipt": spec["receipt"], "passed": passed, "table": text}
    write_evidence(run_dir, index)
    try:
        with open(args.termination_log, "w", encoding="utf-8") as out:
            out.write(text[-TERMINATION_BYTES:])
    except OSError as exc:       # outside a pod: the table is on stdout
        log(f"no termination message ({exc})")
    return 0 if passed else 1


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="the serving Service, without /v1")
    ap.add_argument("--served-model-name", required=True)
    ap.add_argument("--model-dir", required=True, help="the served model's directory")
    ap.add_argument("--tokenizer", help="default: --model-dir")
    ap.add_argument("--corpus", default="package:vllm")
    ap.add_argument("--results", required=True)
    ap.add_argument("--run-id")
    ap.add_argument("--receipt", required=True)
    ap.add_argument("--concurrencies", type=podcommon.int_list, required=True)
    ap.add_argument("--runs", type=int, required=True)
    ap.add_argument("--warmups", type=int, required=True)
    ap.add_argument("--measured", type=int, required=True)
    ap.add_argument("--min-tokens", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--output-tokens", type=int, required=True)
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--topology", default="single-node",
                    help="the serving replica's topology, recorded in every result file")
    ap.add_argument("--health-timeout", type=float, default=3600.0)
    ap.add_argument("--gate", help="the rollout gate's judgement (JSON: receipt, tolerance_pct, "
                    "figures; or candidate): exit 1 when the run is outside it")
    ap.add_argument("--termination-log", default="/dev/termination-log")
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
