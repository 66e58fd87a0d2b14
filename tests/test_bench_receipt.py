"""`k3infra bench receipt`: a new receipt of the shipped schema from the user's results."""
import copy
import hashlib
import json
import math

import numpy as np
import pytest
import yaml

from k3infra.bench.receipt_writer import (ReceiptInputs, ReceiptWriteError, build_receipt,
                                          write_receipt)
from k3infra.bench.results import parse_result
from k3infra.bench.workload import WORKLOAD_ID
from k3infra.cli import main
from k3infra.receipt import load_receipt, parse_receipt

from bench_results import receipt_latencies_ms, result_dict, write_result
from conftest import GOOD_REVISION, manifest, render


def _results(receipt, runs=2, concurrencies=None, scale=1.0, role="measured"):
    m = receipt.measurement(8)
    w = receipt.workload_a
    out = []
    for run in range(1, runs + 1):
        for c in concurrencies or w.concurrencies:
            lat = [v * scale * (1 + 0.001 * run) for v in receipt_latencies_ms(m.p50_ms, m.p99_ms)]
            data = result_dict(lat, concurrency=c, output_len=w.output_tokens_max,
                               input_lens=[(w.prompt_tokens_min + w.prompt_tokens_max) // 2] * 3,
                               metadata={"k3_workload": WORKLOAD_ID, "k3_role": role,
                                         "k3_ignore_eos": "true", "k3_run": str(run)})
            out.append((f"run{run}-c{c}-{role}.json", data))
    return out


def _parsed(pairs):
    return [parse_result(d, name, hashlib.sha256(json.dumps(d).encode()).hexdigest())
            for name, d in pairs]


def test_two_runs_make_a_valid_receipt(receipt):
    pairs = _results(receipt)
    new = build_receipt(receipt, _parsed(pairs), ReceiptInputs(id="my-k3-node-a"))
    assert new.schema_ == receipt.schema_ and new.id == "my-k3-node-a"
    assert new.workload_a.concurrencies == receipt.workload_a.concurrencies
    # pooled over both runs' measured requests, numpy's percentile as vLLM computes it
    pooled = [v for name, d in pairs if "-c8-" in name for v in d["latencies"]]
    e2el = new.measurement(8, "e2el")
    assert e2el.p50_ms == pytest.approx(np.percentile(pooled, 50) * 1000, abs=0.01)
    assert e2el.p99_ms == pytest.approx(np.percentile(pooled, 99) * 1000, abs=0.01)
    assert {m.metric for m in new.measured} == {"e2el", "ttft", "tpot", "itl"}
    t = [d["output_throughput"] for name, d in pairs if "-c8-" in name]
    assert new.workload_a.runs_agreement_pct == pytest.approx(
        (max(t) - min(t)) / (sum(t) / 2) * 100, abs=0.01)
    assert new.measured_on == "2026-07-29"                     # the results' date
    assert new.model.tree_digest == receipt.model.tree_digest
    assert any("residency" in item and "not re-measured" in item for item in new.not_measured)


def test_single_run_needs_saying_so(receipt):
    one = _parsed(_results(receipt, runs=1))
    with pytest.raises(ReceiptWriteError, match="one run per concurrency"):
        build_receipt(receipt, one, ReceiptInputs(id="x"))
    new = build_receipt(receipt, one, ReceiptInputs(id="x", single_run=True))
    assert math.isnan(new.workload_a.runs_agreement_pct)
    assert "run-to-run agreement: one run per concurrency only" in new.not_measured


def test_an_inter_token_gap_of_zero_is_measured_not_refused(receipt):
    """Tokens that arrive in one streamed chunk: the CPU engine's c=1 ITL median on the
    two-node run was 0.0037 ms, which rounds to 0.00 and was refused as `greater than 0`
    (found by the node tier with two replicas). The gap is written; an e2el of 0 is not."""
    pairs = _results(receipt, runs=1)
    for _, data in pairs:
        data["itls"] = [[3.7e-6] * (len(gaps) - 1) + [sum(gaps)] for gaps in data["itls"]]
    new = build_receipt(receipt, _parsed(pairs), ReceiptInputs(id="x", single_run=True))
    assert new.measurement(8, "itl").p50_ms == 0.0
    doc = new.model_dump(mode="json", by_alias=True)
    doc["measured"][0] = {**doc["measured"][0], "metric": "e2el", "p50_ms": 0.0}
    with pytest.raises(ValueError, match="e2el p50_ms and p99_ms must be greater than 0"):
        parse_receipt(doc)


def test_measured_concurrencies_leave_the_not_measured_list(receipt):
    item = next(i for i in receipt.not_measured if i.startswith("concurrency"))
    listed = [int(x) for x in item.split(":")[0].split() if x.isdigit()]
    new = build_receipt(receipt, _parsed(_results(receipt, concurrencies=[8, *listed])),
                        ReceiptInputs(id="wide"))
    assert item not in new.not_measured
    missing = [c for c in receipt.workload_a.concurrencies if c not in [8, *listed]]
    for c in missing:
        assert any(i.startswith(f"concurrency {c}:") for i in new.not_measured)


def test_deployed_flags_env_lock_and_engine(receipt):
    sts = copy.deepcopy(manifest(render("existing", f"weightsRevision={GOOD_REVISION}"),
                                 "StatefulSet"))
    c = sts["spec"]["template"]["spec"]["containers"][0]
    c["args"] += ["--max-num-seqs", "64"]
    from k3infra.weights import tree

    lock = tree.make_lock("o/m", GOOD_REVISION, [tree.FileEntry("a", 1, "2" * 64)])
    other = lock.tree_digest
    inputs = (ReceiptInputs(id="upstream-run", engine_version="0.33.0",
                            engine_commit="0123456789abcdef", engine_pull_request=0,
                            single_run=True)
              .with_statefulset(sts).with_lock(lock))
    new = build_receipt(receipt, _parsed(_results(receipt, runs=1)), inputs)
    flags = [(a.flag, a.value) for a in new.serve.engine_args]
    assert flags[:len(receipt.serve.engine_args)] == [(a.flag, a.value)
                                                       for a in receipt.serve.engine_args]
    assert flags[-1] == ("--max-num-seqs", "64")
    assert new.serve.engine_args[-1].why == "as deployed (not in the base receipt)"
    assert "--served-model-name" not in dict(flags)                # surface, not engine path
    assert new.serve.engine_env_map() == receipt.serve.engine_env_map()
    assert new.engine.version == "0.33.0" and new.engine.pull_request == 0
    assert new.model.tree_digest == other and new.model.revision == GOOD_REVISION


def test_not_workload_a_is_refused(receipt):
    pairs = _results(receipt, runs=2)
    pairs[0][1]["input_lens"] = [1000, 1000, 1000]
    with pytest.raises(ReceiptWriteError, match="prompt tokens"):
        build_receipt(receipt, _parsed(pairs), ReceiptInputs(id="x"))
    with pytest.raises(ReceiptWriteError, match="no measured result"):
        build_receipt(receipt, _parsed(_results(receipt, role="warmup")), ReceiptInputs(id="x"))
    with pytest.raises(ReceiptWriteError, match="does not validate"):
        build_receipt(receipt, _parsed(_results(receipt)), ReceiptInputs(id="Not Valid!"))


def test_written_receipt_reads_back_with_hashes(tmp_path, receipt):
    pairs = _results(receipt)
    paths = [write_result(tmp_path / name, data) for name, data in pairs]
    (tmp_path / "out").mkdir()
    rc = main(["bench", "receipt", *map(str, paths), "--id", "my-node",
               "--out", str(tmp_path / "out" / "my-node.yaml")])
    assert rc == 0
    out = tmp_path / "out" / "my-node.yaml"
    again = load_receipt(str(out))
    assert again.id == "my-node"
    text = out.read_text()
    sidecar = (tmp_path / "out" / "my-node.yaml.sha256").read_text().splitlines()
    for p in paths:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        assert f"{digest}  {p.name}" in sidecar
        assert {"file": p.name, "sha256": digest} in [
            {"file": e.file, "sha256": e.sha256} for e in again.evidence]
    assert parse_receipt(yaml.safe_load(text)) == again


def test_cli_receipt_errors_are_one_line(tmp_path, receipt, capsys):
    pairs = _results(receipt, runs=1)
    paths = [str(write_result(tmp_path / n, d)) for n, d in pairs]
    assert main(["bench", "receipt", *paths, "--id", "x", "--out", str(tmp_path / "r.yaml")]) == 2
    assert "--single-run" in capsys.readouterr().err
    assert not (tmp_path / "r.yaml").exists()
