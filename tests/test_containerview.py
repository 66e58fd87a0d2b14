"""`k3infra render --show` (issue 47, point 1): every container of the serving pod, the
prefetch Job and the benchmark Job as it will run, each line with its origin. The view's
values are held to the rendered objects, its origins to literal expectations and to the
stack's own keys, and the README's copy to what the command prints."""
from __future__ import annotations

import re

import pytest

from k3infra import origin
from k3infra.cli import main
from k3infra.config import parse_stack_config
from k3infra.containerview import ViewError, container_views, show
from k3infra.engine import resolve_engine
from k3infra.receipt import load_receipt

from conftest import GOOD_REVISION, PREBUILT, ROOT, STACKS, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
# Everything a container of these pods can carry: the benchmark, a custom profile's
# engine-path changes, surface args and env, the HF token, a mirror Hub.
EVERYTHING = (PIN, "benchmark.enabled=true", "profile=custom",
              'custom.args=["--max-num-seqs", "64"]', 'custom.env={"NCCL_ALGO": "Ring"}',
              'surface.args={"--uvicorn-log-level": "warning", "--enable-auto-tool-choice": true}',
              'surface.env={"VLLM_LOGGING_LEVEL": "DEBUG"}', "hfToken=hf_docs_test_token",
              "weights.hubEndpoint=https://hub.example.com")
MULTI_NODE = ("topology=multi-node", "gpuProduct=NVIDIA-GB300", "gpuMemoryGib=267.69")


def _by_name(views, workload_prefix: str, name: str):
    (v,) = [v for v in views if v.workload.startswith(workload_prefix) and v.name == name]
    return v


def _words(lines) -> list:
    return [w for line in lines for w in line.value]


def test_every_value_of_the_view_is_the_rendered_statefulsets():
    r = render()
    (c,) = [c for c in manifest(r, "StatefulSet")["spec"]["template"]["spec"]["containers"]
            if c["name"] == "vllm"]
    v = _by_name(container_views(r), "StatefulSet", "vllm")
    assert v.image.value == c["image"]
    assert _words(v.command) == c["command"] and _words(v.args) == c["args"]
    assert [e.value for e in v.env] == c["env"]


def test_the_readme_shows_the_engine_container_as_the_command_prints_it():
    """README "What runs in each container": the block is `k3infra render --show vllm` of
    the default stack, line for line (`…` stands for a digest that follows the runtime
    files; tests/test_docs_commands.py runs the same command)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```console\n\$ k3infra render --show vllm\n(.*?)```", text, re.S).group(1)
    expected = block.rstrip("\n").split("\n")
    r = render()
    cfg = parse_stack_config(r.raw_config, tuple(r.secret_keys), receipt=load_receipt())
    printed = show(r, load_receipt().id, cfg.profile, "vllm")
    assert len(printed) == len(expected), "\n".join(printed)
    for want, got in zip(expected, printed):
        pattern = ".*?".join(re.escape(p) for p in want.split("…"))
        assert re.fullmatch(pattern, got), f"README: {want}\nprints: {got}"


def test_origins_of_the_engine_container_literally():
    v = _by_name(container_views(render("existing", PIN, *PREBUILT)), "StatefulSet", "vllm")
    args = {" ".join(line.value): str(line.origin) for line in v.args}
    assert args["--tensor-parallel-size 8"] == ("receipt engine path: tensor parallel 8 across "
                                                "the node's NVLink domain")
    assert args["--disable-custom-all-reduce"] == (
        "receipt engine path: the custom all-reduce failed at CUDA graph capture; all-reduce "
        "runs on NCCL")
    assert args["--port 8001"] == "receipt surface, stack: k3:serving.enginePort = 8001"
    assert args["--served-model-name kimi-k3"] == "receipt surface, stack: k3:servedModelName = kimi-k3"
    assert args["--host 127.0.0.1"].startswith("receipt surface, k3infra: ")
    assert args[f"/weights/moonshotai--Kimi-K3/{GOOD_REVISION}"].endswith(
        f"k3:weightsRevision = {GOOD_REVISION}")
    env = {e.value["name"]: str(e.origin) for e in v.env}
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "receipt engine path: expandable-segments allocator"
    assert env["VLLM_API_KEY"].startswith("receipt surface, stack: k3:apiKey = [secret]")
    assert env["K3_GATE_MODE"] == "stack: k3:weights.gateMode = warm"
    assert env["K3_EXPECT_TREE_DIGEST"] == "receipt: model.tree_digest"
    image = PREBUILT[1].split("=", 1)[1]
    assert str(v.image.origin) == f"stack: k3:engineImage = {image}"
    (script_line, engine) = v.command
    assert script_line.value[:2] == ("sh", "-c") and engine.value == ("vllm", "serve")
    assert "k3infra/serving/pod/start.sh" in str(script_line.origin)


def test_the_script_is_printed_step_by_step_and_secrets_masked():
    lines = show(render("existing", *EVERYTHING), "r", "custom")
    text = "\n".join(lines)
    assert "    sh -c <script> k3-start  # k3infra: the start script" in text
    script = (ROOT / "k3infra/serving/pod/start.sh").read_text().rstrip("\n").split("\n")
    assert [f"      | {s}".rstrip() for s in script] == [ln for ln in lines if ln.startswith("      |")][:len(script)]
    assert "hf_docs_test_token" not in text
    assert "    HF_TOKEN=<secretKeyRef kimi-k3-hf-token/token>  # stack: k3:hfToken = [secret]" in text
    assert re.search(r"    K3_RUNTIME_BOOTSTRAP=<\d+ bytes, sha256 [0-9a-f]{16}>  # k3infra: "
                     r"k3infra/weights/pod/bootstrap\.py", text)
    assert ("    --max-num-seqs 64  # stack: k3:custom.args = --max-num-seqs 64 (profile custom: "
            "NOT the measured configuration)") in text
    assert ("    --uvicorn-log-level warning  # receipt surface, stack: "
            "k3:surface.args.--uvicorn-log-level = warning") in text
    assert ("    NCCL_ALGO=Ring  # stack: k3:custom.env.NCCL_ALGO = Ring (profile custom: NOT the "
            "measured configuration)") in text


def _config_value(cfg, key: str):
    """The value of a dotted `k3:` key path in the parsed config (aliases as written)."""
    value = cfg
    parts = key.split(".")
    while parts:
        part = parts.pop(0)
        if isinstance(value, dict):
            return value[".".join([part, *parts])]
        fields = type(value).model_fields
        name = next((n for n, f in fields.items() if (f.alias or n) == part), None)
        assert name is not None, f"k3:{key}: no key {part!r} in {type(value).__name__}"
        value = getattr(value, name)
    return value


def _as_shown(value) -> list[str]:
    """How an origin may write a config value (a list: joined as the flag or the key has it)."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, list):
        return [",".join(map(str, value)), " ".join(map(str, value))]
    return [str(value)]


@pytest.mark.parametrize("stack,overrides", [*((s, ()) for s in STACKS),
                                             ("existing", EVERYTHING),
                                             ("existing", MULTI_NODE)])
def test_every_container_shown_has_origins_and_each_stack_key_is_the_stacks(stack, overrides):
    r = render(stack, *overrides)
    receipt = load_receipt()
    cfg = parse_stack_config(r.raw_config, tuple(r.secret_keys), receipt=receipt)
    views = container_views(r)
    workloads = {v.workload.split(" ")[0] for v in views}
    assert {"Job"} < workloads and workloads & {"StatefulSet", "LeaderWorkerSet"}
    if "benchmark.enabled=true" in overrides:
        assert {"bench", "weights-gate"} <= {v.name for v in views}
    for v in views:
        for line in [v.image, *v.command, *v.args, *v.env]:
            o = line.origin
            assert o.kind.split(", ")[-1] in (origin.ENGINE_PATH, origin.RECEIPT,
                                              origin.STACK, origin.K3INFRA), o
            if o.kind.endswith(origin.STACK):
                m = re.fullmatch(r"k3:(\S+) = (.*?)(?: \(.*\))?", o.detail)
                assert m, o
                key, shown = m.groups()
                value = _config_value(cfg, key)
                assert shown == "[secret]" or shown in _as_shown(value), (v.name, key, shown)


def test_the_image_origin_follows_the_engines_choice():
    """k3infra.origin.engine_image says what resolve_engine decides: the image the stack
    names, or the digest a build pushes."""
    receipt = load_receipt()
    for overrides in [(PIN,), (PIN, *PREBUILT), (PIN, *PREBUILT, "profile=upstream")]:
        r = render("existing", *overrides)
        cfg = parse_stack_config(r.raw_config, tuple(r.secret_keys), receipt=receipt)
        o = origin.engine_image(cfg)
        plan = resolve_engine(receipt, cfg)
        assert (o == origin.stack("engineImage", cfg.engine_image)) == (plan.image is not None)
        if plan.image is None:
            assert f"k3:engine.registry = {plan.repository}" in o.detail


def test_a_container_no_builder_tagged_is_an_error_not_a_guess():
    r = render()
    doctored = type(r)(r.stack, r.raw_config, r.secret_keys, r.resources, r.outputs,
                       r.warnings, [s for s in r.sources if s.name != "proxy"])
    with pytest.raises(ViewError, match="container proxy has no origins"):
        container_views(doctored)
    # Tags that disagree with what was registered pair with nothing either.
    edited = [s for s in r.sources if s.name == "vllm"][0]
    other = origin.ContainerSource(edited.name, edited.image, edited.command, edited.args[:-1],
                                   edited.env)
    doctored.sources = [other if s.name == "vllm" else s for s in r.sources]
    with pytest.raises(ViewError, match="container vllm has no origins"):
        container_views(doctored)


def test_an_untagged_part_is_refused_at_build():
    with pytest.raises(TypeError, match="not a tagged tuple part"):
        origin.container({"name": "x", "image": origin.Tagged("i", origin.k3infra("t")),
                          "command": ["sh"]})


def test_cli_show_prints_one_container_and_refuses_an_unknown_name(tmp_path, capsys):
    assert main(["render", "--show", "proxy", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "StatefulSet kimi-k3: container proxy" in out and "container vllm" not in out
    assert (tmp_path / "plan.json").is_file()
    assert main(["render", "--show", "nginx", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "k3infra render: --show nginx: no container of that name; accepted: prefetch, proxy, vllm")
    assert main(["render", "--stack", "host", "--show", "--out", str(tmp_path / "host")]) == 2
    assert capsys.readouterr().err.strip() == (
        "k3infra render: --show prints the pods of a cluster stack; stack host is one Docker "
        "host: `k3infra render --stack host` lists its containers and writes them to "
        "compose.yaml")
