"""The test receipt for the generated tiny MoE (fast tier, no torch): written from its
TEMPLATE and the `k3infra weights lock` of a tree, named by the stack (k3:receipt, a
file of the project), it renders the `existing` stack with the model's flags; the policy
pack passes that render under it and refuses it when the stack names the shipped
receipt; the loopback Hub serves the tree to the real huggingface_hub client at a 40-hex
revision."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import hub_loopback
import tiny_moe
from k3infra.receipt import load_receipt
from k3infra.render import render_stack, write_render

ROOT = Path(__file__).resolve().parents[2]
K3INFRA = str(Path(sys.executable).with_name("k3infra"))
REVISION = "5c" * 20
IMAGE = "registry.example.com/k3/vllm-cpu@sha256:" + "5e" * 32
PREBUILT = ['engine={"build": "prebuilt"}', f"engineImage={IMAGE}", "acceptModelLicense=true"]


def fake_tree(root: Path) -> Path:
    """The generated repo's layout with stand-in bytes (the lock only hashes them)."""
    root.mkdir(parents=True)
    config = dict(tiny_moe.ARCH, vocab_size=tiny_moe.VOCAB, architectures=["MixtralForCausalLM"])
    (root / "config.json").write_text(json.dumps(config))
    names = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    for i, name in enumerate(names):
        (root / name).write_bytes(bytes([i]) * (3000 + i))
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w0": names[0], "w1": names[1]}}))
    (root / "tokenizer.json").write_text("{}")
    return root


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny")
    tree = fake_tree(base / "tree")
    receipt, lock = tiny_moe.write_receipt(tree, REVISION, base / "out")
    return tree, receipt, lock


@pytest.fixture(scope="module")
def rendered(written, tmp_path_factory):
    _tree, receipt, lock = written
    named = tiny_moe.in_project(receipt, ROOT)
    try:
        r = render_stack("existing", tiny_moe.stack_overrides(named, REVISION, lock) + PREBUILT,
                         ROOT)
        out = tmp_path_factory.mktemp("render")
        write_render(r, out)
        yield r, out
    finally:
        (ROOT / named).unlink()


def test_written_receipt_is_the_lock_and_the_template(written):
    _tree, receipt, lock = written
    r = load_receipt(str(receipt))
    facts = json.loads(lock.read_text())
    assert r.id == "tiny-moe-cpu-e2e"
    assert (r.model.repo, r.model.revision) == ("k3infra-e2e/tiny-moe", REVISION)
    assert r.model.tree_digest == facts["tree_digest"]
    assert r.model.size_gb == facts["total_bytes"] / 1e9
    assert (r.model.shards, r.model.total_params, r.model.active_params_per_token) == (2, "15.5M", "6.0M")
    assert r.residency.weights_gib_per_gpu == round(facts["total_bytes"] / 2**30, 6)
    assert r.serve.engine_arg_tokens() == ["--tensor-parallel-size", "1", "--enable-expert-parallel",
                                           "--max-model-len", "2048", "--disable-custom-all-reduce",
                                           "--block-size", "128"]
    assert r.serve.engine_env_map() == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                                        "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert r.gpus["k3infra-e2e-cpu"].gpus_per_node == 1


def test_existing_stack_renders_the_models_flags(rendered):
    r, _out = rendered
    sts = next(m for m in r.manifests() if m["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]
    vllm = next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")
    assert vllm["args"] == [f"/weights/k3infra-e2e--tiny-moe/{REVISION}",
                            "--tensor-parallel-size", "1", "--enable-expert-parallel",
                            "--max-model-len", "2048", "--disable-custom-all-reduce",
                            "--block-size", "128", "--served-model-name", "tiny-moe",
                            "--host", "127.0.0.1", "--port", "8001"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["metadata"]["annotations"]["k3infra.dev/receipt"] == "tiny-moe-cpu-e2e"
    assert sts["metadata"]["annotations"]["k3infra.dev/receipt"] == "tiny-moe-cpu-e2e"
    # A released engine: no "(PR 0, without )" in the label.
    assert pod["metadata"]["annotations"]["k3infra.dev/engine"] == (
        "measured: vLLM 0.32.0 @ ad44bdad85566b1532aa95066d6c92a5f6715867, prebuilt image, "
        "audit its labels")


def _policy_check(render_dir: Path):
    env = {k: v for k, v in __import__("os").environ.items() if k != "K3INFRA_RECEIPT"}
    env["COLUMNS"] = "250"      # one table row a line: the assertions read them whole
    return subprocess.run([K3INFRA, "policy", "check", str(render_dir)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_pack_passes_under_the_test_receipt_and_refuses_under_the_shipped(rendered, tmp_path):
    """The pack judges by the receipt the stack names (plan.json's k3:receipt): the same
    objects pass under the test receipt they were built from, and are refused when the
    stack names the shipped one instead."""
    import shutil

    _r, out = rendered
    ok = _policy_check(out)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 mandatory, 0 advisory violation(s)" in ok.stdout
    renamed = tmp_path / "render"
    shutil.copytree(out, renamed)
    plan = json.loads((renamed / "plan.json").read_text())
    plan["config"]["k3:receipt"] = "kimi-k3-8xb300-2026-07-29"
    (renamed / "plan.json").write_text(json.dumps(plan))
    shipped = _policy_check(renamed)
    assert shipped.returncode == 1
    failed = " ".join(shipped.stdout.split("FAILED:")[-1].split())
    assert failed == ("k3-gpu-count, k3-gpu-product, k3-hbm-fit, k3-receipt-annotations, "
                      "k3-serve-flags, k3-startup-budget, k3-tree-digest, k3-weights-revision")
    # The StatefulSet names the receipt it was built from by content: that is the line.
    assert "annotation k3infra.dev/receipt-sha256" in shipped.stdout


def test_a_bad_chosen_receipt_is_one_line(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items()}
    missing = tmp_path / "nope.yaml"
    env["K3INFRA_RECEIPT"] = str(missing)
    done = subprocess.run([K3INFRA, "receipt", "show"], env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == (f"k3infra receipt: receipt {missing} (from K3INFRA_RECEIPT): cannot "
                           "read as a receipt (no such file)\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"schema": "k3infra.receipt/v1", "id": "Bad Id"}))
    env["K3INFRA_RECEIPT"] = str(bad)
    pack = subprocess.run([sys.executable, str(ROOT / "policy" / "__main__.py")], env=env,
                          capture_output=True, text=True)
    assert pack.returncode == 1
    assert pack.stderr.count("\n") == 1
    assert pack.stderr.startswith(f"k3infra policy pack: receipt {bad} (from K3INFRA_RECEIPT): "
                                  "id: String should match pattern")


def test_hub_serves_the_tree_at_a_40_hex_revision_on_a_given_host(written, tmp_path):
    tree, _receipt, _lock = written
    # Another address than the default (any 127/8 one is local): the Hub and its CDN
    # share it on two ports, as on a network namespace's one address.
    with hub_loopback.serve(tree, tiny_moe.REPO, REVISION, host="127.0.0.3") as hub:
        assert hub.endpoint.startswith("http://127.0.0.3:") and hub.cdn.startswith("http://127.0.0.3:")
        env = hub_loopback.environment(hub, str(tmp_path / "home"))
        code = ("import sys; from huggingface_hub import snapshot_download; "
                "print(snapshot_download(sys.argv[1], revision=sys.argv[2], local_dir=sys.argv[3]))")
        done = subprocess.run([sys.executable, "-c", code, tiny_moe.REPO, REVISION,
                               str(tmp_path / "got")], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert {h.role for h in hub.hits} == {"hub", "cdn"}
    assert hub_loopback.read_tree(tmp_path / "got") == hub_loopback.read_tree(tree)
    assert len(hub_loopback.tree_commit(hub_loopback.read_tree(tree))) == 40


SCHEMA_CHECK = """
import json, jsonschema
from k3infra.policies import POLICIES
bad = []
for p in POLICIES:
    schema = getattr(p, "config_schema", None)
    if schema is None:
        continue
    props = schema.properties or {}
    defaults = {k: v["default"] for k, v in props.items() if "default" in v}
    try:
        jsonschema.validate(defaults, {"type": "object", "properties": props,
                                       "required": list(schema.required or [])})
    except jsonschema.ValidationError as exc:
        bad.append(f"{p.name}: {exc.message}")
print(json.dumps(bad))
"""


@pytest.mark.parametrize("chosen", ["shipped", "test"])
def test_every_policy_default_config_fits_its_schema(written, chosen):
    """The Pulumi CLI validates each policy's default config against its schema before
    a preview: with the test receipt (no 4-GPU product) `allowedMultiNodeProducts` was
    `[]` under `minItems: 1`, and `pulumi up --policy-pack` stopped (the node tier)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "K3INFRA_RECEIPT"}
    if chosen == "test":
        env["K3INFRA_RECEIPT"] = str(written[1])
    done = subprocess.run([sys.executable, "-c", SCHEMA_CHECK], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
