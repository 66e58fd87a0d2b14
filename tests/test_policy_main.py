"""The CrossGuard pack directory: `policy/__main__.py` imports without serving, builds the
PolicyPack when Pulumi runs it, and the served pack (pulumi-policy's real analyzer
server, spoken to over gRPC the way the Pulumi CLI does) returns the same verdicts as
`k3infra policy check` on the corpus."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import runpy
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

import pulumi_policy
from k3infra.config import to_pulumi_config
from k3infra.policies import PACK_NAME, POLICIES, level
from k3infra.policies.runner import check_plan

from conftest import ROOT, render
from policy_corpus import CORPUS

PACK_DIR = ROOT / "policy"
MAIN = PACK_DIR / "__main__.py"


class Recorder:
    """Stands in for pulumi_policy.PolicyPack, whose constructor serves and blocks."""

    calls: list[dict] = []

    def __init__(self, **kwargs):
        Recorder.calls.append(kwargs)


@pytest.fixture
def recorder(monkeypatch):
    Recorder.calls = []
    monkeypatch.setattr(pulumi_policy, "PolicyPack", Recorder)
    return Recorder


def test_importing_main_builds_nothing(recorder):
    spec = importlib.util.spec_from_file_location("k3infra_policy_pack_main", MAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert recorder.calls == []
    assert callable(module.serve_pack)


def test_running_main_as_pulumi_does_builds_the_pack(recorder):
    # `python -m pulumi.policy <engine> policy/` runs the directory with runpy as __main__.
    runpy.run_path(str(PACK_DIR), run_name="__main__")
    assert len(recorder.calls) == 1
    call = recorder.calls[0]
    assert call["name"] == PACK_NAME
    assert call["policies"] == POLICIES
    assert call["enforcement_level"] == pulumi_policy.EnforcementLevel.MANDATORY


def test_main_is_thin():
    code = [line for line in MAIN.read_text().split('"""')[-1].splitlines()
            if line.strip() and not line.strip().startswith("#")]
    # The import, the call, and the guard that turns a bad K3INFRA_RECEIPT into one line.
    assert len(code) <= 7 and any("k3infra.policies" in line for line in code)


def test_pack_project_file():
    doc = yaml.safe_load((PACK_DIR / "PulumiPolicy.yaml").read_text())
    assert doc["runtime"]["name"] == "python"
    assert doc["runtime"]["options"]["virtualenv"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", str(doc["version"]))


def test_pack_runs_in_the_projects_virtualenv():
    """One virtualenv for program and pack: the pack's verdicts use exactly the pins the
    program was rendered with (`make venv`), and there is no second set to drift."""
    import yaml

    doc = yaml.safe_load((PACK_DIR / "PulumiPolicy.yaml").read_text())
    assert doc["runtime"]["options"]["virtualenv"] == "../.venv"
    assert not (PACK_DIR / "requirements.txt").exists()


# --- the served pack over gRPC ------------------------------------------------------------

@pytest.fixture(scope="module")
def analyzer():
    """pulumi-policy's analyzer server running policy/ as the Pulumi CLI starts it, with the
    existing stack's config in PULUMI_CONFIG. Yields a gRPC stub."""
    import grpc
    from pulumi.runtime.proto import analyzer_pb2_grpc

    plan = render("existing").plan()
    env = {**os.environ, "PULUMI_CONFIG": json.dumps(to_pulumi_config(plan["config"]))}
    proc = subprocess.Popen([sys.executable, "-m", "pulumi.policy", "127.0.0.1:1", str(PACK_DIR)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        port = proc.stdout.readline().decode().strip()
        assert port.isdigit(), proc.stderr.read().decode()[-2000:]
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _struct(value: dict):
    from google.protobuf import struct_pb2

    s = struct_pb2.Struct()
    s.update(value)
    return s


def _served_verdicts(stub, plan: dict) -> dict[str, set[str]]:
    """{level: {policy names}} from Analyze on every resource and AnalyzeStack."""
    from pulumi.runtime.proto import analyzer_pb2

    levels = {0: "advisory", 1: "mandatory"}
    found: dict[str, set[str]] = {"advisory": set(), "mandatory": set()}
    stack = []
    for r in plan["resources"]:
        opts = analyzer_pb2.AnalyzerResourceOptions(parent=r["parent"] or "")
        props = _struct(r["inputs"])
        response = stub.Analyze(analyzer_pb2.AnalyzeRequest(
            type=r["type"], properties=props, urn=r["urn"], name=r["name"], options=opts))
        for d in response.diagnostics:
            found[levels[d.enforcementLevel]].add(d.policyName)
        stack.append(analyzer_pb2.AnalyzerResource(
            type=r["type"], properties=props, urn=r["urn"], name=r["name"], options=opts,
            parent=r["parent"] or "", dependencies=r["dependsOn"]))
    response = stub.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=stack))
    for d in response.diagnostics:
        found[levels[d.enforcementLevel]].add(d.policyName)
    return found


def test_served_pack_describes_every_policy(analyzer):
    from google.protobuf import empty_pb2

    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == PACK_NAME
    served = {p.name: p.enforcementLevel for p in info.policies}
    assert set(served) == {p.name for p in POLICIES}
    for p in POLICIES:
        assert served[p.name] == (1 if level(p).value == "mandatory" else 0), p.name
    schemas = {p.name: dict(p.configSchema.properties) for p in info.policies}
    assert "allowedProducts" in schemas["k3-gpu-product"]


def test_served_pack_accepts_the_render(analyzer):
    verdicts = _served_verdicts(analyzer, render("existing").plan())
    assert verdicts["mandatory"] == set()
    assert verdicts["advisory"] == {"k3-license-acknowledged"}


def test_served_pack_and_offline_runner_agree_on_the_corpus(analyzer):
    plan = render("existing").plan()
    for v in CORPUS:
        broken = v.apply(plan)
        served = _served_verdicts(analyzer, broken)
        offline = check_plan(broken)
        assert v.policy in served["mandatory"], v.id
        if broken["config"] != plan["config"]:
            # A variant of another render (the gateway's, a client namespace): the served
            # pack judges it under the config it was started with (PULUMI_CONFIG above), so
            # a policy that reads the config (k3-network-exposure) may find more there.
            continue
        assert served["mandatory"] == {f.policy for f in offline.mandatory}, v.id
