"""The README's walk-through, word for word, with the real Pulumi CLI against the real API
server: from the template to `pulumi preview --policy-pack policy/`, every pin resolved by
`k3infra pins` from servers on loopback and no placeholder warning left.

What differs from a user's machine, and why (each through a mechanism the user has too):
- image tags resolve through a registries.conf (containers-registries.conf(5), in the
  test's HOME) whose mirrors of docker.io and ghcr.io are a loopback Debian
  `docker-registry`, holding one config-only image per tag the stack names;
- the engine repository resolves through git's `url.<base>.insteadOf` (the HOME's
  .gitconfig) to a loopback `git daemon` with `refs/pull/<the receipt's PR>/head`;
- the receipt is the shipped one with `engine.commit` set to that head's prefix (no commit
  starting `f68f4fdd` can be made here), kept in the project's receipts/ and named by the
  template the walk-through copies (its `k3:receipt` line edited in the project copy);
- HF_ENDPOINT names the loopback Hub, whose `main` is REVISION;
- KUBECONFIG names the test's control plane, whose `kubernetes` EndpointSlice gives the
  API server's address.
"""
from __future__ import annotations

import re

import pytest
import yaml

from engine import API_KEY, REVISION, ROOT
from engine import testbed_bin, project, pulumi, pulumi_home  # noqa: F401  (fixtures)

pytest_plugins = ["apiserver"]
pytestmark = pytest.mark.e2e

# What the README's placeholders stand for in this test.
PLACEHOLDERS = {
    "<a passphrase>": "k3infra-e2e-passphrase",
    "<your ReadWriteMany storage class>": "rwx-e2e",
    "<a registry/repository you can push to>": "registry.example.com/k3/vllm-k3",
    "<your API key>": API_KEY,
}
# Every image tag the `existing` template's defaults name (an in-cluster engine build),
# as registries.conf matches them: the registry, then the repository.
IMAGES = {
    "k3:serving.proxyImage": "docker.io/nginxinc/nginx-unprivileged:1.28.0-alpine-slim",
    "k3:engine.baseImages.cudaDevel": "docker.io/nvidia/cuda:13.0.2-devel-ubuntu22.04",
    "k3:engine.baseImages.uv": "ghcr.io/astral-sh/uv:0.8.22",
    "k3:engine.baseImages.rust": "docker.io/library/rust:1.90.0-slim-bookworm",
    "k3:engine.buildkitImage": "docker.io/moby/buildkit:v0.23.2-rootless",
    "k3:engine.reporterImage": "docker.io/library/python:3.12.11-slim-bookworm",
}
ENGINE_REPO = "https://github.com/vllm-project/vllm"


def readme_block(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"<!-- e2e: {re.escape(marker)} -->\n```\w*\n(.*?)```", text, re.S)
    assert m, f"README has no block marked '{marker}'"
    return m.group(1)


@pytest.fixture
def loopback_sources(tmp_path, cluster, project):  # noqa: F811 (the fixture)
    """HOME, the environment and the recorded facts for the pins' servers on loopback."""
    import hub_loopback
    from gitserver import git_daemon
    from registry import config_layout, missing_tools, run_registry

    from k3infra.receipt import load_receipt, receipt_path

    why = missing_tools()
    if why:
        pytest.skip(why)
    home = tmp_path / "home"
    (home / ".config" / "containers").mkdir(parents=True)
    receipt = load_receipt()
    with run_registry(tmp_path / "registry") as reg, \
            git_daemon(tmp_path, receipt.engine.pull_request) as git:
        digests = {}
        for key, image in IMAGES.items():
            repo, tag = image.rsplit(":", 1)
            layout = config_layout(tmp_path / f"layout-{len(digests)}", "1", key)
            digests[key] = reg.push(layout, repo, tag).split("@", 1)[1]
        (home / ".config/containers/registries.conf").write_text("".join(
            f'[[registry]]\nlocation = "{host}"\n[[registry.mirror]]\nlocation = "{reg.address}/{host}"\n\n'
            for host in ("docker.io", "ghcr.io")))
        (home / ".gitconfig").write_text(f'[url "{git.url}"]\n\tinsteadOf = {ENGINE_REPO}\n')
        doc = yaml.safe_load(receipt_path().read_text())
        assert doc["engine"]["repo"] == ENGINE_REPO
        doc["engine"]["commit"] = git.first[:8]
        mine = tmp_path / "receipt-loopback-engine.yaml"
        mine.write_text(yaml.safe_dump(doc, sort_keys=False))
        # In the project, named by the template the README copies, as a user names theirs.
        (project / "receipts").mkdir(exist_ok=True)
        (project / "receipts" / mine.name).write_text(mine.read_text())
        template = project / "stacks/examples/Pulumi.existing.yaml"
        text = template.read_text()
        assert "k3:receipt: kimi-k3-8xb300-2026-07-29" in text
        template.write_text(text.replace("k3:receipt: kimi-k3-8xb300-2026-07-29",
                                         f"k3:receipt: receipts/{mine.name}"))
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text("{}\n")
        with hub_loopback.serve(model, receipt.model.repo, revision=REVISION) as hub:
            env = {k: v for k, v in hub_loopback.environment(hub, str(tmp_path / "hf")).items()
                   if k.startswith(("HF_", "NO_PROXY", "no_proxy"))}
            env.update(HOME=str(home), COLUMNS="250", **cluster.env())
            yield home, env, digests, git.first


def test_readme_walkthrough_word_for_word(pulumi, loopback_sources):
    """The README's block, run as one shell script with its placeholders filled in."""
    home, env, digests, engine_commit = loopback_sources
    script = readme_block("walkthrough existing")
    for placeholder, value in PLACEHOLDERS.items():
        script = script.replace(placeholder, value)
    assert "<" not in script.replace("<<", ""), f"unfilled placeholder in:\n{script}"
    pulumi.extra_env.update(env)
    pulumi.use_login = True
    proc = pulumi.shell("set -euxo pipefail\n" + script, show=60)
    out = proc.stdout + proc.stderr
    assert (home / ".pulumi-k3").is_dir()       # the login the README names was used

    # `k3infra pins --write` recorded every pin from the loopback servers.
    wrote = re.search(r"wrote (\d+) value\(s\) to \S+: (.*)", out)
    assert wrote, out[-4000:]
    assert set(wrote.group(2).split(", ")) == {*IMAGES, "k3:engine.commit", "k3:weightsRevision",
                                                "k3:engine.apiServerCidrs"}
    stack = yaml.safe_load((pulumi.cwd / "stacks/Pulumi.existing.yaml").read_text())["config"]
    assert stack["k3:weightsRevision"] == REVISION
    assert stack["k3:engine"]["commit"] == engine_commit
    assert stack["k3:engine"]["apiServerCidrs"] == ["192.0.2.10/32"]   # apiserver.ADVERTISED
    assert stack["k3:serving"]["proxyImage"] == (
        "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@" + digests["k3:serving.proxyImage"])
    assert stack["k3:engine"]["baseImages"]["uv"] == "ghcr.io/astral-sh/uv:0.8.22@" + digests["k3:engine.baseImages.uv"]
    assert "secure" in str(stack["k3:apiKey"]) and API_KEY not in (pulumi.cwd / "stacks/Pulumi.existing.yaml").read_text()

    # The preview: the engine loaded the pack and ran it, and no pin is left to warn about.
    preview = proc.stdout[proc.stdout.rindex("Previewing update"):]
    summary = preview[preview.index("Policies:"):].splitlines()[:3] if "Policies:" in preview else []
    print("\npolicy pack summary:", *summary, sep="\n    ")
    assert re.search(r"Policies:.*?k3infra@v0\.1\.0", preview, re.S), preview[-3000:]
    assert "mandatory" not in preview.split("Policies:")[1].lower() or "0 mandatory" in preview
    warned = sorted(set(re.findall(r"warning: (\S+?):? ", preview)))
    print("preview warnings:", warned)
    assert "placeholder" not in preview and "unset:" not in preview, preview[-4000:]
    # What pins cannot do here, said by the render and by pins: the engine's hash-locked
    # requirement files need the engine source and PyPI (docs/pins.md).
    assert warned == ["images/build.lock", "images/runtime.lock"], preview[-4000:]

    # CI's check: every recorded tag and the PR head still name what was recorded.
    check = pulumi.shell(".venv/bin/k3infra pins --stack existing --check", show=3)
    assert "7 recorded pin(s) still name what was measured" in check.stdout
