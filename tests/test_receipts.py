"""Receipts per stack (issue 45): the stack names its receipt, a candidate says it is one
wherever figures would show, two receipts compare row by row, and the candidate shipped
from vLLM's recipe carries the recipe's flags. Rendered output is asserted against
literals, not the builders' own maths."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from k3infra.cli import main
from k3infra.config import ConfigError, parse_stack_config
from k3infra.receipt import (ReceiptError, load_receipt, receipt_named, shipped_receipts,
                             stack_receipt)
from k3infra.serving.manifests import RECEIPT_SHA_ANNOTATION

from conftest import GOOD_REVISION, ROOT, manifest, render

CANDIDATE = "kimi-k3-8xb300-vllm-recipe-candidate"
MEASURED = "kimi-k3-8xb300-2026-07-29"
IMAGE = "docker.io/vllm/vllm-openai:kimi-k3@sha256:" + "5e" * 32
PIN = f"weightsRevision={GOOD_REVISION}"
AS_CANDIDATE = (PIN, f"receipt={CANDIDATE}", f"engineImage={IMAGE}")


# --- the shipped receipts ------------------------------------------------------------

def test_two_receipts_are_shipped_and_the_measured_one_is_the_default():
    assert list(shipped_receipts()) == [MEASURED, CANDIDATE]
    chosen = stack_receipt(None)
    assert (chosen.receipt.id, chosen.chosen_by) == (MEASURED, "default")


def test_the_candidate_carries_the_recipes_blackwell_profile():
    r = receipt_named(CANDIDATE).receipt
    assert (r.status, r.measured, r.evidence, r.measured_on) == ("candidate", [], [], None)
    assert r.standing() == "candidate: nothing measured yet"
    assert (r.engine.image, r.engine.commit, r.engine.version) == (
        "docker.io/vllm/vllm-openai:kimi-k3", None, ">=0.27.0")
    assert r.serve.engine_arg_tokens() == [
        "--tensor-parallel-size", "8", "--trust-remote-code", "--load-format", "fastsafetensors",
        "--moe-backend", "auto", "--gpu-memory-utilization", "0.95",
        "--no-enable-flashinfer-autotune", "--max-model-len", "1048576", "--kv-cache-dtype", "fp8",
        "--attention-config", '{"use_prefill_query_quantization":true}', "--enable-prefix-caching",
        "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3", "--reasoning-parser",
        "kimi_k3"]
    assert r.serve.engine_env_map() == {
        "VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION": "1", "VLLM_ALLREDUCE_USE_FLASHINFER": "1",
        "VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_RUST_FRONTEND": "1"}
    assert (r.kv_cache.dtype, r.kv_cache.bytes_per_token_max) == ("fp8", 52992)
    load_format = next(a for a in r.serve.engine_args if a.flag == "--load-format")
    assert "4.6x slower" in load_format.why and "B300" in load_format.why
    # The same published weights the measured receipt hashed.
    assert r.model.tree_digest == load_receipt().model.tree_digest


@pytest.mark.parametrize("change, field", [
    ({"measured": [{"concurrency": 8, "metric": "e2el", "p50_ms": 1, "p99_ms": 2}]},
     "measured and evidence must be empty"),
    ({"source": None}, "source (where its flags come from) is needed"),
    ({"status": "measured"}, "needs measured_on and at least one measured figure"),
    ({"engine": {"name": "vllm", "version": "1", "repo": "r", "cuda_arch": "10.3"}},
     "exactly one of commit"),
])
def test_a_receipt_that_breaks_its_status_is_one_line_naming_the_field(tmp_path, change, field):
    data = yaml.safe_load(shipped_receipts()[CANDIDATE].read_text())
    data.update(change)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ReceiptError, match=re.escape(field)) as exc:
        load_receipt(str(path))
    assert str(exc.value).startswith(f"receipt {path}: ") and "\n" not in str(exc.value)


# --- the stack names its receipt ------------------------------------------------------

def test_a_project_file_is_named_by_its_relative_path(tmp_path):
    (tmp_path / "receipts").mkdir()
    mine = tmp_path / "receipts" / "mine.yaml"
    mine.write_text("# my comment\n" + shipped_receipts()[MEASURED].read_text())
    chosen = stack_receipt("receipts/mine.yaml", tmp_path)
    assert (chosen.receipt.id, chosen.path, chosen.chosen_by) == (MEASURED, mine, "k3:receipt")
    # By content: a comment is not a new receipt.
    assert chosen.sha256 == stack_receipt(MEASURED).sha256


@pytest.mark.parametrize("name", ["/etc/receipt.yaml", "../outside.yaml", "receipts/x.json",
                                  "no-such-receipt", " receipts/x.yaml"])
def test_a_name_outside_the_project_or_not_a_receipt_is_refused(tmp_path, name):
    with pytest.raises(ReceiptError) as exc:
        stack_receipt(name, tmp_path)
    text = str(exc.value)
    assert text.startswith(f"k3:receipt = {name!r}: not a shipped receipt ({MEASURED}, "
                           f"{CANDIDATE}) nor a .yaml file inside the Pulumi project")


def test_the_environment_override_is_refused_where_it_disagrees(tmp_path, monkeypatch):
    monkeypatch.setenv("K3INFRA_RECEIPT", str(shipped_receipts()[CANDIDATE]))
    assert stack_receipt(None).receipt.id == CANDIDATE           # the stack names none
    assert stack_receipt(CANDIDATE).receipt.id == CANDIDATE      # the same bytes
    with pytest.raises(ReceiptError, match=f"k3:receipt = {MEASURED} .* and K3INFRA_RECEIPT = "
                                           ".* disagree: the stack's key decides"):
        stack_receipt(MEASURED)


def test_a_render_records_the_receipt_on_the_workload_and_in_the_outputs():
    r = render("existing", PIN)
    sha = stack_receipt(MEASURED).sha256
    sts = manifest(r, "StatefulSet")
    assert sts["metadata"]["annotations"][RECEIPT_SHA_ANNOTATION] == sha
    # On the workload, not the pods: a receipt edit that changes no flag replaces no pod.
    assert RECEIPT_SHA_ANNOTATION not in sts["spec"]["template"]["metadata"]["annotations"]
    assert (r.outputs["receiptId"], r.outputs["receiptSha256"], r.outputs["receiptStatus"]) == (
        MEASURED, sha, "measured")
    assert r.plan()["receipt"] == {"id": MEASURED, "sha256": sha, "status": "measured",
                                   "name": MEASURED}


def test_every_shipped_stack_names_its_receipt():
    for path in sorted((ROOT / "stacks" / "examples").glob("Pulumi.*.yaml")):
        assert yaml.safe_load(path.read_text())["config"]["k3:receipt"] == MEASURED, path


def test_the_component_refuses_a_receipt_other_than_its_args_name():
    with pytest.raises(ConfigError, match="names receipt kimi-k3-8xb300-vllm-recipe-candidate, "
                                          "but the component was given receipt "
                                          "kimi-k3-8xb300-2026-07-29"):
        from k3infra.stack import K3ServingStack

        cfg = parse_stack_config({"receipt": CANDIDATE, "weightsRevision": GOOD_REVISION,
                                  "apiKey": "k", "engineImage": IMAGE}, receipt=load_receipt())
        K3ServingStack("kimi-k3", {"config": cfg, "receipt": load_receipt()})


# --- a candidate, rendered -------------------------------------------------------------

def test_a_candidate_says_so_where_figures_would_show():
    r = render("existing", *AS_CANDIDATE)
    sts = manifest(r, "StatefulSet")
    pod = sts["spec"]["template"]["metadata"]["annotations"]
    assert pod["k3infra.dev/receipt"] == CANDIDATE
    assert pod["k3infra.dev/receipt-status"] == "candidate"
    assert pod["k3infra.dev/measured-configuration"] == "false"
    assert pod["k3infra.dev/warning"].startswith(
        "receipt kimi-k3-8xb300-vllm-recipe-candidate is a candidate: nothing measured yet")
    assert pod["k3infra.dev/engine"] == (
        "candidate (nothing measured yet): vLLM >=0.27.0, image "
        "docker.io/vllm/vllm-openai:kimi-k3, receipt kimi-k3-8xb300-vllm-recipe-candidate; the "
        "released image by digest")
    assert any(w.startswith("k3:receipt: kimi-k3-8xb300-vllm-recipe-candidate is a candidate: "
                            "nothing measured yet") for w in r.warnings)
    vllm = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
    assert vllm["image"] == IMAGE
    assert vllm["args"][1:5] == ["--tensor-parallel-size", "8", "--trust-remote-code",
                                 "--load-format"]
    # No measured request to size the drain from: the longest the grace allows.
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 180
    assert vllm["lifecycle"]["preStop"] == {"sleep": {"seconds": 150}}


def test_a_candidate_draws_no_latency_alert():
    r = render("existing", *AS_CANDIDATE, 'monitoring={"prometheusRule": true}')
    rule = manifest(r, "PrometheusRule")
    alerts = [x["alert"] for g in rule["spec"]["groups"] for x in g["rules"] if "alert" in x]
    assert "KimiK3P99LatencyAboveReceipt" not in alerts and "KimiK3EngineDown" in alerts


@pytest.mark.parametrize("overrides, key, says", [
    ((PIN, f"receipt={CANDIDATE}"), "k3:engineImage",
     "is required with receipt kimi-k3-8xb300-vllm-recipe-candidate: its engine is the "
     "released image docker.io/vllm/vllm-openai:kimi-k3, run by digest"),
    ((PIN, f"receipt={CANDIDATE}", "engineImage=registry.example.com/vllm@sha256:" + "5e" * 32),
     "k3:engineImage", "must be of the receipt's repository docker.io/vllm/vllm-openai"),
])
def test_a_candidate_runs_its_released_image_by_digest(overrides, key, says):
    with pytest.raises(ConfigError) as exc:
        render("existing", *overrides)
    assert exc.value.key == key and says in str(exc.value)


def test_the_kv_preflight_holds_the_window_to_the_bound():
    from k3infra.config import parse_stack_config
    from k3infra.preflight import check_context

    receipt = receipt_named(CANDIDATE).receipt
    cfg = parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "k",
                              "engineImage": IMAGE}, receipt=receipt)
    assert check_context(cfg, receipt).line() == (
        "ok  KV cache fit: one 1048576-token sequence needs at most 51.75 GiB of fp8 KV cache "
        "per GPU, of 74.91 GiB left")
    custom = parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "k",
                                 "engineImage": IMAGE, "profile": "custom",
                                 "custom": {"args": ["--max-model-len", "2000000"]}},
                                receipt=receipt)
    with pytest.raises(ConfigError) as exc:
        check_context(custom, receipt)
    assert exc.value.key == "k3:custom.args"
    assert "--max-model-len 2000000: one full-length sequence needs up to 98.71 GiB" in str(exc.value)
    assert "Accepted: --max-model-len 1517760 or less" in str(exc.value)
    assert exc.value.value == ["--max-model-len", "2000000"]
    # The measured receipt states no bound: nothing to hold it to.
    measured = parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "k",
                                   "engineImage": "registry.example.com/vllm@sha256:" + "5e" * 32},
                                  receipt=load_receipt())
    assert "states no KV bound" in check_context(measured, load_receipt()).detail


# --- commands -------------------------------------------------------------------------

def test_receipt_diff_of_the_two_shipped_receipts(capsys):
    assert main(["receipt", "diff", MEASURED, CANDIDATE, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    rows = {(c["area"], c["item"]): (c["kind"], c["a"], c["b"]) for c in doc["changes"]}
    assert rows[("receipt", "status")] == ("changed", "measured", "candidate")
    assert rows[("engine", "source")] == ("changed", "build", "image")
    assert rows[("engine", "commit")] == ("removed", "f68f4fdd", None)
    assert rows[("engine", "image")] == ("added", None, "docker.io/vllm/vllm-openai:kimi-k3")
    assert rows[("engine args", "--moe-backend")] == ("changed", "marlin", "auto")
    assert rows[("engine args", "--max-model-len")] == ("changed", "40960", "1048576")
    assert rows[("engine args", "--load-format")] == ("added", None, "fastsafetensors")
    assert rows[("engine args", "--enable-expert-parallel")] == ("removed", "(set)", None)
    assert rows[("engine env", "PYTORCH_CUDA_ALLOC_CONF")] == (
        "removed", "expandable_segments:True", None)
    assert rows[("engine env", "VLLM_ALLREDUCE_USE_FLASHINFER")] == ("added", None, "1")
    assert rows[("kv cache", "dtype")] == ("added", None, "fp8")
    assert rows[("measured", "c=8 e2el")] == ("removed", "p50 18695 ms / p99 18766 ms", None)
    assert rows[("measured", "figures")] == ("added", None, "nothing measured yet")
    assert not [k for k in rows if k[0] == "weights"]       # the same published tree
    assert any(k[0] == "not measured" for k in rows)
    assert doc["a"]["id"] == MEASURED and doc["b"]["status"] == "candidate"


def test_receipt_diff_of_one_receipt_with_itself_is_empty(capsys):
    assert main(["receipt", "diff", MEASURED, str(shipped_receipts()[MEASURED])]) == 0
    assert "are the same" in capsys.readouterr().out


def test_receipt_list_names_each_stacks_receipt(capsys):
    assert main(["receipt", "list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["id"], r["status"]) for r in doc["receipts"]] == [
        (MEASURED, "measured"), (CANDIDATE, "candidate")]
    assert doc["stacks"]["existing"] == MEASURED


def test_bench_compare_against_a_candidate_judges_nothing(tmp_path, capsys, monkeypatch):
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from bench_results import result_dict, write_result

    path = tmp_path / "r.json"
    write_result(path, result_dict([18000.0] * 3))
    files = [str(path)]
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["bench", "compare", *files, "--receipt", CANDIDATE]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "is a candidate: nothing measured yet, so nothing was judged" in out
    # Its headline says so too: nothing was outside a tolerance (found on the node tier).
    assert "NOT JUDGED: nothing to judge against" in out and "FAIL" not in out


def test_a_bad_receipt_flag_is_one_line(tmp_path, capsys):
    assert main(["receipt", "show", "--receipt", str(tmp_path / "none.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == (f"k3infra receipt: receipt {tmp_path / 'none.yaml'}: cannot read as a "
                   "receipt (no such file)\n")


def test_the_component_takes_a_receipt_or_the_name_of_one():
    """`receipt` in K3ServingStackArgs: the Receipt itself, or a name the project resolves
    as it resolves k3:receipt; missing, a TypeError naming the key."""
    from k3infra.receipt import stack_receipt
    from k3infra.stack import K3ServingStack
    from program_harness import record

    keys = {"weightsRevision": GOOD_REVISION, "apiKey": "k", "engineImage": IMAGE}

    def program():
        K3ServingStack("kimi-a", {**keys, "receipt": load_receipt()})
        K3ServingStack("kimi-b", {**keys, "receipt": CANDIDATE})
    rec = record(program, preview=True)
    shas = {name: rec.named(f"{name}-serving-statefulset").inputs["metadata"]["annotations"][
        RECEIPT_SHA_ANNOTATION] for name in ("kimi-a", "kimi-b")}
    assert shas == {"kimi-a": load_receipt().sha256(),
                    "kimi-b": stack_receipt(CANDIDATE, ROOT).receipt.sha256()}
    with pytest.raises(TypeError, match=r"K3ServingStack: args\['receipt'\] must be the Receipt"):
        K3ServingStack("kimi-c", keys)
