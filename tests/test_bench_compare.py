"""`k3infra bench compare`: result files in vLLM's exact layout for pass, fail, mismatched
workload and malformed cases. Figures are derived from the receipt, never typed in."""
import json

import pytest

from k3infra.bench import compare as c
from k3infra.bench.results import ResultError, load_result, parse_result, percentile
from k3infra.bench.workload import WORKLOAD_ID
from k3infra.cli import main
from k3infra.receipt import load_receipt

from bench_results import receipt_latencies_ms, result_dict, write_result

_W = load_receipt().workload_a
MID_PROMPT = (_W.prompt_tokens_min + _W.prompt_tokens_max) // 2
META = {"k3_workload": WORKLOAD_ID, "k3_role": "measured", "k3_ignore_eos": "true",
        "k3_run": "1"}


@pytest.fixture
def point(receipt):
    """The receipt's measured point (concurrency, p50, p99)."""
    m = next(m for m in receipt.measured if m.metric == "e2el")
    return m


def _result(receipt, point, scale=1.0, **kw):
    lat = [v * scale for v in receipt_latencies_ms(point.p50_ms, point.p99_ms)]
    kw.setdefault("metadata", META)
    kw.setdefault("concurrency", point.concurrency)
    kw.setdefault("output_len", receipt.workload_a.output_tokens_max)
    lo, hi = receipt.workload_a.prompt_tokens_min, receipt.workload_a.prompt_tokens_max
    kw.setdefault("input_lens", [(lo + hi) // 2] * (len(lat) + kw.get("failed", 0)))
    return parse_result(result_dict(lat, **kw), "run1-c8-measured.json")


def test_fixture_layout_is_vllms(receipt, point):
    data = result_dict(receipt_latencies_ms(point.p50_ms, point.p99_ms))
    for key in ("date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate",
                "burstiness", "max_concurrency", "duration", "completed", "failed",
                "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "total_token_throughput", "input_lens", "output_lens",
                "ttfts", "itls", "latencies", "generated_texts", "errors", "mean_ttft_ms",
                "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "p50_e2el_ms", "p99_e2el_ms",
                "mean_tpot_ms", "p50_itl_ms"):
        assert key in data, key
    r = parse_result(data, "x")
    assert r.p50_e2el_ms == pytest.approx(point.p50_ms)
    assert r.p99_e2el_ms == pytest.approx(point.p99_ms)


def test_percentile_matches_numpy():
    import numpy as np

    values = [3.0, 1.0, 7.5, 2.25, 9.0, 4.0]
    for p in (0, 1, 50, 90, 99, 100):
        assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))


def test_result_at_the_receipt_figures_passes(receipt, point):
    cmp = c.compare_results([_result(receipt, point)], receipt)
    assert cmp.exit_status() == c.EXIT_PASS
    assert [r.verdict(cmp.tolerance_pct) for r in cmp.rows] == ["pass", "pass"]
    assert cmp.reasons() == []


def test_twenty_percent_slower_fails_and_says_why(receipt, point):
    cmp = c.compare_results([_result(receipt, point, scale=1.2)], receipt)
    assert cmp.exit_status() == c.EXIT_OUTSIDE_TOLERANCE
    assert [r.verdict(cmp.tolerance_pct) for r in cmp.rows] == ["FAIL", "FAIL"]
    assert [round(r.delta_pct(), 1) for r in cmp.rows] == [20.0, 20.0]
    reasons = cmp.reasons()
    assert len(reasons) == 2 and "20.0 % above" in reasons[0]
    assert f"{point.p50_ms:.0f} ms" in reasons[0]


def test_far_faster_is_suspect_too(receipt, point):
    cmp = c.compare_results([_result(receipt, point, scale=0.8)], receipt)
    assert cmp.exit_status() == c.EXIT_OUTSIDE_TOLERANCE
    assert "below" in cmp.reasons()[0]


def test_tolerance_is_configurable(receipt, point):
    r = _result(receipt, point, scale=1.05)
    assert c.compare_results([r], receipt).exit_status() == c.EXIT_PASS
    assert c.compare_results([r], receipt, tolerance_pct=3).exit_status() == \
        c.EXIT_OUTSIDE_TOLERANCE
    with pytest.raises(ValueError):
        c.compare_results([r], receipt, tolerance_pct=-1)


@pytest.mark.parametrize("change, what", [
    (dict(failed=1), "failed requests"),
    (dict(concurrency=None), "concurrency"),
    (dict(input_lens=[20000, 20000, 20000]), "prompt tokens"),
    (dict(output_len=300), "output tokens"),
    (dict(metadata={**META, "k3_role": "warmup"}), "role"),
    (dict(metadata={**META, "k3_workload": "random"}), "workload"),
])
def test_mismatched_workload_is_not_comparable(receipt, point, change, what):
    cmp = c.compare_results([_result(receipt, point, **change)], receipt)
    assert cmp.exit_status() == c.EXIT_MISMATCH
    assert any(m.what.startswith(what) for m in cmp.mismatches), cmp.mismatches
    assert {r.verdict(cmp.tolerance_pct) for r in cmp.rows} == {"not comparable"}


def test_output_below_the_cap_with_eos_ignored_is_a_mismatch(receipt, point):
    cap = receipt.workload_a.output_tokens_max
    cmp = c.compare_results([_result(receipt, point, output_len=cap - 10)], receipt)
    assert [m.what for m in cmp.mismatches] == ["output tokens (EOS ignored)"]
    natural = _result(receipt, point, output_len=cap - 10,
                      metadata={**META, "k3_ignore_eos": "false"})
    assert c.compare_results([natural], receipt).exit_status() == c.EXIT_PASS


def test_wrong_request_count_is_a_mismatch(receipt, point):
    lat = receipt_latencies_ms(point.p50_ms, point.p99_ms)
    r = parse_result(result_dict(lat + [point.p50_ms], metadata=META,
                                 input_lens=[MID_PROMPT] * 4), "four.json")
    cmp = c.compare_results([r], receipt)
    assert [m.what for m in cmp.mismatches] == ["measured requests"]


def test_percentiles_that_disagree_with_the_per_request_latencies(receipt, point):
    data = result_dict(receipt_latencies_ms(point.p50_ms, point.p99_ms), metadata=META,
                       input_lens=[MID_PROMPT] * 3)
    data["p50_e2el_ms"] -= 500.0                   # edited figure
    cmp = c.compare_results([parse_result(data, "edited.json")], receipt)
    assert [m.what for m in cmp.mismatches] == ["p50_e2el_ms vs latencies"]


def test_without_save_detailed_the_means_are_checked(receipt, point):
    data = result_dict(receipt_latencies_ms(point.p50_ms, point.p99_ms), metadata=META,
                       input_lens=[MID_PROMPT] * 3, detailed=False)
    cmp = c.compare_results([parse_result(data, "plain.json")], receipt)
    assert cmp.exit_status() == c.EXIT_PASS
    assert any("mean; no input_lens" in ch.what for ch in cmp.checks)


def test_only_unmeasured_concurrencies_compare_nothing(receipt, point):
    other = next(x for x in receipt.workload_a.concurrencies if receipt.measurement(x) is None)
    cmp = c.compare_results([_result(receipt, point, concurrency=other)], receipt)
    assert {r.verdict(cmp.tolerance_pct) for r in cmp.rows} == {"new evidence"}
    assert cmp.exit_status() == c.EXIT_OUTSIDE_TOLERANCE
    assert "nothing was compared" in cmp.reasons()[-1]


def test_wide_sweep_points_are_new_evidence_beside_the_judged_point(receipt, point):
    wide = receipt.workload_a.wide_sweep
    assert (wide.concurrencies, wide.output_tokens_max) == ([32, 128], 2048)
    lat = receipt_latencies_ms(point.p50_ms, point.p99_ms)
    files = [_result(receipt, point)]
    for conc in (32, 128):      # 2048-token outputs, many more requests than the grid's 3
        files.append(parse_result(result_dict(lat * 4, concurrency=conc, output_len=2048,
                                               metadata=META, input_lens=[MID_PROMPT] * 12),
                                  f"run1-c{conc}-measured.json"))
    cmp = c.compare_results(files, receipt)
    assert cmp.mismatches == []
    assert cmp.exit_status() == c.EXIT_PASS
    verdicts = {(r.concurrency, r.stat): r.verdict(cmp.tolerance_pct) for r in cmp.rows}
    assert verdicts == {(8, "p50"): "pass", (8, "p99"): "pass",
                        (32, "p50"): "new evidence", (32, "p99"): "new evidence",
                        (128, "p50"): "new evidence", (128, "p99"): "new evidence"}
    assert any("new evidence" in r and "32, 128" in r for r in cmp.reasons())


def test_wide_sweep_output_above_its_cap_is_a_mismatch(receipt, point):
    lat = receipt_latencies_ms(point.p50_ms, point.p99_ms)
    r = parse_result(result_dict(lat, concurrency=32, output_len=2100, metadata=META,
                                 input_lens=[MID_PROMPT] * 3), "c32.json")
    cmp = c.compare_results([r], receipt)
    assert [m.what for m in cmp.mismatches] == ["output tokens (EOS ignored)"]


# --- malformed files ---------------------------------------------------------------------

def test_missing_e2el_keys_name_the_flag(receipt, point, tmp_path):
    data = result_dict(receipt_latencies_ms(point.p50_ms, point.p99_ms),
                       percentile_metrics=("ttft", "tpot", "itl"))
    path = write_result(tmp_path / "no-e2el.json", data)
    with pytest.raises(ResultError, match="missing key 'p50_e2el_ms'.*--percentile-metrics"):
        load_result(path)


@pytest.mark.parametrize("text, message", [
    ("{not json", r"not JSON \(Expecting property name.*line 1, column 2"),
    ("[1, 2]", "is not a JSON object"),
    ('{"a": 1}\n{"b": 2}', "more than one JSON document"),
])
def test_unreadable_files(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ResultError, match=message):
        load_result(path)


def test_wrong_types_and_lengths(receipt, point):
    base = result_dict(receipt_latencies_ms(point.p50_ms, point.p99_ms))
    for key, value, message in (("completed", "3", r"completed: Input should be a valid integer \(got '3'\)"),
                                ("failed", 0.5, r"failed: Input should be a valid integer \(got 0.5\)"),
                                ("latencies", [1.0], "has 1 entries"),
                                ("input_lens", [1, "x", 3], r"input_lens\[1\]"),
                                ("p99_e2el_ms", float("nan"), "finite number"),
                                ("completed", True, "valid integer"),
                                ("duration", -1.0, "greater than or equal to 0"),
                                ("itls", [[1.0], "x", [2.0]], r"itls\[1\]")):
        data = dict(base, **{key: value})
        with pytest.raises(ResultError, match=message):
            parse_result(data, "f.json")
    data = dict(base)
    del data["max_concurrency"]
    with pytest.raises(ResultError, match="max_concurrency"):
        parse_result(data, "f.json")


# --- the command -------------------------------------------------------------------------

def _file(tmp_path, receipt, point, name, **kw):
    scale = kw.pop("scale", 1.0)
    lat = [v * scale for v in receipt_latencies_ms(point.p50_ms, point.p99_ms)]
    data = result_dict(lat, metadata=META, concurrency=point.concurrency,
                       input_lens=[MID_PROMPT] * (3 + kw.get("failed", 0)), **kw)
    return str(write_result(tmp_path / name, data))


def test_cli_pass_and_twenty_percent_slower(tmp_path, receipt, point, capsys):
    ok = _file(tmp_path, receipt, point, "ok.json")
    slow = _file(tmp_path, receipt, point, "slow.json", scale=1.2)
    assert main(["bench", "compare", ok]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "pass" in out and f"{point.p50_ms:.0f}" in out
    assert main(["bench", "compare", slow]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "+20.0 %" in out and "20.0 % above" in out
    assert main(["bench", "compare", slow, "--tolerance-pct", "25"]) == 0


def test_cli_mismatch_and_malformed(tmp_path, receipt, point, capsys):
    failed = _file(tmp_path, receipt, point, "failed.json", failed=1)
    assert main(["bench", "compare", failed]) == 3
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "failed requests" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"completed": 3}))
    assert main(["bench", "compare", str(bad)]) == 2
    assert "bad.json: missing key" in capsys.readouterr().err
    assert main(["bench", "compare", str(tmp_path / "absent.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_cli_plot_writes_a_png(tmp_path, receipt, point):
    ok = _file(tmp_path, receipt, point, "ok.json")
    slow = _file(tmp_path, receipt, point, "slow.json", scale=1.2)
    png = tmp_path / "plot" / "latency.png"
    png.parent.mkdir()
    assert main(["bench", "compare", ok, slow, "--plot", str(png)]) == 1
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_vllm_0_25_results_without_latencies_use_ttft_plus_itls(receipt):
    """tests/fixtures/vllm-0.25.0-h200-workload-a-c8.json: a real `vllm bench serve`
    result of vLLM 0.25.0 (Workload A, concurrency 8, through the rendered proxy on the
    H200; issue 29). 0.25.0 writes no `latencies`: they are ttft + sum(itls), and they
    must still agree with the file's own p50/p99; an edited figure is still caught."""
    from pathlib import Path

    path = Path(__file__).resolve().parent / "fixtures" / "vllm-0.25.0-h200-workload-a-c8.json"
    r = load_result(path)
    assert r.latencies_from == "ttfts + itls"
    assert [round(v) for v in r.successful_latencies_ms] == [5913, 5942, 5961]

    def agreement(result):
        return {ch.what: ch.ok for ch in c.workload_checks(result, receipt) if " vs " in ch.what}

    assert agreement(r) == {"p50_e2el_ms vs ttfts + itls": True,
                            "p99_e2el_ms vs ttfts + itls": True}
    data = json.loads(path.read_text())
    data["p99_e2el_ms"] -= 50.0
    assert agreement(parse_result(data, "edited.json"))["p99_e2el_ms vs ttfts + itls"] is False
