"""K3ServingStack from Pulumi YAML, TypeScript and Go, through the k3infra package
(`provider/`: PulumiPlugin.yaml, runtime python), with the real CLI and engine.

Each consumer under tests/e2e/consumers/ is copied out of the repository, runs
`pulumi package add <the repository copy>/provider` (the CLI runs the plugin through the
Python language host to read its schema, and the consumer language's host generates and
links an SDK), and `pulumi up` in render mode: the real Kubernetes provider writes every
object, which must be the objects the README's Python program writes with the same args.
A consumer whose language host cannot be built here is skipped, naming what the Go
module proxy refused (docs/e2e.md).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from engine import (API_KEY, IMAGE, PROXY_IMAGE, REVISION, ROOT, Pulumi, object_key,
                    read_manifests)
from engine import testbed_bin, project, pulumi, pulumi_home  # noqa: F401  (fixtures)
from test_engine import consumer_project, normalise, readme_program

pytestmark = pytest.mark.e2e

CONSUMERS = ROOT / "tests" / "e2e" / "consumers"
HOSTS = {"yaml": "pulumi-language-yaml", "typescript": "pulumi-language-nodejs",
         "go": "pulumi-language-go"}
# What the Go module proxy answered for the hosts that are not built (docs/e2e.md).
NOT_BUILT = {
    "typescript": "the Node.js language host is not built: the Go module proxy refuses "
                  "github.com/pulumi/pulumi/sdk/nodejs/cmd/pulumi-language-nodejs/v3 "
                  "(403, every version)",
    "go": "the Go language host is not built: the Go module proxy refuses "
          "github.com/pulumi/pulumi/sdk/go/pulumi-language-go/v3 (403, every version)",
}


def needs_host(testbed_bin: Path, language: str) -> None:
    if not (testbed_bin / HOSTS[language]).exists():
        pytest.skip(NOT_BUILT.get(language, f"{HOSTS[language]} is not in the testbed bin dir"))


def plugin_virtualenv(project: Path) -> None:
    """The plugin's virtualenv (PulumiPlugin.yaml: `../.venv`) as one of its own that
    sees the shared one's packages: `pulumi package add` installs the plugin's
    dependencies (the SDK's pip toolchain upgrades pip, setuptools and wheel there),
    which must not change the shared .venv."""
    venv = project / ".venv"
    venv.unlink()
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    shared = subprocess.run([str(ROOT / ".venv/bin/python"), "-c",
                             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    own = subprocess.run([str(venv / "bin/python"), "-c",
                          "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    Path(own, "k3infra-shared-venv.pth").write_text(shared + "\n")


def python_reference(pulumi: Pulumi, tmp_path: Path) -> dict:
    """What the README's Python program writes (the same args as every consumer)."""
    home = pulumi.cwd
    d = consumer_project(pulumi, tmp_path, readme_program())
    pulumi.run("up", "--yes")
    written = {object_key(o): normalise(o) for o in read_manifests(d / "out")}
    pulumi.cwd = home
    return written


def host_on_path(pulumi: Pulumi) -> None:
    """The CLI finds a bundled language host (yaml, nodejs, go) beside its own binary or
    on PATH, never in PULUMI_HOME (`pulumi plugin install language yaml` is refused as
    bundled). `make testbed` links each part's binaries into one bin dir on PATH, so these
    runs allow PATH lookups; every plugin there is one `make testbed` built."""
    pulumi.extra_env["PULUMI_IGNORE_AMBIENT_PLUGINS"] = "false"


def consumer(pulumi: Pulumi, tmp_path: Path, language: str) -> Path:
    """The consumer program, outside the repository, with the package added."""
    provider = pulumi.cwd / "provider"
    host_on_path(pulumi)
    plugin_virtualenv(pulumi.cwd)
    d = tmp_path / f"consumer-{language}"
    shutil.copytree(CONSUMERS / language, d)
    pulumi.cwd = d
    proc = pulumi.run("package", "add", str(provider), show=30, check=language != "yaml")
    if language == "yaml" and proc.returncode != 0:
        # pulumi-yaml v1.25.0 (the newest the module proxy serves) has no Link: the add
        # stops after reading the schema and generating, before it records the package.
        # Record it as the add does (Pulumi.yaml `packages:`), which is all YAML needs.
        assert "linking package: method Link not implemented" in proc.stderr, proc.stderr
        project = d / "Pulumi.yaml"
        project.write_text(project.read_text() + f"packages:\n  k3infra: {provider}\n")
    pulumi.run("stack", "init", "dev")
    pulumi.run("config", "set", "--secret", "apiKey", API_KEY, show=0)
    pulumi.run("config", "set", "kubernetes:renderYamlToDirectory", str(d / "out"), show=0)
    return d


def python_refusal(**bad) -> str:
    """The message the Python API gives for the same bad value."""
    from k3infra.config import ConfigError, parse_stack_config
    from k3infra.receipt import load_receipt

    args = {"weightsRevision": REVISION, "apiKey": API_KEY, "engineImage": IMAGE,
            "serving": {"proxyImage": PROXY_IMAGE}, "acceptModelLicense": True,
            "namespace": "inference", "createNamespace": True, **bad}
    with pytest.raises(ConfigError) as err:
        parse_stack_config(args, receipt=load_receipt())
    return str(err.value)


def up_and_compare(pulumi: Pulumi, d: Path, expected: dict) -> None:
    pulumi.run("preview")
    pulumi.run("up", "--yes", show=30)
    written = {object_key(o): normalise(o) for o in read_manifests(d / "out")}
    print(f"\nconsumer {d.name}: {len(written)} objects, Python program: {len(expected)}")
    assert sorted(written, key=str) == sorted(expected, key=str)
    differing = [k for k in written if written[k] != expected[k]]
    for k in differing:
        print(f"\nDIFFERS {k}\n  consumer: {json.dumps(written[k])[:1500]}"
              f"\n  python:   {json.dumps(expected[k])[:1500]}")
    assert not differing
    # The API key crossed two languages and the provider as a secret.
    export = pulumi.run("stack", "export", show=0).stdout
    assert API_KEY not in export and '"ciphertext"' in export
    types = {r["type"] for r in json.loads(export)["deployment"]["resources"]}
    assert "k3infra:index:K3ServingStack" in types
    assert pulumi.json("stack", "output")["endpoint"] == "http://kimi.inference.svc.cluster.local:8000"


# --- the package -----------------------------------------------------------------------

def test_cli_reads_the_inferred_schema_through_the_plugin(pulumi):
    """`pulumi package get-schema provider/` runs the plugin through the Python language
    host (RunPlugin) and prints the schema the provider serves."""
    from k3infra.plugin.host import K3Provider

    plugin_virtualenv(pulumi.cwd)
    proc = pulumi.run("package", "get-schema", str(pulumi.cwd / "provider"), show=0)
    got = json.loads(proc.stdout)
    served = json.loads(K3Provider().schema)
    print(f"\nschema: {got['name']} {got['version']}, {len(got['types'])} types, "
          f"{len(got['resources']['k3infra:index:K3ServingStack']['inputProperties'])} args")
    # The CLI normalises the document (an empty `config`, no empty `dependencies`).
    for key in ("name", "version", "description", "resources", "types", "language"):
        assert got[key] == served[key], key


def assert_bad_revision_refused(pulumi: Pulumi, program: Path) -> None:
    """A bad value in the consumer's program is refused with the message the Python API
    gives, before anything is created; the program is put back afterwards."""
    original = program.read_text()
    program.write_text(original.replace(REVISION, "main"))
    proc = pulumi.run("preview", check=False, show=30)
    assert proc.returncode != 0
    assert python_refusal(weightsRevision="main") in proc.stdout + proc.stderr
    program.write_text(original)


# --- the consumers ---------------------------------------------------------------------

def test_yaml_consumer_writes_what_the_python_program_writes(testbed_bin, pulumi, tmp_path):
    needs_host(testbed_bin, "yaml")
    expected = python_reference(pulumi, tmp_path)
    d = consumer(pulumi, tmp_path, "yaml")
    up_and_compare(pulumi, d, expected)
    assert_bad_revision_refused(pulumi, d / "Pulumi.yaml")
    pulumi.run("destroy", "--yes")


def test_typescript_consumer_writes_what_the_python_program_writes(testbed_bin, pulumi, tmp_path):
    needs_host(testbed_bin, "typescript")
    expected = python_reference(pulumi, tmp_path)
    d = consumer(pulumi, tmp_path, "typescript")
    up_and_compare(pulumi, d, expected)
    assert_bad_revision_refused(pulumi, d / "index.ts")
    pulumi.run("destroy", "--yes")


def test_go_consumer_writes_what_the_python_program_writes(testbed_bin, pulumi, tmp_path):
    needs_host(testbed_bin, "go")
    expected = python_reference(pulumi, tmp_path)
    d = consumer(pulumi, tmp_path, "go")
    up_and_compare(pulumi, d, expected)
    pulumi.run("destroy", "--yes")


# --- without their language hosts: Pulumi's own SDK generators, and each language's
# compiler over the consumer program ---------------------------------------------------

def generated_sdk(pulumi: Pulumi, tmp_path: Path, language: str, consumer_dir: Path) -> Path:
    """The SDK Pulumi's generator for `language` writes from the schema the CLI reads
    through the plugin, where `pulumi package add` puts it (sdks/k3infra)."""
    plugin_virtualenv(pulumi.cwd)
    proc = pulumi.run("package", "get-schema", str(pulumi.cwd / "provider"), show=0)
    schema = tmp_path / "schema.json"
    schema.write_text(proc.stdout)
    sdk = consumer_dir / "sdks" / "k3infra"
    subprocess.run([str(pulumi.bin_dir / "sdkgen"), "-language", language, "-out", str(sdk),
                    str(schema)], check=True)
    return sdk


def compile_step(args: list[str], cwd: Path, env: dict | None = None
                 ) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, **(env or {})})
    print(f"\n$ {' '.join(args)}    [exit {proc.returncode}]")
    for line in (proc.stdout + proc.stderr).strip().splitlines()[-12:]:
        print(f"    {line}")
    return proc


def test_typescript_consumer_compiles_against_the_generated_sdk(testbed_bin, pulumi, tmp_path):
    """The TypeScript program type-checks against the SDK Pulumi's Node.js generator
    writes (`@pulumi/pulumi` from npm, pinned by package-lock.json), and an Output where a
    key decides which resources exist does not."""
    d = tmp_path / "consumer-typescript"
    shutil.copytree(CONSUMERS / "typescript", d)
    generated_sdk(pulumi, tmp_path, "nodejs", d)
    assert compile_step(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
                        d).returncode == 0
    # `pulumi package add` links the SDK as the dependency @pulumi/k3infra; the check
    # maps the import to the generated sources instead of building the package.
    (d / "tsconfig.check.json").write_text(json.dumps({
        "extends": "./tsconfig.json",
        "compilerOptions": {"noEmit": True, "baseUrl": ".",
                            "paths": {"@pulumi/k3infra": ["./sdks/k3infra"]}}}))
    tsc = [str(d / "node_modules/.bin/tsc"), "-p", "tsconfig.check.json"]
    assert compile_step(tsc, d).returncode == 0
    index = d / "index.ts"
    good = index.read_text()
    index.write_text(good.replace(
        "    namespace:", "    replicas: cfg.requireSecret(\"apiKey\").apply(() => 2),\n    namespace:"))
    proc = compile_step(tsc, d)
    assert proc.returncode != 0
    assert "Type 'OutputInstance<number>' is not assignable to type 'number'" in proc.stdout


def test_go_consumer_compiles_against_the_generated_sdk(testbed_bin, pulumi, tmp_path):
    """The Go program builds against the SDK Pulumi's Go generator writes (go.mod points
    at sdks/k3infra as `pulumi package add` does)."""
    d = tmp_path / "consumer-go"
    shutil.copytree(CONSUMERS / "go", d)
    generated_sdk(pulumi, tmp_path, "go", d)
    proc = compile_step(["go", "build", "-o", str(tmp_path / "k3-go"), "."], d,
                        {"GOFLAGS": "-mod=mod", "GOWORK": "off"})
    assert proc.returncode == 0


def test_consumers_use_the_e2e_values():
    """The consumer programs pass the values the Python reference program gets."""
    for language, name in (("yaml", "Pulumi.yaml"), ("typescript", "index.ts")):
        text = (CONSUMERS / language / name).read_text()
        for value in (REVISION, IMAGE, PROXY_IMAGE, '"inference"' if language != "yaml"
                      else "namespace: inference"):
            assert value in text, (language, value)
    assert os.path.exists(ROOT / "provider" / "PulumiPlugin.yaml")
