"""`k3infra accuracy compare`: the Wilson band against literal figures, accepting the
first run into a receipt copy, judging later runs, and the plot. Run directories are
written here in the runner's layout (the real lm-eval path: test_accuracy_lmeval.py)."""
import json

import pytest

from k3infra.accuracy import runner
from k3infra.accuracy.compare import wilson_interval
from k3infra.cli import main
from k3infra.receipt import load_receipt

CONFIG = {"tasks": ["k3_smoke_gsm8k", "k3_smoke_arc"], "limit": 100, "temperature": 0,
          "max_tokens": 1024, "seed": 0}


def _run_dir(root, run_id, scores, config=CONFIG, status="complete"):
    d = root / run_id
    d.mkdir(parents=True)
    (d / "lm-eval").mkdir()
    (d / "lm-eval" / "samples_k3_smoke_gsm8k_x.jsonl").write_text('{"doc_id": 0}\n')
    (d / "config.json").write_text(json.dumps({"engine_image": "img@sha256:" + "b" * 64}))
    (d / "scores.json").write_text(json.dumps({
        "label": "smoke test", "run_id": run_id, "harness": "lm-eval 0.4.13",
        "task_config": config,
        "scores": {t: {"metric": "exact_match,f", "score": s, "samples": n}
                   for t, (s, n) in scores.items()}}))
    (d / "index.json").write_text(json.dumps({"status": status, "problems": []}))
    runner.write_sums(d)
    return d


# Wilson score interval, z = 2.5758 (99 %), worked by hand:
#   p = 0.9, n = 100: z^2/n = 0.066349; centre = (0.9 + 0.0331745) / 1.066349 = 0.875120
#   half = 2.5758 / 1.066349 x sqrt(0.0009 + 0.00016587) = 2.415585 x 0.032648 = 0.078863
#   -> [0.79626, 0.95398]
#   p = 1.0, n = 20: centre = (1 + 0.165873) / 1.331746 = 0.875446,
#   half = 1.934205 x sqrt(6.634896 / 1600) = 1.934205 x 0.064396 = 0.124555 -> [0.75089, 1]
def test_wilson_band_hand_worked():
    lo, hi = wilson_interval(0.9, 100)
    assert lo == pytest.approx(0.79626, abs=1e-4) and hi == pytest.approx(0.95398, abs=1e-4)
    lo, hi = wilson_interval(1.0, 20)
    assert lo == pytest.approx(0.75089, abs=1e-4) and hi == 1.0
    with pytest.raises(ValueError):
        wilson_interval(1.2, 10)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 20, 100, 1000])
def test_wilson_band_holds_its_own_score_at_the_edges(n):
    # p = 0 gave a lower bound of 5.6e-17 at n = 4: a zero score failed its own baseline.
    assert wilson_interval(0.0, n)[0] == 0.0 and wilson_interval(1.0, n)[1] == 1.0


def test_a_zero_score_passes_against_itself(tmp_path, capsys):
    # The node's random-weight model scores 0 on both tasks at limit 4 (issue 27).
    run = _run_dir(tmp_path, "zero", {"k3_smoke_gsm8k": (0.0, 4), "k3_smoke_arc": (0.0, 4)})
    receipt = tmp_path / "receipt.yaml"
    assert main(["accuracy", "compare", str(run), "--accept", "--out", str(receipt)]) == 0
    assert main(["accuracy", "compare", str(run), "--receipt", str(receipt)]) == 0
    assert "PASS" in capsys.readouterr().out


def test_accept_then_compare_then_fail(tmp_path, capsys):
    base = _run_dir(tmp_path, "base", {"k3_smoke_gsm8k": (0.93, 100), "k3_smoke_arc": (0.90, 100)})
    assert main(["accuracy", "compare", str(base)]) == 1
    assert "has no accuracy baseline" in capsys.readouterr().out
    receipt = tmp_path / "receipt.yaml"
    assert main(["accuracy", "compare", str(base), "--accept", "--out", str(receipt)]) == 0
    assert "accepted run base" in capsys.readouterr().out
    r = load_receipt(str(receipt))
    acc = r.accuracy
    assert acc.label == "smoke test" and acc.harness == "lm-eval 0.4.13"
    assert [(s.task, s.score, s.samples) for s in acc.scores] == [
        ("k3_smoke_arc", 0.9, 100), ("k3_smoke_gsm8k", 0.93, 100)]
    assert acc.engine["commit"] == load_receipt().engine.commit
    assert acc.weights["tree_digest"] == load_receipt().model.tree_digest
    assert {f.file for f in acc.files} >= {"scores.json", "config.json", "index.json"}
    assert "# The measured Kimi K3" in receipt.read_text()           # comments kept
    # a second accept is refused: the baseline is the first accepted run
    assert main(["accuracy", "compare", str(base), "--accept", "--out", str(receipt),
                 "--receipt", str(receipt)]) == 2

    ok = _run_dir(tmp_path, "ok", {"k3_smoke_gsm8k": (0.90, 100), "k3_smoke_arc": (0.86, 100)})
    assert main(["accuracy", "compare", str(ok), "--receipt", str(receipt)]) == 0
    assert "PASS" in capsys.readouterr().out
    bad = _run_dir(tmp_path, "bad", {"k3_smoke_gsm8k": (0.70, 100), "k3_smoke_arc": (0.88, 100)})
    png = tmp_path / "acc.png"
    assert main(["accuracy", "compare", str(bad), "--receipt", str(receipt),
                 "--plot", str(png)]) == 1
    out = capsys.readouterr().out
    assert "k3_smoke_gsm8k: score 0.7000 over 100 samples is outside the baseline 0.9300" in out
    assert "smoke test" in out
    from PIL import Image

    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 400


def test_other_configuration_and_failed_runs(tmp_path, capsys):
    base = _run_dir(tmp_path, "base", {"k3_smoke_gsm8k": (0.93, 100), "k3_smoke_arc": (0.9, 100)})
    receipt = tmp_path / "r.yaml"
    assert main(["accuracy", "compare", str(base), "--accept", "--out", str(receipt)]) == 0
    other = _run_dir(tmp_path, "other", {"k3_smoke_gsm8k": (0.93, 20), "k3_smoke_arc": (0.9, 20)},
                     config={**CONFIG, "limit": 20})
    assert main(["accuracy", "compare", str(other), "--receipt", str(receipt)]) == 3
    assert "task configuration limit: baseline 100, run 20" in capsys.readouterr().out
    failed = _run_dir(tmp_path, "failed", {"k3_smoke_gsm8k": (0.9, 100)}, status="failed")
    assert main(["accuracy", "compare", str(failed), "--receipt", str(receipt)]) == 2
    assert "run status 'failed'" in capsys.readouterr().err


def test_datasets_cache_copy_is_writable_and_leaves_the_locks(tmp_path, monkeypatch):
    """The image's cache is on a read-only root and `datasets` takes a lock file in the
    cache's root for each dataset it loads (EROFS on the node, issue 27): the Job runs
    lm-eval on a copy. Old lock files are not copied; the cache is found like datasets
    finds it (HF_DATASETS_CACHE, else $HF_HOME/datasets)."""
    home = tmp_path / "hf"
    cached = home / "datasets" / "openai___gsm8k" / "main" / "0.0.0" / "abc"
    cached.mkdir(parents=True)
    (cached / "gsm8k-test.arrow").write_bytes(b"arrow")
    (home / "datasets" / "_old.lock").write_text("")
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    assert runner.datasets_cache() == home / "datasets"
    dest = tmp_path / "copy"
    assert runner.copy_datasets_cache(dest) == str(dest)
    assert (dest / "openai___gsm8k/main/0.0.0/abc/gsm8k-test.arrow").read_bytes() == b"arrow"
    assert not (dest / "_old.lock").exists()
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "elsewhere"))
    assert runner.datasets_cache() == tmp_path / "elsewhere"


def test_no_datasets_cache_is_one_line_and_no_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "none"))
    rc = runner.main(["--endpoint", "http://127.0.0.1:9", "--model", "m", "--results",
                      str(tmp_path / "res"), "--tasks-dir", str(tmp_path), "--tasks", "t",
                      "--limit", "1", "--max-tokens", "16", "--datasets-copy",
                      str(tmp_path / "copy")])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 1 and out == [f"[k3-accuracy] no datasets cache at {tmp_path / 'none'}: the "
                               "image must hold the tasks' datasets where its HF_DATASETS_CACHE names "
                               "(docs/accuracy.md)"]
    assert not (tmp_path / "res").exists()


def test_fetch_without_a_cluster_is_one_line(tmp_path, capsys):
    """`accuracy fetch` imported a module that no longer exists (k3infra.bench.cluster):
    a traceback on the node (issue 27). It reads back like `bench fetch`."""
    rc = main(["accuracy", "fetch", "--namespace", "x", "--out", str(tmp_path / "o"),
               "--kubeconfig", str(tmp_path / "none")])
    err = capsys.readouterr()
    assert rc != 0 and "Traceback" not in err.err + err.out
    assert "cannot load kubeconfig" in err.err + err.out
