"""The accuracy smoke test's runner: lm-eval against an OpenAI-compatible endpoint, every
file kept with its hash. Standard library only: the same file runs on a host
(`k3infra accuracy run`) and in the AccuracySmoke Job (mounted from a ConfigMap).

It drives lm-eval's own `local-chat-completions` model (lm_eval/models/
openai_completions.py), which sends `Authorization: Bearer $OPENAI_API_KEY`; the key
comes from the environment (the serving Secret in the Job) and never reaches argv or a
file. Per run, under <results>/<run id>/:

  config.json        the exact task configuration and the lm-eval command (no key)
  lm-eval/...        lm-eval's own results_*.json and samples_<task>_*.jsonl
  lm-eval.log        its output
  scores.json        per task: metric, score, sample count (what `accuracy compare` reads)
  SHA256SUMS         sha256sum -c format over every file above, written before the
                     scores are summarised and again after
  index.json         status, problems

<results>/LATEST names the last run whose every task produced a score.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

SCHEMA = "k3infra.accuracy-smoke/v1"
LABEL = "smoke test"
LATEST, SUMS, INDEX, SCORES, CONFIG = "LATEST", "SHA256SUMS", "index.json", "scores.json", "config.json"
LM_EVAL_DIR, LM_EVAL_LOG = "lm-eval", "lm-eval.log"
# The metric each shipped task is judged on (exact match after the task's filter).
METRIC = "exact_match"


class AccuracyRunError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[k3-accuracy] {msg}", flush=True)


def lm_eval_command(lm_eval: Sequence[str], *, endpoint: str, model: str, tasks: Sequence[str],
                    include_path: str, limit: int, max_tokens: int, seed: int,
                    concurrency: int, request_timeout: int, max_retries: int,
                    output_path: str) -> list[str]:
    """lm-eval's CLI with a fixed, fully stated configuration: temperature 0, fixed max
    tokens, the tasks' own fixed few-shot, the same seed everywhere, first `limit` items."""
    base = endpoint.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    model_args = ",".join([
        f"model={model}", f"base_url={base}/v1/chat/completions",
        f"num_concurrent={concurrency}", f"max_retries={max_retries}",
        f"timeout={request_timeout}", f"max_gen_toks={max_tokens}", f"seed={seed}",
        "tokenized_requests=False"])
    return [*lm_eval, "run", "--model", "local-chat-completions", "--model_args", model_args,
            "--tasks", ",".join(tasks), "--include_path", include_path,
            "--limit", str(limit), "--apply_chat_template", "--fewshot_as_multiturn",
            "--gen_kwargs", f"temperature=0,max_gen_toks={max_tokens}",
            "--seed", ",".join([str(seed)] * 4), "--batch_size", "1",
            "--log_samples", "--output_path", output_path]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_sums(run_dir: Path) -> dict[str, str]:
    """SHA256SUMS over every file of the run (itself excluded), sha256sum -c format."""
    sums = {str(p.relative_to(run_dir)): sha256_file(p)
            for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != SUMS and not p.name.endswith(".tmp")}
    _atomic_write(run_dir / SUMS, "".join(f"{h}  {f}\n" for f, h in sums.items()))
    return sums


def _metric_value(task_results: dict) -> Optional[tuple[str, float]]:
    """lm-eval keys metrics as `<metric>,<filter>`; prefer the shipped tasks' filter."""
    keys = sorted(k for k in task_results if k.split(",")[0] == METRIC)
    for key in keys:
        value = task_results[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return key, float(value)
    return None


def collect_scores(lm_dir: Path, tasks: Sequence[str]) -> tuple[dict, list[str]]:
    """Scores from lm-eval's newest results file, sample counts from its samples files."""
    problems: list[str] = []
    results_files = sorted(lm_dir.rglob("results_*.json"))
    if not results_files:
        return {}, [f"lm-eval wrote no results_*.json under {lm_dir}"]
    data = json.loads(results_files[-1].read_text(encoding="utf-8"))
    scores: dict[str, dict] = {}
    for task in tasks:
        res = data.get("results", {}).get(task)
        found = _metric_value(res) if isinstance(res, dict) else None
        if found is None:
            problems.append(f"{task}: no {METRIC} score in {results_files[-1].name}")
            continue
        samples = sorted(lm_dir.rglob(f"samples_{task}_*.jsonl"))
        n = sum(1 for line in samples[-1].read_text(encoding="utf-8").splitlines()
                if line.strip()) if samples else 0
        if not n:
            problems.append(f"{task}: no per-sample outputs (samples_{task}_*.jsonl)")
            continue
        scores[task] = {"metric": found[0], "score": found[1], "samples": n,
                        "samples_file": str(samples[-1].relative_to(lm_dir.parent))}
    return scores, problems


def run(args: argparse.Namespace) -> int:
    started = datetime.datetime.now(datetime.timezone.utc)
    run_id = args.run_id or f"{started:%Y%m%dT%H%M%SZ}-{os.environ.get('HOSTNAME', 'local')}"
    env = dict(os.environ, HF_DATASETS_OFFLINE=os.environ.get("HF_DATASETS_OFFLINE", "1"),
               HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    if args.datasets_copy:
        env["HF_DATASETS_CACHE"] = copy_datasets_cache(Path(args.datasets_copy))
    run_dir = Path(args.results) / run_id
    run_dir.mkdir(parents=True, exist_ok=False)
    lm_eval = shlex.split(args.lm_eval) if args.lm_eval else [sys.executable, "-m", "lm_eval"]
    cmd = lm_eval_command(lm_eval, endpoint=args.endpoint, model=args.model, tasks=args.tasks,
                          include_path=args.tasks_dir, limit=args.limit,
                          max_tokens=args.max_tokens, seed=args.seed,
                          concurrency=args.concurrency, request_timeout=args.request_timeout,
                          max_retries=args.max_retries, output_path=str(run_dir / LM_EVAL_DIR))
    config = {"schema": SCHEMA, "label": LABEL, "run_id": run_id,
              "endpoint": args.endpoint, "model": args.model,
              "task_config": {"tasks": list(args.tasks), "limit": args.limit,
                              "few_shot": "fixed by each task file (first_n sampler)",
                              "temperature": 0, "max_tokens": args.max_tokens,
                              "seed": args.seed, "chat_template": True,
                              "tasks_dir_files": {p.name: sha256_file(p) for p in
                                                  sorted(Path(args.tasks_dir).glob("*"))
                                                  if p.is_file()}},
              "harness": _harness_version(lm_eval), "command": cmd,
              "engine_image": os.environ.get("K3_ENGINE_IMAGE", ""),
              "started": started.isoformat(timespec="seconds")}
    _atomic_write(run_dir / CONFIG, json.dumps(config, indent=2) + "\n")
    log(f"run {run_id}: {', '.join(args.tasks)} x {args.limit} against {args.endpoint}")
    with open(run_dir / LM_EVAL_LOG, "w", encoding="utf-8") as out:
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=args.tasks_dir, timeout=args.timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            rc = None
    problems = ([f"lm-eval did not finish within {args.timeout} s"] if rc is None else
                [f"lm-eval exited {rc} (see {LM_EVAL_LOG})"] if rc else [])
    # The raw outputs are hashed before anything is summarised from them.
    write_sums(run_dir)
    scores: dict = {}
    if not problems:
        scores, problems = collect_scores(run_dir / LM_EVAL_DIR, args.tasks)
    _atomic_write(run_dir / SCORES, json.dumps(
        {"schema": SCHEMA, "label": LABEL, "run_id": run_id, "harness": config["harness"],
         "task_config": config["task_config"], "scores": scores}, indent=2) + "\n")
    index = {"run_id": run_id, "status": "failed" if problems else "complete",
             "problems": problems, "label": LABEL,
             "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    _atomic_write(run_dir / INDEX, json.dumps(index, indent=2) + "\n")
    write_sums(run_dir)
    for p in problems:
        log(p)
    if problems:
        log(f"run {run_id} FAILED; raw files kept in {run_dir}")
        return 1
    _atomic_write(Path(args.results) / LATEST, run_id + "\n")
    for task, s in scores.items():
        log(f"{task}: {s['metric']} {s['score']:.4f} over {s['samples']} samples ({LABEL})")
    log(f"run {run_id} complete: {run_dir}")
    return 0


def datasets_cache() -> Path:
    """Where `datasets` reads its cache: HF_DATASETS_CACHE, else $HF_HOME/datasets, else
    ~/.cache/huggingface/datasets (datasets/config.py)."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "datasets"


def copy_datasets_cache(dest: Path) -> str:
    """A writable copy of the image's datasets cache: `datasets` takes a lock file in the
    cache's root for every dataset it loads, even offline and from the cache, so a cache
    on a read-only root file system fails every load (EROFS)."""
    src = datasets_cache()
    if not src.is_dir():
        raise AccuracyRunError(f"no datasets cache at {src}: the image must hold the tasks' "
                               "datasets where its HF_DATASETS_CACHE names (docs/accuracy.md)")
    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.lock"))
    log(f"datasets cache {src} copied to {dest} (writable: datasets locks what it loads)")
    return str(dest)


def _harness_version(lm_eval: Sequence[str]) -> str:
    """lm-eval's version as installed beside the command that runs it."""
    probe = [*lm_eval[:-2], "-c", "import importlib.metadata as m; print(m.version('lm_eval'))"] \
        if list(lm_eval[-2:]) == ["-m", "lm_eval"] else None
    if probe is None:
        python = Path(shutil.which(lm_eval[0]) or lm_eval[0]).with_name("python")
        probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('lm_eval'))"]
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=60, check=False)
        version = out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    return f"lm-eval {version}" if version else "lm-eval (version unknown)"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="accuracy smoke test with lm-eval")
    ap.add_argument("--endpoint", required=True, help="http(s)://host:port (with or without /v1)")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--results", required=True)
    ap.add_argument("--tasks-dir", required=True, help="the task YAML files (lm-eval --include_path)")
    ap.add_argument("--tasks", required=True, type=lambda s: [t for t in s.split(",") if t])
    ap.add_argument("--limit", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--request-timeout", type=int, default=300)
    ap.add_argument("--max-retries", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=3600, help="the whole lm-eval run, seconds")
    ap.add_argument("--lm-eval", default="", help="the lm-eval command (default: python -m lm_eval)")
    ap.add_argument("--run-id", default="")
    ap.add_argument("--datasets-copy", default="", metavar="DIR",
                    help="run lm-eval on a writable copy of the datasets cache, made in DIR")
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not os.environ.get("OPENAI_API_KEY"):
        log("OPENAI_API_KEY is not set: the endpoint's API key (the serving Secret)")
        return 2
    try:
        return run(args)
    except AccuracyRunError as exc:
        log(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
