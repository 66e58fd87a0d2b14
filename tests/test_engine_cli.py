"""`k3infra engine build-args` / `k3infra engine plan`: the receipt's build args for a
hand-run build, and what a stack file resolves to."""
from __future__ import annotations

import json

from k3infra.cli import main
from k3infra.engine.plan import NOT_MEASURED

from conftest import GOOD_REVISION, PREBUILT, PREBUILT_IMAGE


def test_build_args_print_the_receipts_pins(receipt, capsys):
    assert main(["engine", "build-args"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"--build-arg ENGINE_COMMIT={receipt.engine.commit}" in lines
    assert f"--build-arg ENGINE_VERSION={receipt.engine.version}" in lines
    assert all(line.startswith("--build-arg ") for line in lines)


def test_build_args_follow_the_build_node(capsys):
    assert main(["engine", "build-args", "--cpu", "16", "--memory-gi", "64", "--format", "json"]) == 0
    values = json.loads(capsys.readouterr().out)
    assert (values["MAX_JOBS"], values["NVCC_THREADS"]) == ("11", "2")


def test_build_args_refuse_a_node_too_small(capsys):
    assert main(["engine", "build-args", "--memory-gi", "4"]) == 2
    assert "--memory-gi = 4" in capsys.readouterr().err


def test_plan_labels_upstream(capsys):
    assert main(["engine", "plan", "--stack", "existing", "--config",
                 f"weightsRevision={GOOD_REVISION}", "--config", "k3:profile=upstream",
                 *(a for c in PREBUILT for a in ("--config", c))]) == 0
    assert NOT_MEASURED in " ".join(capsys.readouterr().out.split())


def test_plan_refuses_a_bad_engine_config(capsys):
    assert main(["engine", "plan", "--stack", "existing", "--config",
                 'k3:engine={"build": "local", "registry": "registry.example.com/k3/vllm"}',
                 "--config", f"engineImage={PREBUILT_IMAGE}"]) == 2
    assert "k3:engineImage" in capsys.readouterr().err
