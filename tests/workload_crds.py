"""The LeaderWorkerSet and ComputeDomain CRDs of the multi-node render and an offline
check of rendered objects against their structural schemas: the validation the API
server runs on a custom resource, and its pruning (a field the schema does not know is
dropped silently on the server; here it is an error).

LeaderWorkerSet: the release's own CRD file (tools/testbed/workload-crds/pins.json), from
the testbed bin dir when `make e2e` built the part (K3INFRA_TESTBED_BIN), else `go mod
download`, which verifies the module against the pinned hash (a warm module cache needs
no network).

ComputeDomain: the Go module proxy refuses github.com/NVIDIA/k8s-dra-driver-gpu (403,
"This module version is not available"), and nothing else here serves its CRD. Its
schema below is k3infra's own statement of the v25.8.1 API (resource.nvidia.com/v1beta1,
api/nvidia.com/resource/v1beta1/computedomain.go of that release: spec.numNodes and
spec.channel required, channel.resourceClaimTemplate.name required, allocationMode All or
Single; the spec immutable), not the release's file: it checks what k3infra writes
against that API, and is only as right as this transcription.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "tools" / "testbed" / "workload-crds" / "pins.json"


def pins() -> list[dict]:
    return json.loads(PINS.read_text())["crds"]


COMPUTE_DOMAIN_RELEASE = "NVIDIA k8s-dra-driver-gpu v25.8.1"


def compute_domain_crd() -> dict:
    """The ComputeDomain CRD (resource.nvidia.com/v1beta1) as k3infra states it (above)."""
    string, integer = {"type": "string"}, {"type": "integer"}
    spec = {
        "type": "object", "required": ["channel", "numNodes"],
        "x-kubernetes-validations": [{"rule": "self == oldSelf",
                                      "message": "A computeDomain.spec is immutable"}],
        "properties": {
            "numNodes": integer,
            "channel": {"type": "object", "required": ["resourceClaimTemplate"], "properties": {
                "allocationMode": {"type": "string", "enum": ["All", "Single"],
                                   "default": "Single"},
                "resourceClaimTemplate": {"type": "object", "required": ["name"],
                                          "properties": {"name": string}}}}}}
    status = {"type": "object", "required": ["status"], "properties": {
        "status": {"type": "string", "enum": ["Ready", "NotReady"], "default": "NotReady"},
        "nodes": {"type": "array", "x-kubernetes-list-type": "map",
                  "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "required": ["cliqueID", "ipAddress", "name"],
                            "properties": {"cliqueID": string, "ipAddress": string,
                                           "name": string, "index": integer,
                                           "status": {"type": "string",
                                                      "enum": ["Ready", "NotReady"]}}}}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "computedomains.resource.nvidia.com",
                     "annotations": {"k3infra.dev/source": f"k3infra's statement of "
                                     f"{COMPUTE_DOMAIN_RELEASE} (tests/workload_crds.py)"}},
        "spec": {"group": "resource.nvidia.com", "scope": "Namespaced",
                 "names": {"kind": "ComputeDomain", "listKind": "ComputeDomainList",
                           "plural": "computedomains", "singular": "computedomain"},
                 "versions": [{"name": "v1beta1", "served": True, "storage": True,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {
                                   "type": "object", "properties": {
                                       "apiVersion": string, "kind": string,
                                       "metadata": {"type": "object"},
                                       "spec": spec, "status": status}}}}]}}


def write_compute_domain_crd(directory: Path) -> Path:
    path = Path(directory) / "resource.nvidia.com_computedomains.yaml"
    path.write_text(yaml.safe_dump(compute_domain_crd(), sort_keys=False))
    return path


@lru_cache(maxsize=None)
def crd_paths() -> dict[str, Path]:
    """kind -> the pinned CRD file (the LeaderWorkerSet's)."""
    out: dict[str, Path] = {}
    built = Path(os.environ.get("K3INFRA_TESTBED_BIN", "/nonexistent")) / "workload-crds"
    for crd in pins():
        name = Path(crd["file"]).name
        if (built / name).is_file():
            out[crd["kind"]] = built / name
            continue
        if shutil.which("go") is None:
            pytest.skip("the pinned CRDs need `go mod download` (no go) or "
                        "tools/testbed/workload-crds/build.sh in K3INFRA_TESTBED_BIN")
        ref = f"{crd['module']}@{crd['version']}"
        with tempfile.TemporaryDirectory() as work:
            proc = subprocess.run(["go", "mod", "download", "-json", ref], cwd=work,
                                  capture_output=True, text=True,
                                  env={**os.environ, "GOFLAGS": "-mod=mod"})
        got = json.loads(proc.stdout or "{}")
        if proc.returncode != 0 or got.get("Error"):
            pytest.skip(f"go mod download {ref} failed: {got.get('Error') or proc.stderr[-500:]}")
        assert got["Sum"] == crd["sum"], f"{ref}: {got['Sum']} != pinned {crd['sum']}"
        out[crd["kind"]] = Path(got["Dir"]) / crd["file"]
    return out


@lru_cache(maxsize=None)
def crd(kind: str) -> dict:
    if kind == "ComputeDomain":
        return compute_domain_crd()
    return yaml.safe_load(crd_paths()[kind].read_text())


def version_schema(obj: dict) -> dict:
    """The openAPIV3Schema of the CRD version `obj` is written in (KeyError if unserved)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    definition = crd(obj["kind"])
    assert definition["spec"]["group"] == group, (definition["spec"]["group"], group)
    for v in definition["spec"]["versions"]:
        if v["name"] == version and v.get("served"):
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(f"{obj['kind']} CRD serves no {version}")


def _pruned(value: Any, schema: dict, path: str) -> list[str]:
    """Fields the API server would prune: not in `properties`, with no
    additionalProperties and no x-kubernetes-preserve-unknown-fields."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                out += _pruned(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += _pruned(item, extra, f"{path}.{key}")
            elif not extra:
                out.append(f"{path}.{key}: unknown field (the API server prunes it)")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += _pruned(item, schema["items"], f"{path}[{i}]")
    return out


def schema_errors(obj: dict) -> list[str]:
    """Every way `obj` fails its pinned CRD's schema ([] when the server would store it
    as rendered). The object's own metadata is ObjectMeta, checked by the server itself."""
    from jsonschema import Draft7Validator

    schema = version_schema(obj)
    body = {k: v for k, v in obj.items() if k != "metadata"}
    root = {**schema, "properties": {k: v for k, v in schema.get("properties", {}).items()
                                     if k != "metadata"}}
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in Draft7Validator(root).iter_errors(body)]
    return errors + _pruned(body, root, obj["kind"])
