"""Each `k3:*` key is defined once, in the config models; Pulumi.yaml's `config:` block and
the key tables of docs/ are written from them (k3infra/config/reference.py). One test
fails when a generated file is stale, naming it and the command that rewrites it."""
from __future__ import annotations

import shutil

import pytest

from k3infra.config import reference as ref
from k3infra.config.reference import COMMAND, key, keys

from conftest import ROOT


def test_no_generated_file_is_stale():
    stale = [str(p.relative_to(ROOT)) for p in ref.stale()]
    assert not stale, f"stale: {', '.join(stale)}: run `{COMMAND}`"


def test_a_hand_edited_table_is_named_as_stale(tmp_path):
    for name in ("Pulumi.yaml", "docs"):
        (shutil.copytree if name == "docs" else shutil.copy)(ROOT / name, tmp_path / name)
    assert ref.stale(tmp_path) == []
    page = tmp_path / "docs" / "engine.md"
    page.write_text(page.read_text().replace("| `k3:engine.buildCpu` | `32` |",
                                             "| `k3:engine.buildCpu` | `16` |"))
    pulumi_yaml = tmp_path / "Pulumi.yaml"
    pulumi_yaml.write_text(pulumi_yaml.read_text().replace("default: 1\n", "default: 2\n"))
    assert ref.stale(tmp_path) == [pulumi_yaml, page]
    for path, text in ref.generated(tmp_path).items():
        path.write_text(text)
    assert ref.stale(tmp_path) == []


def test_every_key_is_described_and_in_a_docs_table():
    tabled = {k for page in (ROOT / "docs").glob("*.md") for k in ref.tabled_keys(page.read_text())}
    every = [k.path for k in keys()]
    assert len(every) > 200
    assert set(every) <= tabled, sorted(set(every) - tabled)
    undescribed = [k.name for k in keys() if not k.description]
    assert not undescribed, undescribed
    for k in keys():
        if k.page:
            assert (ROOT / "docs" / k.page).is_file(), (k.name, k.page)


def test_rows_carry_type_bounds_default_and_meaning():
    serving = ref.table("serving").splitlines()
    assert serving[0] == "| key | default | accepts | meaning |"
    assert ("| `k3:serving.resources.cpu` | `96` | a number, 1–1024 | the CPU request in cores, "
            "what the scheduler reserves on the node (`0.5` renders as `500m`) |") in serving
    assert ("| `k3:serving.resources.cpuLimit` | the request | a number, 0.01–1024 | the CPU "
            "limit in cores |") in serving
    assert ("| `k3:serving.updateStrategy` | `RollingUpdate` | `RollingUpdate` or `OnDelete` |"
            in ref.table("serving"))
    assert ("| `k3:serving.proxyImage` | `nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:"
            "0…0` | pinned by digest: \\<repository>[:\\<tag>]@sha256:\\<64 hex> |"
            in ref.table("serving"))
    top = ref.table("top-level")
    assert "| `k3:apiKey` | required (secret) | an RFC 6750 bearer token" in top
    assert "| `k3:engine` | see [engine](engine.md) | an object | how the engine image is obtained |" in top
    # A pattern with `|` stays one cell; an object's rows follow its own.
    oci = ref.table("nodePool.oci")
    assert "matching `^ocid1\\.(compartment\\|tenancy)\\.`" in oci
    assert ref.table_keys("nodePool.aws")[4:7] == [key("nodePool.aws.subnets"),
                                                   key("nodePool.aws.subnets[].id"),
                                                   key("nodePool.aws.subnets[].availabilityZone")]
    index = ref.table("engine.build", index=True)
    assert "| `k3:engine.build` | `prebuilt` with `k3:engineImage`, else `in-cluster`" in index
    assert index.rstrip().endswith("| [engine](engine.md) |")


def test_schema_text_is_plain_and_complete():
    assert key("weights.localStorageClass").schema_description() == (
        "`k3:weights.localStorageClass`. `node-local`: the StorageClass of the per-node local "
        "PersistentVolumes (node affinity, `WaitForFirstConsumer`); see weights "
        "(docs/weights.md#node-local-mode-local-persistentvolumes) for what creates them. "
        "Accepts a DNS subdomain (at most 253 lowercase letters, digits, '-' and '.').")
    # Literal values the meaning names are not listed again; what unset means is said.
    assert key("serving.drainSeconds").text() == (
        "The preStop drain before vLLM gets SIGTERM (which aborts requests still running). "
        "Accepts an integer, 0–3600. Default: derived: 10 s of endpoint propagation + the "
        "receipt's slowest measured request.")
    assert "Accepts" not in key("profile").text()
    assert key("hfToken").secret and key("apiKey").secret and not key("namespace").secret
    assert key("replicas").default == 1 and key("serving").default is None


def test_pulumi_yaml_declares_by_the_rule():
    import yaml

    declared = yaml.safe_load(ref.pulumi_config())["config"]
    assert list(declared) == ["weightsRevision", "replicas", "topology", "profile", "apiKey",
                              "acceptModelLicense", "servedModelName"]
    assert declared["apiKey"] == {"type": "string", "secret": True,
                                  "description": declared["apiKey"]["description"]}
    assert declared["apiKey"]["description"].endswith("Required.")
    assert declared["replicas"]["default"] == 1 and declared["replicas"]["type"] == "integer"


def test_a_marker_naming_no_key_fails_naming_it():
    with pytest.raises(KeyError, match="k3:serving.cpu is no key"):
        ref.write_tables("<!-- k3 keys: serving.cpu -->\n<!-- /k3 keys -->\n")
    with pytest.raises(ValueError, match="no closing"):
        ref.write_tables("<!-- k3 keys: serving -->\n| x |\n", "docs/x.md")


def test_the_command_writes_and_checks(capsys, monkeypatch, tmp_path):
    for name in ("Pulumi.yaml", "docs"):
        (shutil.copytree if name == "docs" else shutil.copy)(ROOT / name, tmp_path / name)
    monkeypatch.setattr(ref, "ROOT", tmp_path)
    page = tmp_path / "docs" / "host.md"
    page.write_text(page.read_text().replace("`127.0.0.1` |", "`0.0.0.0` |"))
    assert ref.main(["--check"]) == 1
    assert capsys.readouterr().err == f"stale: docs/host.md (run `{COMMAND}`)\n"
    assert ref.main([]) == 0 and ref.main(["--check"]) == 0
    assert ref.main(["--bogus"]) == 2
