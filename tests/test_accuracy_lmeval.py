"""The real lm-eval path (lm-eval 0.4.13, local-chat-completions) against a loopback
OpenAI-compatible endpoint that answers from a table: a healthy endpoint passes, a
degraded one (some wrong, malformed, slow, 500s) is caught. Tiny tasks ship as local
files (tests/accuracy_tasks); the Hub is never reached (HF_*_OFFLINE=1)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from accuracy_loopback import API_KEY, TASKS_DIR, LoopbackEndpoint
from k3infra.accuracy import runner
from k3infra.accuracy.compare import (EXIT_MISMATCH, EXIT_OUTSIDE, EXIT_PASS, RunError,
                                      baseline_section, compare_run, load_run)
from k3infra.receipt import AccuracyBaseline, load_receipt

ROOT = Path(__file__).resolve().parents[1]
TASKS = "k3_tiny_arith,k3_tiny_mc"


@pytest.fixture(scope="module")
def lm_eval() -> str:
    for candidate in (os.environ.get("K3INFRA_LM_EVAL"), str(ROOT / ".venv-accuracy/bin/lm_eval"),
                      "/work/main/.venv-accuracy/bin/lm_eval"):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("lm_eval not found: set K3INFRA_LM_EVAL or run `make test` "
                "(it installs requirements-accuracy.txt into .venv-accuracy)")


def _run(lm_eval: str, out: Path, mode: str, *, tasks: str = TASKS, limit: int = 20,
         request_timeout: int = 5, delay_s: float = 0.0, monkeypatch=None) -> tuple[int, Path, LoopbackEndpoint]:
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    with LoopbackEndpoint(mode, delay_s=delay_s) as ep:
        rc = runner.main(["--endpoint", ep.url, "--model", "kimi-k3", "--results", str(out),
                          "--tasks-dir", str(TASKS_DIR), "--tasks", tasks, "--limit", str(limit),
                          "--max-tokens", "64", "--concurrency", "4", "--lm-eval", lm_eval,
                          "--run-id", mode, "--request-timeout", str(request_timeout),
                          "--max-retries", "2", "--timeout", "600"])
    return rc, out / mode, ep


@pytest.fixture(scope="module")
def healthy(lm_eval, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        return _run(lm_eval, tmp_path_factory.mktemp("acc"), "right", monkeypatch=mp)
    finally:
        mp.undo()


def _baseline(run_dir: Path) -> AccuracyBaseline:
    return AccuracyBaseline.model_validate(baseline_section(load_run(run_dir), load_receipt()))


def test_healthy_endpoint_passes_and_keeps_every_file(healthy):
    rc, run_dir, ep = healthy
    assert rc == 0
    assert ep.unauthorised == 0 and len(ep.requests) == 40      # 20 items x 2 tasks
    first = ep.requests[0]
    assert first["temperature"] == 0 and first["max_tokens"] == 64 and first["model"] == "kimi-k3"
    # fixed few-shot: the arithmetic task's first two training items, as chat turns
    arith = [r for r in ep.requests if "apples" in r["messages"][-1]["content"]]
    assert all(len(r["messages"]) == 5 and "Item 1-0" in r["messages"][0]["content"]
               for r in arith)
    scores = json.loads((run_dir / "scores.json").read_text())
    assert scores["label"] == "smoke test"
    assert {t: (s["score"], s["samples"]) for t, s in scores["scores"].items()} == {
        "k3_tiny_arith": (1.0, 20), "k3_tiny_mc": (1.0, 20)}
    sums = (run_dir / "SHA256SUMS").read_text()
    for name in ("scores.json", "config.json", "index.json", "lm-eval.log"):
        assert f"  {name}\n" in sums
    assert "samples_k3_tiny_arith_" in sums and "results_" in sums
    assert (run_dir.parent / "LATEST").read_text() == "right\n"
    config = json.loads((run_dir / "config.json").read_text())
    assert API_KEY not in (run_dir / "config.json").read_text()
    assert config["harness"] == "lm-eval 0.4.13"
    assert "--apply_chat_template" in config["command"] and "--log_samples" in config["command"]
    # the run judged against itself as baseline: inside the band
    cmp = compare_run(load_run(run_dir), _baseline(run_dir))
    assert cmp.exit_status() == EXIT_PASS


def test_some_wrong_answers_are_caught(healthy, lm_eval, tmp_path, monkeypatch):
    rc, run_dir, _ = _run(lm_eval, tmp_path, "some_wrong", monkeypatch=monkeypatch)
    assert rc == 0                      # the harness ran; the scores are what is wrong
    run = load_run(run_dir)
    assert {t: s["score"] for t, s in run.scores.items()} == {"k3_tiny_arith": 0.5,
                                                              "k3_tiny_mc": 0.5}
    cmp = compare_run(run, _baseline(healthy[1]))
    assert cmp.exit_status() == EXIT_OUTSIDE
    assert any("k3_tiny_arith: score 0.5000 over 20 samples is outside the baseline 1.0000"
               in r for r in cmp.reasons())


def test_malformed_replies_score_zero_and_fail(healthy, lm_eval, tmp_path, monkeypatch):
    # lm-eval 0.4.13 logs "Could not parse generations" and grades an empty answer
    rc, run_dir, ep = _run(lm_eval, tmp_path, "malformed", monkeypatch=monkeypatch)
    assert rc == 0 and len(ep.requests) == 40
    cmp = compare_run(load_run(run_dir), _baseline(healthy[1]))
    assert cmp.exit_status() == EXIT_OUTSIDE
    assert [(r.task, r.measured) for r in cmp.rows] == [("k3_tiny_arith", 0.0), ("k3_tiny_mc", 0.0)]


@pytest.mark.parametrize("mode", ["error500", "slow"])
def test_failing_endpoint_fails_the_run(lm_eval, tmp_path, monkeypatch, mode):
    # 500s, or replies slower than the client's 1 s timeout: lm-eval retries (2 attempts
    # per request), then exits 1; the run is failed, its files kept and hashed
    rc, run_dir, ep = _run(lm_eval, tmp_path, mode, tasks="k3_tiny_arith", limit=4,
                           request_timeout=1, delay_s=3.0, monkeypatch=monkeypatch)
    assert rc == 1 and ep.requests
    index = json.loads((run_dir / "index.json").read_text())
    assert index["status"] == "failed"
    assert index["problems"] == ["lm-eval exited 1 (see lm-eval.log)"]
    assert not (run_dir.parent / "LATEST").exists()
    assert "  lm-eval.log\n" in (run_dir / "SHA256SUMS").read_text()
    with pytest.raises(RunError, match="run status 'failed'"):
        load_run(run_dir)


def test_other_task_configuration_is_not_comparable(healthy, lm_eval, tmp_path, monkeypatch):
    rc, run_dir, _ = _run(lm_eval, tmp_path, "right", tasks="k3_tiny_arith", limit=5,
                          monkeypatch=monkeypatch)
    assert rc == 0
    cmp = compare_run(load_run(run_dir), _baseline(healthy[1]))
    assert cmp.exit_status() == EXIT_MISMATCH
    assert any(m.startswith("task configuration limit: baseline 20, run 5") for m in cmp.mismatches)


def test_tampered_file_is_refused(healthy, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(healthy[1], copy)
    scores = copy / "scores.json"
    scores.write_text(scores.read_text().replace('"score": 1.0', '"score": 0.99', 1))
    with pytest.raises(RunError, match="scores.json does not match SHA256SUMS"):
        load_run(copy)
