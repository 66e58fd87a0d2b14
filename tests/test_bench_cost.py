"""`k3infra bench cost`: dollars per million tokens from raw results, checked against
figures worked by hand (below), never against the module's own maths."""
import json

import pytest

from k3infra.bench.cost import cost_rows, usd_per_million
from k3infra.bench.results import parse_result
from k3infra.cli import main

from bench_results import result_dict, write_result


def _file(tmp_path, name, *, concurrency, latencies_ms, input_len, output_len, role="measured"):
    data = result_dict(latencies_ms, concurrency=concurrency, output_len=output_len,
                       input_lens=[input_len] * len(latencies_ms),
                       metadata={"k3_role": role})
    data["duration"] = 18.0 if concurrency == 8 else 100.0
    return write_result(tmp_path / name, data), data


# Hand-worked: 80 USD per node-hour, concurrency 8, 8 requests x 256 output tokens in
# 18 s, 8 x 35,000 prompt tokens.
#   output: 2,048 tokens / 18 s = 113.777... tok/s; 80 / 3600 = 0.0222... USD/s;
#           0.0222... / 113.777... x 1e6 = 80 x 18 / 2048 / 3600 x 1e6 = 195.3125 USD
#   total:  282,048 tokens / 18 s; 80 x 18 / 282048 / 3600 x 1e6 = 1.41820 USD
#           (1440 / 282048 = 0.0051055140..., x 277.777... = 1.4181983...)
def test_hand_worked_figures():
    assert usd_per_million(80.0, 1, 2048, 18.0) == pytest.approx(195.3125, rel=1e-12)
    assert usd_per_million(80.0, 1, 282048, 18.0) == pytest.approx(1.4181983, rel=1e-7)
    # two nodes behind the endpoint cost twice as much for the same tokens
    assert usd_per_million(80.0, 2, 2048, 18.0) == pytest.approx(390.625, rel=1e-12)


def test_rows_pool_measured_files_and_skip_warmups(tmp_path):
    files = [
        _file(tmp_path, "c8a.json", concurrency=8, latencies_ms=[17000.0] * 8,
              input_len=35000, output_len=256)[1],
        _file(tmp_path, "c8b.json", concurrency=8, latencies_ms=[17000.0] * 8,
              input_len=35000, output_len=256)[1],
        _file(tmp_path, "w.json", concurrency=8, latencies_ms=[1.0], input_len=35000,
              output_len=256, role="warmup")[1],
        # c=32: 64 requests x 2048 tokens = 131,072 in 100 s -> 1310.72 tok/s;
        #   80 / 3600 / 1310.72 x 1e6 = 16.954210069444... USD
        _file(tmp_path, "c32.json", concurrency=32, latencies_ms=[90000.0] * 64,
              input_len=35000, output_len=2048)[1],
    ]
    rows = cost_rows([parse_result(d, f"f{i}") for i, d in enumerate(files)], 80.0)
    assert [(r.concurrency, r.files) for r in rows] == [(8, 2), (32, 1)]
    c8, c32 = rows
    # pooled: 4,096 output tokens in 36 s: the same 195.3125 USD per million
    assert (c8.output_tokens, c8.duration_s) == (4096, 36.0)
    assert c8.usd_per_m_output == pytest.approx(195.3125, rel=1e-12)
    assert c8.usd_per_m_total == pytest.approx(1.4181983, rel=1e-7)
    assert c32.output_tokens == 131072
    assert c32.usd_per_m_output == pytest.approx(16.9542100694, rel=1e-10)


def test_cli_prints_the_formula_and_draws_the_plot(tmp_path, capsys):
    a, _ = _file(tmp_path, "c8.json", concurrency=8, latencies_ms=[17000.0] * 8,
                 input_len=35000, output_len=256)
    b, _ = _file(tmp_path, "c32.json", concurrency=32, latencies_ms=[90000.0] * 64,
                 input_len=35000, output_len=2048)
    png = tmp_path / "cost.png"
    assert main(["bench", "cost", "--node-rate", "80", str(a), str(b), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "195.3125" in out and "16.9542" in out and "1.4182" in out
    assert "node rate (USD/h) x nodes / 3600 / (tokens / duration s) x 1e6" in out
    from PIL import Image

    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 400


@pytest.mark.parametrize("argv, msg", [
    (["--node-rate", "0"], "argument --node-rate: '0': Input should be greater than or equal "
     "to 0.01 (as the stack key k3:monitoring.nodeRateUsdPerHour)"),
    (["--node-rate", "-5"], "argument --node-rate: '-5'"),
    (["--node-rate", "inf"], "argument --node-rate: 'inf': Input should be a finite number"),
    (["--node-rate", "80", "--nodes", "0"], "argument --nodes: '0': Input should be greater "
     "than or equal to 1 (as the stack key k3:replicas)"),
    (["--node-rate", "80", "--nodes", "1e9"], "argument --nodes: '1e9'"),
])
def test_bad_input_names_the_flag(tmp_path, capsys, argv, msg):
    """Flags are bounded like the stack keys they mirror (argparse's exit 2, one line)."""
    a, _ = _file(tmp_path, "c8.json", concurrency=8, latencies_ms=[17000.0] * 8,
                 input_len=35000, output_len=256)
    with pytest.raises(SystemExit) as exc:
        main(["bench", "cost", *argv, str(a)])
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_no_measured_file_invents_nothing(tmp_path, capsys):
    w, _ = _file(tmp_path, "w.json", concurrency=8, latencies_ms=[1.0], input_len=35000,
                 output_len=256, role="warmup")
    assert main(["bench", "cost", "--node-rate", "80", str(w)]) == 2
    assert "nothing to price" in capsys.readouterr().err
