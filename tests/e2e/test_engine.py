"""The paths a user takes, with the real Pulumi CLI, language host and Kubernetes provider.

No cluster here: `pulumi up` runs with `kubernetes:renderYamlToDirectory`, where the real
provider writes every object as YAML instead of applying it (tests/e2e/test_apiserver_*
apply them to a real API server).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine import (API_KEY, HF_TOKEN, IMAGE, PROXY_IMAGE, REVISION, ROOT, Pulumi, copy_template,
                    object_key, offline_render, read_manifests, render_mode, stack_ready)
from engine import testbed_bin, project, pulumi, pulumi_home  # noqa: F401  (fixtures)

pytestmark = pytest.mark.e2e

# --- the CLI's own validation ------------------------------------------------------

def test_cli_refuses_a_stack_without_the_required_keys(pulumi):
    """Pulumi.yaml's declared keys: the CLI's own validation, before the program runs."""
    copy_template(pulumi)
    pulumi.run("stack", "init", "existing")
    proc = pulumi.run("preview", check=False)
    assert proc.returncode != 0
    assert "missing configuration value" in proc.stdout + proc.stderr
    assert "missing configuration value 'apiKey'" in proc.stderr
    # Every other declared key has a default: setting the API key is enough.
    pulumi.run("config", "set", "--secret", "k3:apiKey", API_KEY, show=0)
    pulumi.run("preview")


# --- up without a cluster, and the offline render ---------------------------------------

# Where `pulumi up` (render mode) and `k3infra render` legitimately differ; each is
# explained in docs/engine-e2e.md. Everything else must be identical.
def _drop_empty(value):
    """The provider omits empty lists and maps (`ingress: []`): same object to the API."""
    if isinstance(value, dict):
        kept = {k: _drop_empty(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value


def normalise(obj: dict) -> dict:
    obj = _drop_empty(json.loads(json.dumps(obj)))
    if obj.get("kind") == "Secret":
        # The provider writes Secret values (base64, in plaintext: it warns); the offline
        # render never writes a secret value.
        # It also moves `stringData` into `data` (base64), as the API server would.
        keys = {**obj.pop("stringData", {}), **obj.get("data", {})}
        obj["data"] = {k: "<secret>" for k in keys}
    meta = obj.get("metadata", {})
    annotations = meta.get("annotations") or {}
    # The engine records its own bookkeeping on objects it writes.
    for a in [a for a in annotations if a.startswith("pulumi.com/")]:
        annotations.pop(a)
    if not annotations:
        meta.pop("annotations", None)
    return obj


def test_up_in_render_mode_writes_what_the_offline_render_shows(pulumi, tmp_path):
    copy_template(pulumi)
    stack_ready(pulumi)
    out = tmp_path / "rendered"
    render_mode(pulumi, out)
    pulumi.run("preview", "--policy-pack", "policy/")
    pulumi.run("up", "--yes", "--policy-pack", "policy/")
    written = {object_key(o): normalise(o) for o in read_manifests(out)}
    offline = {object_key(o): normalise(o) for o in offline_render(pulumi, tmp_path / "offline")}
    print(f"\nrender comparison: {len(written)} objects from pulumi up, {len(offline)} from k3infra render")
    assert sorted(written, key=str) == sorted(offline, key=str)
    differing = [key for key in written if written[key] != offline[key]]
    for key in differing:
        print(f"\nDIFFERS {key}\n  up:     {json.dumps(written[key])[:1500]}\n  render: {json.dumps(offline[key])[:1500]}")
    assert not differing

    # The ordering is in the state, on the children themselves (not only on components):
    # the serving StatefulSet waits for the verified weights, the Job for its volume.
    state = pulumi.state_resources()
    by_type = {}
    for r in state:
        by_type.setdefault(r["type"], []).append(r)
    (sts,) = by_type["kubernetes:apps/v1:StatefulSet"]
    jobs = {r["urn"].rsplit("::", 1)[1]: r for r in by_type["kubernetes:batch/v1:Job"]}
    weights_job = next(r for name, r in jobs.items() if name.endswith("weights-job"))
    (pvc,) = [r for r in by_type["kubernetes:core/v1:PersistentVolumeClaim"] if "weights" in r["urn"]]
    print(f"\nstate dependencies: StatefulSet <- {len(sts.get('dependencies', []))} resources, "
          f"weights Job <- {len(weights_job.get('dependencies', []))}")
    assert weights_job["urn"] in sts.get("dependencies", [])
    assert pvc["urn"] in weights_job.get("dependencies", [])

    # Idempotence: a second up changes nothing.
    pulumi.run("up", "--yes", "--expect-no-changes")

    # A surface key updates the StatefulSet in place; the weights Job is not replaced.
    pulumi.run("config", "set", "k3:servedModelName", "kimi-k3-e2e", show=0)
    steps = preview_steps(pulumi)
    kinds = {(s["urn"].split("::")[2].split("$")[-1], s["op"]) for s in steps if s["op"] != "same"}
    print(f"\nservedModelName change previews: {sorted(kinds)}")
    assert ("kubernetes:apps/v1:StatefulSet", "update") in kinds
    assert not [k for k in kinds if k[0] == "kubernetes:batch/v1:Job" and k[1] != "same"]

    # An engine-path change under the measured profile is refused before registration.
    pulumi.run("config", "set", "--path", "k3:custom.args[0]", "--", "--enforce-eager", show=0)
    proc = pulumi.run("preview", check=False)
    assert proc.returncode != 0
    assert "k3:custom" in proc.stdout + proc.stderr
    assert "k3:profile = custom" in proc.stdout + proc.stderr
    pulumi.run("config", "rm", "--path", "k3:custom", show=0)

    # Secrets: nothing in the state in plaintext; outputs marked secret.
    export = pulumi.run("stack", "export", show=0).stdout
    assert API_KEY not in export and HF_TOKEN not in export
    assert '"ciphertext"' in export
    outputs = pulumi.json("stack", "output")
    shown = pulumi.run("stack", "output", show=0).stdout
    assert API_KEY not in json.dumps(outputs) and API_KEY not in shown

    # Teardown: nothing left in the state but the stack itself.
    pulumi.run("destroy", "--yes")
    left = [r["type"] for r in pulumi.state_resources() if r["type"] != "pulumi:pulumi:Stack"]
    assert left == []


def preview_steps(pulumi: Pulumi) -> list[dict]:
    doc = pulumi.json("preview")
    return doc.get("steps", [])


# --- the policy pack, enforced by the engine ------------------------------------------

def test_engine_enforces_the_pack_on_a_drifted_statefulset(pulumi):
    """A program that drifts one receipt flag fails `pulumi preview --policy-pack`."""
    drifted = pulumi.cwd / "tests/e2e/programs/drifted"
    pulumi.cwd = drifted
    stack_ready(pulumi)
    pulumi.run("config", "set", "kubernetes:renderYamlToDirectory", str(drifted / "out"), show=0)
    proc = pulumi.run("preview", "--policy-pack", str(drifted.parents[3] / "policy"),
                      check=False, show=30)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "k3-serve-flags" in out and "mandatory" in out
    assert "--block-size" in out


# --- K3ServingStack from another program ------------------------------------------------

def consumer_project(pulumi: Pulumi, tmp_path: Path, program: str) -> Path:
    """A Pulumi project of a user's own, outside this repository, using the package."""
    d = tmp_path / "consumer"
    d.mkdir()
    (d / "Pulumi.yaml").write_text(
        "name: k3-consumer\nruntime:\n  name: python\n  options:\n"
        f"    toolchain: pip\n    virtualenv: {ROOT / '.venv'}\n")
    (d / "__main__.py").write_text(program)
    pulumi.cwd = d
    pulumi.run("stack", "init", "dev")
    pulumi.run("config", "set", "--secret", "apiKey", API_KEY, show=0)
    pulumi.run("config", "set", "kubernetes:renderYamlToDirectory", str(d / "out"), show=0)
    return d


def readme_program() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"### Using `K3ServingStack` from your own program.*?```python\n(.*?)```", text, re.S)
    assert m
    return (m.group(1).replace("<40-hex commit>", REVISION)
            .replace("registry.example.com/k3/vllm@sha256:<64 hex>", IMAGE)
            .replace(PROXY_IMAGE.split("@")[0] + "@sha256:<64 hex>", PROXY_IMAGE))


def test_readme_component_snippet_as_its_own_project(pulumi, tmp_path):
    d = consumer_project(pulumi, tmp_path, readme_program())
    pulumi.run("preview")
    pulumi.run("up", "--yes")
    objs = read_manifests(d / "out")
    assert objs and {o["metadata"].get("namespace") for o in objs} - {None} == {"inference"}
    assert pulumi.json("stack", "output")["endpoint"]
    pulumi.run("destroy", "--yes")


def test_two_instances_in_two_namespaces(pulumi, tmp_path):
    program = readme_program()
    first, rest = program.split("k3 = K3ServingStack(", 1)
    body = "K3ServingStack(" + rest.split("pulumi.export")[0]
    program = (first + "a = " + body + "b = " + body.replace('"kimi"', '"kimi-b"', 1)
               .replace('namespace="inference"', 'namespace="inference-b"')
               + 'pulumi.export("endpoints", [a.endpoint, b.endpoint])\n')
    d = consumer_project(pulumi, tmp_path, program)
    pulumi.run("up", "--yes")
    objs = read_manifests(d / "out")
    keys = [object_key(o) for o in objs]
    assert len(keys) == len(set(keys)), "two instances wrote the same object"
    assert {k[2] for k in keys} - {None} == {"inference", "inference-b"}
    pulumi.run("destroy", "--yes")


def test_language_host_runs_a_program_with_no_config(pulumi, tmp_path):
    """k3infra's language host: a stack with no config gives the SDK `{}`, not `null`."""
    d = tmp_path / "bare"
    d.mkdir()
    (d / "Pulumi.yaml").write_text("name: bare\nruntime:\n  name: python\n  options:\n"
                                   f"    toolchain: pip\n    virtualenv: {ROOT / '.venv'}\n")
    (d / "__main__.py").write_text("import pulumi\npulumi.export('ok', True)\n")
    pulumi.cwd = d
    pulumi.run("stack", "init", "dev")
    pulumi.run("up", "--yes")
    assert pulumi.json("stack", "output") == {"ok": True}
