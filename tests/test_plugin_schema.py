"""The schema other languages generate their SDK from (k3infra/plugin): every `k3:*` key
there with its type, the secrets marked, the version tied to the package's.

The schema is the one the provider serves (`K3Provider().schema`); tests/e2e/
test_consumers.py checks that the real CLI reads the same one through the plugin.
"""
import json
import re
import tomllib
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from conftest import ROOT
from k3infra.config import StackConfig
from k3infra.inputs import WIREABLE
from k3infra.plugin.host import K3Provider, package_version
from k3infra.plugin.shapes import type_name

PREFIX = "k3infra:index:"


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(K3Provider().schema)


def component(schema: dict) -> dict:
    return schema["resources"][PREFIX + "K3ServingStack"]


def resolve(schema: dict, dotted: str) -> dict:
    """The schema property of a dotted key (`nodePool.aws.subnets[].id`)."""
    props = component(schema)["inputProperties"]
    prop: dict = {}
    for part in dotted.split("."):
        name, items = part.removesuffix("[]"), part.endswith("[]")
        assert name in props, f"k3:{dotted}: no '{name}' in {sorted(props)}"
        prop = props[name]
        if items:
            prop = prop["items"]
        if "$ref" in prop:
            props = schema["types"][prop["$ref"].removeprefix("#/types/")].get("properties", {})
    return prop


def _inner(ann: Any) -> Any:
    if get_origin(ann) is Union:
        members = [a for a in get_args(ann) if a is not type(None)]
        ann = members[0] if len(members) == 1 else ann
    if get_origin(ann) is Annotated:      # a checked type (k3infra.fieldtypes): its base
        return get_args(ann)[0]
    return ann


def _expected_type(ann: Any) -> dict:
    ann = _inner(ann)
    if get_origin(ann) is Literal:
        ann = type(get_args(ann)[0])
    if get_origin(ann) is list:
        return {"type": "array"}
    if get_origin(ann) is dict:
        return {"type": "object"}
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return {"$ref": f"#/types/{PREFIX}{type_name(ann)}"}
    return {"type": {str: "string", int: "integer", float: "number", bool: "boolean"}.get(ann, "string")}


def every_key(model: type[BaseModel] = StackConfig, prefix: str = ""):
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        yield key, field
        inner = _inner(field.annotation)
        if get_origin(inner) is list:
            inner = get_args(inner)[0]
            key += "[]"
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield from every_key(inner, key + ".")


def test_every_config_key_is_in_the_schema_with_its_type(schema):
    keys = list(every_key())
    assert len(keys) > 150          # every section, every cloud
    for key, field in keys:
        prop = resolve(schema, key)
        for k, v in _expected_type(field.annotation).items():
            assert prop.get(k) == v, f"k3:{key}: {k} {prop.get(k)!r}, expected {v!r}"
        assert prop["description"].startswith(f"`k3:{key}`."), key


def test_every_documented_key_resolves(schema):
    doc = (ROOT / "docs" / "configuration.md").read_text()
    keys = set(re.findall(r"^\| `(?:k3:)?([a-z][\w.]*)` \|", doc, re.M))
    assert {"weightsRevision", "serving.proxyImage", "weights.gateMode", "nodePool.aws",
            "network.hubPorts", "accuracy.tasks"} <= keys
    for key in keys:
        resolve(schema, key)


def test_nested_sections_are_typed_objects_not_maps(schema):
    for section in ("surface", "custom", "serving", "weights", "engine", "nodePool",
                    "benchmark", "accuracy", "monitoring", "network", "host"):
        assert "$ref" in component(schema)["inputProperties"][section], section
    types = schema["types"]
    aws = types[PREFIX + "AwsPool"]
    assert aws["required"] == ["clusterName", "securityGroupIds", "subnets"]
    assert aws["properties"]["subnets"]["items"]["$ref"] == f"#/types/{PREFIX}AwsSubnet"
    assert types[PREFIX + "AwsSubnet"]["required"] == ["availabilityZone", "id"]
    # The one key whose values are a string or `true` (a switch).
    assert types[PREFIX + "Surface"]["properties"]["args"]["additionalProperties"] == {
        "$ref": "pulumi.json#/Any", "plain": True}
    assert types[PREFIX + "Surface"]["properties"]["env"]["additionalProperties"] == {
        "type": "string", "plain": True}


def test_secrets_required_and_wired_keys(schema):
    props = component(schema)["inputProperties"]
    assert [k for k, p in props.items() if p.get("secret")] == ["apiKey", "hfToken"]
    assert component(schema)["requiredInputs"] == ["apiKey", "weightsRevision"]
    # Keys that accept an Output are Inputs in a generated SDK; the rest are plain
    # there too, because they decide which resources exist.
    for key in ("weightsRevision", "apiKey", "hfToken", "engineImage"):
        assert not props[key].get("plain"), key
    for key in ("replicas", "profile", "acceptModelLicense", "namespace", "servedModelName",
                "gpuProduct", "serving", "weights", "nodePool"):
        assert props[key].get("plain") is True, key
    for key in WIREABLE:
        if not key.endswith("[]"):
            assert not resolve(schema, key).get("plain"), key
    assert resolve(schema, "nodePool.aws.securityGroupIds")["items"].get("plain") is None
    assert resolve(schema, "weights.mode")["plain"] is True


def test_defaults_and_descriptions_come_from_the_models(schema):
    props = component(schema)["inputProperties"]
    assert props["replicas"]["default"] == 1
    assert props["profile"]["default"] == "measured"
    assert props["acceptModelLicense"]["default"] is False
    assert props["servedModelName"]["default"] == "kimi-k3"
    assert "default" not in props["namespace"]          # the instance name: derived
    assert resolve(schema, "serving.port")["default"] == 8000
    assert resolve(schema, "weights.mode")["default"] == "shared"
    assert resolve(schema, "nodePool.aws.efaInterfaces")["default"] == 16
    # The model's description, what the type accepts, what unset means (k3infra/config/
    # reference.py), the same words as the docs tables.
    assert "Accepts a 40-hex Hub commit (lowercase)" in props["weightsRevision"]["description"]
    assert "Accepts" not in props["profile"]["description"]    # the meaning names each value
    assert "`RollingUpdate`" in resolve(schema, "serving.updateStrategy")["description"]
    assert resolve(schema, "engine.build")["description"].endswith(
        "Default: `prebuilt` with `k3:engineImage`, else `in-cluster` (the `upstream` profile "
        "and a Docker host need `k3:engineImage`).")
    assert resolve(schema, "serving.resources.cpuLimit")["description"] == (
        "`k3:serving.resources.cpuLimit`. The CPU limit in cores. Accepts a number, 0.01–1024. "
        "Default: the request.")
    assert resolve(schema, "serving.resources.cpu")["default"] == 96
    assert "default" not in resolve(schema, "serving.resources.cpuLimit")


def test_outputs_are_the_components_with_descriptions(schema):
    from k3infra.stack import K3ServingStack

    outputs = component(schema)["properties"]
    names = list(K3ServingStack.__annotations__)
    assert len(outputs) == len(names) == 16
    assert set(outputs) == {"endpoint", "servedModelName", "receiptId", "receiptSha256",
                            "receiptStatus", "engineCommit",
                            "engineVersion", "wheelSha256", "imageDigest", "engineProfile",
                            "weightsRevision", "treeDigest", "image", "profile", "licenseName",
                            "topology"}
    assert all(p.get("description") for p in outputs.values())
    assert sorted(component(schema)["required"]) == sorted(
        set(outputs) - {"engineCommit", "engineVersion", "wheelSha256"})


def test_schema_version_is_the_package_version(schema):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert schema["name"] == "k3infra"
    assert schema["version"] == package_version() == project["version"]


def test_readme_programs_are_the_consumer_programs_make_e2e_runs():
    """Each language's README program is the consumer tests/e2e/consumers/ holds, with
    the e2e values in place of the placeholders."""
    readme = (ROOT / "README.md").read_text()
    values = {"<40-hex commit>": "3f1c2b4a5d6e7f8091a2b3c4d5e6f708192a3b4c",
              "registry.example.com/k3/vllm@sha256:<64 hex>":
                  "registry.example.com/k3/vllm-k3@sha256:" + "5e" * 32,
              "alpine-slim@sha256:<64 hex>": "alpine-slim@sha256:" + "7a" * 32}
    for language, name in (("yaml", "Pulumi.yaml"), ("typescript", "index.ts"),
                           ("go", "main.go")):
        block = re.search(rf"<!-- e2e: consumer {language} -->\n```\w+\n(.*?)```", readme, re.S)
        assert block, language
        text = block.group(1)
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        program = (ROOT / "tests/e2e/consumers" / language / name).read_text()
        program = "".join(line for line in program.splitlines(keepends=True)
                          if not line.startswith("#"))
        assert text == program, language
