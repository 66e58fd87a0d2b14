"""benchmarks/gpu_start.py (issue 29) without a GPU: the GPU test receipt it writes and the
serving container it renders from it, against literals."""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import yaml

from k3infra.receipt import parse_receipt

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_start", ROOT / "benchmarks" / "gpu_start.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_receipt_and_render_keep_the_one_gpu_flags_of_the_receipt(tmp_path, capsys):
    g = _bench()
    g.cmd_prepare(argparse.Namespace(work=str(tmp_path), dry=True, model_dir=None, shape="64,2,128",
                                     mkmodel="-", engine_wheel=None, seed="0"))
    out = capsys.readouterr().out
    assert "cold start: engine deadline: 2191 s = startup + load + compile + profiling" in out
    receipt = parse_receipt(yaml.safe_load((tmp_path / "receipt.yaml").read_text()))
    lock = json.loads((tmp_path / "lock.json").read_text())
    # The model is the locked tree's, never typed: its digest and size come from the lock.
    assert receipt.model.tree_digest == lock["tree_digest"]
    assert receipt.model.size_gb == round(sum(f["size"] for f in lock["files"]) / 1e9, 3)
    assert receipt.model.repo == "k3infra-bench/random-llama"
    assert receipt.measured == [] and receipt.measured_gpu.gpus_per_node == 1
    assert [a.flag for a in receipt.serve.engine_args] == [
        "--max-model-len", "--disable-custom-all-reduce", "--block-size"]

    st = g.state(tmp_path)
    r = g.render(tmp_path, st)
    rev = st["revision"]
    tree = f"/weights/k3infra-bench--random-llama/{rev}"
    assert r["command"][:2] == ["sh", "-c"]
    assert r["command"][3:] == ["k3-start", "vllm", "serve", tree,
                                "--max-model-len", "40960", "--disable-custom-all-reduce",
                                "--block-size", "128", "--served-model-name", "random-llama",
                                "--host", "127.0.0.1", "--port", "8001"]
    assert r["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert r["env"]["VLLM_CACHE_ROOT"] == "/cache/current/vllm"
    assert r["env"]["K3_EXPECT_TREE_DIGEST"] == lock["tree_digest"]
    assert r["env"]["VLLM_ENGINE_READY_TIMEOUT_S"] == "2191"
    assert r["budget"] == {"pull": 900, "gate": 1, "startup": 120, "load": 1, "compile": 1800,
                           "profiling": 270, "engine": 2191, "probe": 2260}
    assert "/etc/k3/weights/lock.json" in r["files"]
    # Workload A as the benchmark Job runs it, through the proxy's port.
    args = r["runner_args"]
    assert args[:2] == ["--base-url", "http://127.0.0.1:8000"]
    assert args[args.index("--min-tokens") + 1: args.index("--min-tokens") + 4] == [
        "34000", "--max-tokens", "36000"]
    assert args[args.index("--block-size") + 1] == "128"

    # A loader flag is engine path: it renders only under profile custom, after the
    # receipt's flags and before the surface's.
    custom = g.render(tmp_path, st, "--load-format fastsafetensors", "stamps")
    assert custom["command"][8:15] == ["40960", "--disable-custom-all-reduce", "--block-size",
                                       "128", "--load-format", "fastsafetensors",
                                       "--served-model-name"]
    assert custom["env"]["K3_GATE_MODE"] == "stamps"


def test_bench_receipt_from_the_first_run_and_compare_against_it(tmp_path, capsys):
    """The benchmark's last step on result files in vLLM's layout (tests/bench_results.py:
    synthetic latencies, no measured figure)."""
    from bench_results import result_dict, write_result

    from k3infra.bench.workload import WORKLOAD_ID

    g = _bench()
    g.cmd_prepare(argparse.Namespace(work=str(tmp_path), dry=True, model_dir=None, shape="64,2,128",
                                     mkmodel="-", engine_wheel=None, seed="0"))
    st = g.state(tmp_path)
    r = g.render(tmp_path, st)
    files = []
    for c in (1, 8):
        data = result_dict([900.0, 1000.0, 1100.0], concurrency=c, output_len=256,
                           input_lens=[35000] * 3,
                           metadata={"k3_workload": WORKLOAD_ID, "k3_role": "measured",
                                     "k3_ignore_eos": "true", "k3_run": "1"})
        files.append(str(write_result(tmp_path / f"run1-c{c}-measured.json", data)))
    assert g.receipt_and_compare(tmp_path, r, files) == (0, 0)
    written = yaml.safe_load((tmp_path / "receipt-measured.yaml").read_text())
    assert written["id"].endswith("-measured")
    assert [a["flag"] for a in written["serve"]["engine_args"]] == [
        "--max-model-len", "--disable-custom-all-reduce", "--block-size"]
    assert written["model"]["tree_digest"] == json.loads((tmp_path / "lock.json").read_text())["tree_digest"]
