"""The receipt data file is the ground truth (shared/K3_FACTS.md): here the receipt
itself is under test, so its values are asserted against literals."""
import copy

import pytest
import yaml
from pydantic import ValidationError

from k3infra.cli import main
from k3infra.receipt import load_receipt, parse_receipt, receipt_path


def test_receipt_carries_every_fact():
    r = load_receipt()
    assert r.engine.version == "0.23.1rc1.dev1475+gf68f4fdde"
    assert r.engine.commit == "f68f4fdd"
    assert r.engine.pull_request == 50000
    assert r.engine.build_exclusions == ["FlashKDA"]
    assert r.serve.engine_arg_tokens() == [
        "--tensor-parallel-size", "8", "--enable-expert-parallel",
        "--max-model-len", "40960", "--moe-backend", "marlin",
        "--kda-prefill-backend", "triton", "--disable-custom-all-reduce",
        "--block-size", "128"]
    assert r.serve.engine_env_map() == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert r.model.repo == "moonshotai/Kimi-K3"
    assert r.model.revision is None            # not public: deployers pin it
    assert r.model.shards == 96 and r.model.size_gb == 1561.0
    assert r.model.tree_digest == ("sha256:ebf0b1a75a29ab5e01f319252302c418"
                                   "d0e8f9340e402950497094a6fc64aced")
    assert r.residency.weights_gib_per_gpu == 175.40
    assert r.gpus["NVIDIA-B300-SXM6-AC"].memory_gib == 267.69
    assert r.hardware.gpu_memory_bytes == 287_428_771_840
    assert r.gpus["NVIDIA-B200"].memory_gib == 178.35 and r.gpus["NVIDIA-B200"].free_gib == 175.75
    w = r.workload_a
    assert (w.prompt_tokens_min, w.prompt_tokens_max, w.output_tokens_max) == (34000, 36000, 256)
    assert w.concurrencies == [1, 8] and (w.warmup_requests, w.measured_requests) == (1, 3)
    m = r.measurement(8)
    assert (m.p50_ms, m.p99_ms) == (18695, 18766)
    text = " ".join(r.not_measured)
    for item in ("accuracy", "78.12 %", "vision tower", "peak VRAM", "36K", "32 and 128",
                 "other GPUs", "multi-node", "cost per token"):
        assert item in text
    lic = r.license.thresholds_text()
    for item in ("20M USD in any 12 months", "100M monthly active users", "internal use"):
        assert item in lic


def _raw():
    return yaml.safe_load(receipt_path().read_text())


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["model"].update(tree_digest="ebf0b1a7"), "tree_digest"),
    (lambda d: d["engine"].pop("commit"), "commit"),
    (lambda d: d["serve"]["engine_args"].append(dict(d["serve"]["engine_args"][0])), "repeats"),
    (lambda d: d["serve"]["surface"]["args"].append({"flag": "--block-size", "takes_value": True}),
     "both engine path and surface"),
    (lambda d: d.update(unexpected=1), "unexpected"),
    (lambda d: d["workload_a"].update(prompt_tokens_min=40000), "prompt_tokens_min"),
    (lambda d: d["hardware"].update(gpu_product_label="NVIDIA-X"), "gpu_product_label"),
])
def test_malformed_receipt_is_refused(mutate, needle):
    data = copy.deepcopy(_raw())
    mutate(data)
    with pytest.raises(ValidationError, match=needle):
        parse_receipt(data)


def test_receipt_show(capsys):
    assert main(["receipt", "show"]) == 0
    out = capsys.readouterr().out
    assert "f68f4fdd" in out and "18695" in out and "Not measured" in out


# --- the chosen receipt: K3INFRA_RECEIPT, read in load_receipt() only -------------------

def _other_receipt(tmp_path, **changes):
    data = copy.deepcopy(_raw())
    data.update(changes)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_k3infra_receipt_chooses_the_receipt_everywhere(tmp_path, monkeypatch):
    from k3infra.policies import drift, hardware

    mine = _other_receipt(tmp_path, id="my-node-2026-08-01")
    monkeypatch.setenv("K3INFRA_RECEIPT", str(mine))
    assert load_receipt().id == "my-node-2026-08-01"
    # Policies read it when they run, not when they were imported.
    assert drift._receipt().id == "my-node-2026-08-01"
    assert hardware._gpus() == 8
    monkeypatch.setenv("K3INFRA_RECEIPT", "")
    assert load_receipt().id == "kimi-k3-8xb300-2026-07-29" == drift._receipt().id


@pytest.mark.parametrize("text,problem", [
    (None, "cannot read as a receipt (no such file)"),
    ("schema: [unclosed", "line 1, column 18: not valid YAML: "),
    ("a: &x [1]\nb: *x\n", "line 2, column 4: YAML aliases (*x) are not accepted"),
    ("- a list", "not a mapping (a k3infra.receipt/v1 document)"),
    ("schema: k3infra.receipt/v1\nid: Bad\n", "id: String should match pattern"),
])
def test_a_bad_chosen_receipt_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys,
                                                          text, problem):
    path = tmp_path / "r.yaml"
    if text is not None:
        path.write_text(text)
    monkeypatch.setenv("K3INFRA_RECEIPT", str(path))
    assert main(["receipt", "show"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"k3infra receipt: receipt {path} (from K3INFRA_RECEIPT): {problem}")
    assert err.count("\n") == 1


def test_receipt_show_names_the_chosen_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("K3INFRA_RECEIPT", str(_other_receipt(tmp_path, id="my-node")))
    assert main(["receipt", "show"]) == 0
    assert "receipt my-node (measured 2026-07-29)" in capsys.readouterr().out
