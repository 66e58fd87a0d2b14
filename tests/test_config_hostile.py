"""Issue 28, points 1-3: hostile and malformed config. Every `k3:*` key and the stack file
against random and hostile values: each either parses (and renders) or is refused with one
line naming the key or the file; never a traceback, never a hang. The hang bound is an
alarm in the harness (a hung example fails), not an assertion on speed.

And the mechanism itself: every number a key takes is bounded above, every string a key
takes has a full-match type, so a new key cannot forget either."""
from __future__ import annotations

import tempfile
import typing
from pathlib import Path

import annotated_types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from k3infra.cli import main
from k3infra.config import ConfigError, StackConfig, apply_override, parse_stack_config, read_stack_file
from k3infra.receipt import load_receipt
from k3infra.weights import tree

from conftest import GOOD_REVISION
from hostile import bounded

R = load_receipt()
IMAGE = "registry.example.com/k3/vllm@sha256:" + "ab" * 32
BASE = {"k3:weightsRevision": GOOD_REVISION, "k3:apiKey": "sk-test", "k3:engineImage": IMAGE}


# ---- every key ----------------------------------------------------------------------------

def _section(annotation) -> type[BaseModel] | None:
    for t in (annotation, *typing.get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def config_keys(model: type[BaseModel] = StackConfig, prefix: tuple = ()) -> list[tuple]:
    """Every key path of the config: ("serving", "cpu"), ("nodePool", "aws", "subnets")..."""
    keys = []
    for name, field in model.model_fields.items():
        path = (*prefix, field.alias or name)
        keys.append(path)
        sub = _section(field.annotation)
        if sub is not None:
            keys += config_keys(sub, path)
    return keys


KEYS = config_keys()


def nest(path: tuple, value) -> dict:
    raw = dict(BASE)
    top = f"k3:{path[0]}"
    if len(path) == 1:
        raw[top] = value
        return raw
    obj = {}
    cursor = obj
    for part in path[1:-1]:
        cursor = cursor.setdefault(part, {})
    cursor[path[-1]] = value
    raw[top] = obj
    return raw


def judge(run, names: tuple[str, ...]) -> str:
    """Run `run`; it returns or raises ConfigError with one line that starts with one of
    `names` (the key set, its section, or the file); anything else propagates and fails
    the test. 'ok' or the refusal."""
    with bounded():
        try:
            run()
        except ConfigError as exc:
            msg = str(exc)
            assert "\n" not in msg and "Traceback" not in msg, msg
            assert msg.startswith(names), (names, msg)
            return msg
    return "ok"


GOOD_STRINGS = [GOOD_REVISION, IMAGE, "sk-test", "kimi-k3", "inference", "10.0.0.0/8", "30s",
                "registry.example.com/k3/vllm", "/mnt/k3-weights/x", "app", "30 4 * * 0"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**15, max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 1e-300, float("inf"), float("-inf"), float("nan"), -1, 0,
                     10**23, 2**63, 2**64 + 1]),
    st.text(max_size=30),
    st.text(alphabet=st.characters(max_codepoint=0x7f), max_size=30),
    st.sampled_from(GOOD_STRINGS),
    st.tuples(st.sampled_from(GOOD_STRINGS), st.sampled_from(["\n", "\r\n", "\t", " ", "\x00",
                                                            "\x1b[31m", "\u2028", "=="]))
    .map("".join),
    st.sampled_from(["1e308", "inf", "nan", "-1", "1" + "0" * 23, "true", "{}", "[]", "[[[",
                     '{"a": ' * 50, "[" * 5000 + "]" * 5000, "a" * 5000, "0x10", "1_000",
                     "\udcff", "${HOME}", "$(id)", "`id`", "'; rm -rf /", "../../etc/passwd"]),
)
HOSTILE = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=12) | st.sampled_from(
                           ["cpu", "enabled", "args", "--max-num-seqs", "aws", "provider"]),
                           inner, max_size=4), max_leaves=10)
CHECKS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.function_scoped_fixture])


@settings(max_examples=1500, **CHECKS)
@given(path=st.sampled_from(KEYS), value=HOSTILE)
def test_every_key_parses_or_is_refused_in_one_line(path, value):
    judge(lambda: parse_stack_config(nest(path, value), receipt=R), (f"k3:{path[0]}",))


# What a stack file already set when `--config` lands on it (a dotted key then goes into it).
STACK_VALUES = {**BASE, "k3:replicas": 2, "k3:serving": {"resources": {"cpu": 96}},
                "k3:weights": '{"sizeGi": 1700}', "k3:surface": {"args": {}}}


@settings(max_examples=800, **CHECKS)
@given(path=st.sampled_from(KEYS), tail=st.sampled_from(["", "", ".x", ".x.y", "..", ".-", ":"]),
       value=st.one_of(st.text(max_size=40), SCALARS.map(str)))
def test_every_config_override_parses_or_is_refused_in_one_line(path, tail, value):
    raw = dict(STACK_VALUES)

    def run():
        apply_override(raw, "k3:" + ".".join(path) + tail + "=" + value)
        parse_stack_config(raw, receipt=R)

    judge(run, (f"k3:{path[0]}", "--config"))


YAML_BITS = ["config:\n", "  k3:replicas: 2\n", "  k3:replicas: 3\n", "\tk3:x: 1\n", "- a\n",
             "  k3:a: !!binary aGk=\n", "  k3:a: !!python/name:os.system\n", "  k3:a: &x [1]\n",
             "  k3:b: *x\n", "  k3:d: 2026-01-01\n", "  K3:replicas: 2\n", "  k3s:apiKey: x\n",
             "  k3:serving: [\n", "  k3:serving: {cpu: 1e400}\n", "  ? [a, b]\n  : c\n",
             "  k3:apiKey: |\n    sk-abc\n", "  k3:namespace: \"ns\\n\"\n", "%YAML 1.1\n---\n",
             "...\n", "config: !!set {a}\n", "  aws:region: us-east-1\n", "  k3:weights:\n",
             "    sizeGi: 1\n", "  " * 40 + "x: 1\n", "config: null\n", "\ufeff", "\x00",
             "  k3:replicas: 0x10\n", "  k3:replicas: .inf\n", "  k3:replicas: 1e23\n"]


@settings(max_examples=500, **CHECKS)
@given(doc=st.one_of(st.lists(st.sampled_from(YAML_BITS), max_size=12).map("".join),
                     st.text(max_size=200), st.binary(max_size=200)))
def test_every_stack_file_parses_or_is_refused_in_one_line(doc):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "Pulumi.x.yaml"
        (path.write_bytes if isinstance(doc, bytes) else path.write_text)(doc)

        def run():
            raw, secrets = read_stack_file(path)
            parse_stack_config({**BASE, **raw}, tuple(secrets), receipt=R)

        judge(run, (f"{path}: ", "k3:", "K3:", "k3s:"))


# A few renders end to end (the program itself, 0.5 s each): accepted values render.
RENDER_KEYS = ["replicas", "namespace", "servedModelName", "serving.resources.cpu",
               "serving.resources.memoryGi",
               "serving.shmSizeGi", "serving.storageReadGBps", "weights.sizeGi",
               "coldStart.warmLoadGBps", "coldStart.tailFactor", "serving.drainSeconds",
               "monitoring.scrapeInterval", "network.hubPorts", "gpuMemoryGib"]


@settings(max_examples=30, **CHECKS)
@given(key=st.sampled_from(RENDER_KEYS), value=SCALARS.map(str))
def test_a_hostile_value_renders_or_is_refused_by_the_cli(key, value, capsys):
    with tempfile.TemporaryDirectory() as d, bounded(60):
        rc = main(["render", "--stack", "existing", "--config", f"weightsRevision={GOOD_REVISION}",
                   "--config", f"{key}={value}", "--out", d])
    err = capsys.readouterr().err
    assert rc in (0, 2), err
    if rc:
        assert err.count("\n") == 1 and err.startswith("k3infra render: "), err


# ---- the mechanism: no key without its bound or its pattern --------------------------

def _leaves(annotation, metadata=()) -> list[tuple[type, tuple]]:
    """(leaf type, metadata) of every value a field annotation takes (inside Optional,
    list, dict keys and values, Annotated)."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        meta = [x for m in meta for x in ([m, *m.metadata] if isinstance(m, FieldInfo) else [m])]
        return _leaves(base, (*metadata, *meta))
    args = typing.get_args(annotation)
    if args and typing.get_origin(annotation) is not typing.Literal:
        # a container's own check (Labels: the whole map) covers its items
        return [leaf for a in args for leaf in _leaves(a, metadata)]
    return [(annotation, metadata)]


def _fields(model=StackConfig, prefix=()):
    for name, field in model.model_fields.items():
        key = "k3:" + ".".join((*prefix, field.alias or name))
        sub = _section(field.annotation)
        if sub is not None:
            yield from _fields(sub, (*prefix, field.alias or name))
            continue
        yield key, _leaves(field.annotation, tuple(field.metadata))


# Strings any text may fill: every one still passes parse.check_values (no control
# character, bounded length) and is quoted where it reaches a script.
FREE_TEXT = {"k3:custom.args", "k3:custom.env", "k3:surface.args", "k3:surface.env",
             "k3:accuracy.tasks", "k3:nodePool.aws.clusterName", "k3:nodePool.aws.nodeRoleName",
             "k3:nodePool.oci.placements.availabilityDomain", "k3:nodePool.oci.nsgIds",
             "k3:nodePool.oci.sshPublicKey", "k3:nodePool.nebius.driversPreset",
             "k3:nodePool.nebius.gpuClusterId", "k3:nodePool.nebius.reservationIds",
             "k3:nodePool.nebius.serviceAccountId"}


def test_every_number_of_every_key_is_bounded_above_and_below():
    unbounded = []
    for key, leaves in _fields():
        for typ, meta in leaves:
            if typ in (int, float) and not (
                    any(isinstance(m, (annotated_types.Le, annotated_types.Lt)) for m in meta)
                    and any(isinstance(m, (annotated_types.Ge, annotated_types.Gt)) for m in meta)):
                unbounded.append(key)
    assert sorted(set(unbounded)) == []


def test_every_string_of_every_key_has_a_full_match_type():
    loose = []
    for key, leaves in _fields():
        for typ, meta in leaves:
            checked = any(type(m).__name__ == "AfterValidator" for m in meta) or any(
                getattr(m, "pattern", None) for m in meta)
            if typ is str and not checked and key not in FREE_TEXT:
                loose.append(key)
    assert loose == []


# ---- the kinds, one by one --------------------------------------------------------

def refusal(**changes) -> str:
    raw = dict(BASE)
    raw.update({f"k3:{k}": v for k, v in changes.items()})
    with pytest.raises(ConfigError) as exc:
        parse_stack_config(raw, receipt=R)
    return str(exc.value)


@pytest.mark.parametrize("key,good", [
    ("weightsRevision", GOOD_REVISION), ("namespace", "inference"), ("engineImage", IMAGE),
    ("serving", {"proxyImage": "nginx@sha256:" + "0" * 64}),
    ("engine", {"registry": "registry.example.com/k3/vllm"}),
    ("engine", {"commit": GOOD_REVISION}), ("servedModelName", "kimi-k3"),
    ("monitoring", {"scrapeInterval": "30s"}), ("gpuProduct", "NVIDIA-B300-SXM6-AC"),
])
def test_a_trailing_newline_passes_no_pattern(key, good):
    bad = {k: v + "\n" for k, v in good.items()} if isinstance(good, dict) else good + "\n"
    msg = refusal(**{key: bad})
    assert msg.startswith(f"k3:{key}") and "\\n" in msg, msg


def test_an_api_key_with_a_trailing_newline_is_refused_before_anything_renders(tmp_path, capsys):
    assert main(["render", "--config", f"weightsRevision={GOOD_REVISION}", "--config",
                 "apiKey=sk-abc\n", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("k3infra render: k3:apiKey = [secret]: contains the control character")
    assert "sk-abc" not in err
    assert not (tmp_path / "plan.json").exists()
    assert refusal(apiKey="sk abc").startswith("k3:apiKey = [secret]: must be an RFC 6750")


def test_a_block_scalar_api_key_in_a_stack_file_is_refused(tmp_path):
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text("config:\n  k3:apiKey: |\n    sk-abc\n")
    raw, secrets = read_stack_file(path)
    with pytest.raises(ConfigError, match=r"^k3:apiKey = \[secret\]: contains the control"):
        parse_stack_config({**BASE, **raw}, tuple(secrets), receipt=R)


def test_a_lock_revision_with_a_newline_is_refused():
    with pytest.raises(tree.LockError, match="40-hex"):
        tree.check_revision(GOOD_REVISION + "\n")
    with pytest.raises(tree.LockError, match="sha256"):
        tree.check_sha256("a" * 64 + "\n")


@pytest.mark.parametrize("changes,needle", [
    (dict(replicas=10**23), "k3:replicas = 100000000000000000000000: Input should be less than or equal to 1024"),
    (dict(replicas="1e23"), "k3:replicas = '1e23': Input should be a valid integer"),
    (dict(replicas=True), "k3:replicas = True: must be a number, not true/false"),
    (dict(serving={"storageReadGBps": float("inf")}), "k3:serving.storageReadGBps = inf: Input should be a finite number"),
    (dict(serving={"storageReadGBps": "1e308"}), "k3:serving.storageReadGBps = '1e308': Input should be less than or equal to 10000"),
    (dict(serving={"storageReadGBps": 1e-300}), "k3:serving.storageReadGBps = 1e-300: Input should be greater than or equal to 0.001"),
    (dict(serving={"resources": {"cpu": 100000}}), "k3:serving.resources.cpu = 100000: Input should be less than or equal to 1024"),
    (dict(serving={"resources": {"memoryGi": 10**7}}), "k3:serving.resources.memoryGi = 10000000: Input should be less than or equal to 8192"),
    (dict(serving={"resources": {"cpu": True}}), "k3:serving.resources.cpu = True: must be a number, not true/false"),
    (dict(serving={"resources": {"cpu": 8, "cpuLimit": 16}}), "k3:serving.resources = {'cpu': 8, 'cpuLimit': 16}: cpuLimit 16 differs from cpu 8: this container's limit is its request"),
    (dict(serving={"cpu": 96}), "k3:serving.cpu = 96: is not a known key: it moved to k3:serving.resources.cpu"),
    (dict(serving={"shmSizeGi": 10**7}), "k3:serving.shmSizeGi = 10000000: Input should be less than or equal to 8192"),
    (dict(coldStart={"tailFactor": float("nan")}), "k3:coldStart.tailFactor = nan: Input should be a finite number"),
    (dict(weights={"mode": "node-local"}, replicas=1000), "k3:replicas = 1000: must be at most 64 with k3:weights.mode = node-local"),
])
def test_numbers_have_physical_bounds(changes, needle):
    assert refusal(**changes) == needle or refusal(**changes).startswith(needle), refusal(**changes)


def test_a_weights_volume_smaller_than_the_tree_is_refused_by_the_preflight():
    from k3infra.preflight import PreflightError, run_preflight

    cfg = parse_stack_config({**BASE, "k3:weights": {"sizeGi": 100}}, receipt=R)
    with pytest.raises(PreflightError) as exc:
        run_preflight(cfg, R)
    assert str(exc.value).startswith(
        "k3:weights.sizeGi = 100: a weights volume of 100 Gi (107.4 GB) cannot hold 2 x "
        "1561.0 GB of weights")


@pytest.mark.parametrize("text,needle", [
    ("config: [unclosed\n", "line 2, column 1: not valid YAML: expected ',' or ']'"),
    ("config:\n\tk3:replicas: 1\n", "line 2, column 1: not valid YAML: found character '\\t' "
     "that cannot start any token (YAML indents with spaces, never tabs)"),
    (b"config:\n  k3:a: \xff\n", "line 2: byte 0xff is not UTF-8"),
    ("config:\n  - a\n", "`config:` is a list; it must be a mapping"),
    ("- a\n", "the top level is a list"),
    ("config:\n  k3:a: !!binary aGk=\n", "line 2, column 9: the tag !!binary is not accepted"),
    ("config:\n  k3:a: !!python/object/apply:os.system [id]\n",
     "the tag !!python/object/apply:os.system is not accepted"),
    ("config:\n  k3:a: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than 32 levels"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nconfig: {k3:x: [*c, *c, *c, *c, *c, *c]}\n",
     "line 2, column 8: YAML aliases (*a) are not accepted in a stack file"),
    ("config:\n  k3:replicas: 1\n  k3:replicas: 2\n",
     "line 3, column 3: duplicate key 'k3:replicas' (first at line 2)"),
    ("config:\n  k3:d: 2026-01-01\n", "the tag !!timestamp is not accepted"),
])
def test_a_malformed_stack_file_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, text, needle):
    import k3infra.render as render_module

    (tmp_path / "stacks").mkdir()
    path = tmp_path / "stacks" / "Pulumi.bad.yaml"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    monkeypatch.setattr(render_module, "project_root", lambda: tmp_path)
    with bounded():
        assert main(["render", "--stack", "bad", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"k3infra render: {path}: "), err
    assert needle in err and err.count("\n") == 1, err


def test_a_fifo_stack_file_is_refused_without_blocking(tmp_path):
    import os

    path = tmp_path / "Pulumi.x.yaml"
    os.mkfifo(path)
    with bounded(), pytest.raises(ConfigError, match="cannot read \\(a FIFO, not a regular file\\)"):
        read_stack_file(path)


@pytest.mark.parametrize("key,needle", [
    ("K3:replicas", "K3:replicas = 2: the namespace 'K3' is not 'k3': did you mean k3:replicas?"),
    ("k3s:apiKey", "k3s:apiKey = 2: the namespace 'k3s' is not 'k3': did you mean k3:apiKey?"),
    ("k3infra:namespace", "did you mean k3:namespace?"),
])
def test_a_key_under_a_misspelt_namespace_is_named(key, needle):
    with pytest.raises(ConfigError) as exc:
        parse_stack_config({**BASE, key: 2}, receipt=R)
    assert needle in str(exc.value)


def test_other_providers_keys_pass_through():
    parse_stack_config({**BASE, "aws:region": "us-east-1", "kubernetes:context": "x"}, receipt=R)


@pytest.mark.parametrize("assignment,needle", [
    ("replicas.x=1", "k3:replicas = {'x': '1'}: Input should be a valid integer"),
    ("serving.resources.cpu.x=1", "k3:serving.resources.cpu.x = '1': k3:serving.resources.cpu is 96, not an object"),
    ("a..b=1", "--config = 'a..b': KEY is [namespace:]name(.name)*"),
    ("=1", "--config = '': KEY is"),
    ("serving=[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]", "nests deeper than 16 levels"),
    ("serving=" + "[" * 100000, "is not valid JSON"),
])
def test_config_overrides_are_refused_in_one_line(assignment, needle):
    raw = dict(BASE)
    if assignment.startswith("serving.resources.cpu"):
        raw["k3:serving"] = {"resources": {"cpu": 96}}
    with bounded(), pytest.raises(ConfigError) as exc:
        apply_override(raw, assignment)
        parse_stack_config(raw, receipt=R)
    assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
