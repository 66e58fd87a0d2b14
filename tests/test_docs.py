"""Docs are part of the product: README's quick start and pinned facts stay true to
the Makefile, CI and the receipt; every config key is documented."""
import re

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_quick_start_has_exactly_two_setup_commands():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", quick, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make render", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^render:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def _make_vars(makefile: str) -> dict[str, str]:
    return dict(re.findall(r"^(\w+)\s*[:?]?=\s*(\S+)", makefile, re.M))


def _expand(value: str, variables: dict[str, str]) -> str:
    while "$(" in value:
        value = re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], value)
    return value


def test_quick_start_says_what_make_test_runs():
    """The quick start's account of `make test` (the venvs it makes, the pytest selection)
    is the Makefile's, whatever tiers it grows."""
    import tomllib

    quick = " ".join(README.split("## Quick start", 1)[1].split("\n## ", 1)[0].split())
    makefile = (ROOT / "Makefile").read_text()
    variables = _make_vars(makefile)
    rule = re.search(r"^test:(.*)\n((?:\t.*\n?)+)", makefile, re.M)
    venvs = []
    for target in rule.group(1).split():
        stamp = re.search(rf"^{re.escape(target)}:\s*(\S+)", makefile, re.M).group(1)
        if stamp.startswith("@"):          # a recipe of its own, not a venv stamp
            assert f"`{target}`" in quick, target
            continue
        venvs.append(_expand(stamp, variables).split("/bin/")[0])
    assert venvs and all(f"`{v}`" in quick for v in venvs), venvs
    for tool in ("nginx-light", "tools/testbed/build.sh"):
        assert tool in makefile and f"`{tool}`" in quick, tool
    recipe = rule.group(2)
    marker = re.search(r"-m\s+'([^']+)'", recipe)
    if marker is None:
        addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
            "ini_options"]["addopts"]
        marker = re.search(r"-m\s+'([^']+)'", addopts)
    assert f"`-m '{marker.group(1)}'`" in quick
    assert "`tests/test_docs_commands.py`" in quick and (ROOT / "tests/test_docs_commands.py").exists()


def test_readme_pins_match_the_receipt(receipt):
    facts = [receipt.engine.version, receipt.engine.commit, str(receipt.engine.pull_request),
             " ".join(receipt.serve.engine_arg_tokens()),
             *(f"{k}={v}" for k, v in receipt.serve.engine_env_map().items()),
             receipt.model.repo, receipt.model.tree_digest, str(receipt.model.shards),
             f"{receipt.model.size_gb:.1f} GB", f"{receipt.residency.weights_gib_per_gpu:.2f} GiB",
             f"p50 {receipt.measurement(8).p50_ms:g} ms", f"p99 {receipt.measurement(8).p99_ms:g} ms"]
    flat = " ".join(README.split())
    for fact in facts:
        assert fact in flat, fact


def test_readme_carries_every_not_measured_item(receipt):
    flat = " ".join(README.split()).lower()
    section = flat.split("## what is not measured", 1)[1]
    for item in receipt.not_measured:
        head = item.split(":")[0].split(",")[0].lower()
        assert head in section, head
    for lic in receipt.license.sections:
        assert f"section {lic.section}" in flat



def test_readme_policy_count_is_the_packs():
    from pulumi_policy import EnforcementLevel

    from k3infra.policies import POLICIES

    mandatory = sum(1 for p in POLICIES if p.enforcement_level == EnforcementLevel.MANDATORY)
    assert f"{len(POLICIES)} policies ({mandatory} mandatory)" in " ".join(README.split())


def test_serving_doc_figures_are_the_derived_ones(receipt):
    """docs/serving.md and docs/coldstart.md quote the defaults and the figures derived from
    the receipt in their prose; they must be what the code computes (the key tables are
    written from the models: tests/test_config_reference.py)."""
    from k3infra.config import parse_stack_config
    from k3infra.receipt import load_receipt
    from k3infra.plan import drain_seconds
    from k3infra.serving.startup import startup_budget_seconds

    cfg = parse_stack_config({"k3:weightsRevision": "a" * 40, "k3:apiKey": "x",
                              "k3:engineImage": "r@sha256:" + "1" * 64}, receipt=load_receipt())
    b = startup_budget_seconds(receipt, cfg)
    serving = " ".join((ROOT / "docs" / "serving.md").read_text().split())
    coldstart = " ".join((ROOT / "docs" / "coldstart.md").read_text().split())
    s = cfg.serving
    assert (f"`VLLM_ENGINE_READY_TIMEOUT_S` is {b.engine_seconds} s and the startupProbe "
            f"allows {b.failure_threshold} failures every 10 s ({b.total_seconds} s)") in serving
    for p in b.phases:
        assert f"| {p.name} | {p.formula.split(' = ')[0]} | {p.seconds} s |" in coldstart, p.name
    assert f"engine deadline {b.engine_seconds} s" in coldstart
    assert f"startupProbe {b.total_seconds} s" in coldstart
    assert f"({drain_seconds(receipt, cfg)} s with the shipped receipt" in serving
    assert f"(default {s.termination_grace_seconds} s)" in serving
    assert f"(default {s.resources.cpu})" in serving
    assert f"(default {s.resources.memory_gi} Gi)" in serving
    assert f"(default {s.shm_size_gi} Gi)" in serving


def test_security_doc_covers_the_object_store_and_its_link_local_holes():
    """docs/security.md says what the store path defends and what it opens: each node-local
    identity endpoint the prefetch policy opens (k3infra.operations.network), by address
    and port, and the mirror's window between its hash and its upload."""
    from k3infra.operations.network import IDENTITY_ENDPOINTS

    text = (ROOT / "docs" / "security.md").read_text()
    security = " ".join(text.split())
    store = " ".join(text.split("## Weights from your object store", 1)[1].split("\n## ", 1)[0].split())
    for needle in ("obstore", "`weights mirror --to/--endpoint`", "credentialsSecret",
                   "serviceAccount", "check-lock.sh", "`obstore.put` opens the path again"):
        assert needle in store, needle
    for scheme, (cidr, port) in IDENTITY_ENDPOINTS.items():
        assert f"`{cidr}` for `{scheme}://`" in security and f"on port {port}" in security, scheme
