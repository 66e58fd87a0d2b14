"""Issue 48, kind 1: every file the CLI reads is hostile. The one bounded reader
(podcommon.read_regular, k3infra.fileformats), the one JSON parser (podcommon.parse_json)
and one typed model per format; then each command with each kind of bad file: a FIFO
(never waited on), /dev/zero and a 2 GB sparse file (never read), a directory, a link,
deep JSON, a 5000-digit integer, a string where a number belongs, a missing field,
a lone surrogate. Each is one line, exit 2, no traceback; a hang fails through the alarm."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench_results import receipt_latencies_ms, result_dict, write_result
from hostile import bounded, cli, one_line
from k3infra.fileformats import FileFormatError, read_bytes
from k3infra.podcommon import JsonRefused, parse_json, read_regular

CHECKS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.function_scoped_fixture])
REV = "0123456789abcdef0123456789abcdef01234567"
SHA = "a" * 64


def refusal_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("k3infra")]
    assert len(lines) == 1, text
    return lines[0]


# ---- special files ------------------------------------------------------------------------

def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def sparse(path: Path, size: int = 2 << 30) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.json"
    if kind == "fifo":
        return fifo(path)
    if kind == "dev-zero":
        return Path("/dev/zero")
    if kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
        return path
    if kind == "sparse-2g":
        return sparse(path)
    if kind == "directory":
        path.mkdir()
        return path
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        return path
    raise AssertionError(kind)


SPECIALS = ["fifo", "dev-zero", "link-to-dev-zero", "sparse-2g", "directory", "socket"]
SPECIAL_WORDS = {"fifo": "FIFO", "dev-zero": "character device", "link-to-dev-zero": "character device",
                 "sparse-2g": "more than the", "directory": "directory", "socket": "special file"}


@pytest.mark.parametrize("kind", SPECIALS)
def test_the_bounded_reader_refuses_without_waiting_or_reading(tmp_path, kind):
    path = special(tmp_path, kind)
    with bounded(10), pytest.raises(FileFormatError) as err:
        read_bytes(path, "benchmark result")
    assert SPECIAL_WORDS[kind] in str(err.value) and str(path) in str(err.value)


def test_links_are_followed_only_where_a_user_names_the_path(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert read_bytes(link, "pod JSON") == b"{}"
    with pytest.raises(FileFormatError, match="a symbolic link, not a regular file"):
        read_bytes(link, "pod JSON", follow_links=False)
    with pytest.raises(OSError, match="a symbolic link"):
        read_regular(str(link), 10)


# ---- the one JSON parser --------------------------------------------------------------------

@pytest.mark.parametrize("raw, needle", [
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
    ('{"a":' * 100_000, "nested deeper than 64 levels"),
    ("1" * 5000, "an integer of 5000 digits"),
    ("-" + "9" * 41, "an integer of 41 digits"),
    ("1e999", "out of range"),
    ("0." + "1" * 200, "written with 202 characters"),
    ('{"a": Infinity}', "Infinity is not a JSON number"),
    ('{"a": 1, "a": 2}', "the key 'a' appears twice"),
    ('{"a": 1} {"b": 2}', "more than one JSON document"),
    (b"\x80", "not UTF-8 (byte 0x80 at line 1)"),
    ("", "not JSON"),
])
def test_json_from_a_file_or_a_server_is_bounded(raw, needle):
    with pytest.raises(JsonRefused) as err:
        parse_json(raw)
    one_line(str(err.value))
    assert needle in str(err.value)


def test_a_lone_surrogate_parses_and_prints_escaped():
    assert parse_json('"\\ud800"') == "\ud800"


@settings(max_examples=400, **CHECKS)
@given(raw=st.one_of(st.binary(max_size=300), st.text(max_size=300),
                     st.recursive(st.sampled_from(["1", "-0", "1e5", "null", '"x"', "true",
                                                   "9" * 50, "NaN", '"\\ud800"']),
                                  lambda inner: st.one_of(
                                      st.lists(inner, max_size=4).map(lambda v: "[" + ",".join(v) + "]"),
                                      st.lists(inner, max_size=3).map(
                                          lambda v: "{" + ",".join(f'"k{i % 2}":{x}' for i, x in enumerate(v)) + "}")),
                                  max_leaves=30)))
def test_any_input_is_json_or_one_refusal(raw):
    try:
        parse_json(raw)
    except JsonRefused as exc:
        one_line(str(exc))


# ---- every format: hypothesis over hostile JSON, one line or a value ------------------------

JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                              st.floats(allow_nan=False, allow_infinity=False),
                              st.text(max_size=20), st.just("\ud800"), st.just("[red]x[/red]")),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                    max_leaves=25)


def _mutations(base: dict, keys: list[str]):
    """A valid document with one key replaced by a hostile value or removed."""
    return st.tuples(st.sampled_from(keys), st.one_of(JSON, st.just(...))).map(
        lambda kv: {k: v for k, v in {**base, kv[0]: kv[1]}.items() if v is not ...})


def _result() -> dict:
    return result_dict(receipt_latencies_ms(18695.0, 18766.0))


@settings(max_examples=300, **CHECKS)
@given(data=st.one_of(JSON, _mutations(_result(), list(_result()))))
def test_a_benchmark_result_parses_or_is_one_line(data):
    from k3infra.bench.results import ResultError, parse_result

    try:
        parse_result(data, "r.json")
    except ResultError as exc:
        assert str(exc).startswith("r.json: ")
        one_line(str(exc))


def _lock_doc() -> dict:
    from k3infra.weights import tree

    lock = tree.make_lock("o/m", REV, [tree.FileEntry("a", 1, SHA), tree.FileEntry("b/c", 2, SHA)])
    return json.loads(tree.lock_to_json(lock))


@settings(max_examples=300, **CHECKS)
@given(data=st.one_of(JSON, _mutations(_lock_doc(), list(_lock_doc())),
                      st.builds(lambda row: {**_lock_doc(), "files": [row]},
                                st.one_of(JSON, st.fixed_dictionaries(
                                    {"path": JSON, "size": JSON, "sha256": JSON})))))
def test_a_weights_lock_parses_or_is_one_line(data):
    from k3infra.weights import tree

    try:
        tree.parse_lock(data)
    except tree.LockError as exc:
        one_line(str(exc))


@pytest.mark.parametrize("path, needle", [
    ("a\ud800", "not valid UTF-8"), ({"a": 1}, "must be a non-empty string"), (5, "non-empty string"),
    ("x" * 5000, "longer than 4096")])
def test_the_kits_malformed_locks_are_one_line_not_a_sort_key_traceback(tmp_path, capsys, path, needle):
    doc = _lock_doc()
    doc["files"] = [{"path": "b", "size": 1, "sha256": SHA}, {"path": path, "size": 1, "sha256": SHA}]
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps(doc))
    rc, text = cli(capsys, "weights", "verify", str(tmp_path), "--lock", str(lock))
    assert rc == 2 and needle in refusal_line(text)


@settings(max_examples=200, **CHECKS)
@given(text=st.one_of(st.text(max_size=80), JSON.map(json.dumps)))
def test_a_startup_budget_parses_or_is_one_line(text):
    from k3infra.serving.timeline import budgets_of

    try:
        budgets = budgets_of(text, "--budget")
        assert all(isinstance(v, int) and 0 <= v <= 7 * 86400 for v in budgets.values())
    except FileFormatError as exc:
        one_line(str(exc))


POD = {"metadata": {"name": "p", "annotations": {"k3infra.dev/startup-budget": '{"load": 10}'}},
       "status": {"containerStatuses": [{"name": "vllm", "restartCount": 0,
                                         "state": {"running": {"startedAt": "2026-12-01T10:00:00Z"}}}],
                  "conditions": [{"type": "PodScheduled", "lastTransitionTime": "2026-12-01T09:59:00Z"}]}}
LOG_LINES = st.sampled_from([
    "k3-phase name=gate event=start ts=2026-12-01T10:00:00.000Z",
    "k3-phase name=gate event=start ts=garbage", "k3-phase name=x event=end ts=9999-99-99T99:99:99Z",
    "INFO 13-45 99:99:99 [x.py:1] Loading weights took 1.2.3 s",
    "INFO 12-01 10:10:00 [x.py:1] Loading weights took 99999999999999999999 s",
    "2026-12-01T10:05:00Z INFO 12-01 10:05:00 [x.py:1] Starting to load model",
    "\udc80 [red]x[/red]", ""])


@settings(max_examples=200, **CHECKS)
@given(pod=st.one_of(JSON, _mutations(POD, list(POD)), st.just(POD)),
       log=st.lists(LOG_LINES, max_size=6).map("\n".join))
def test_a_pod_and_its_log_give_a_timeline_or_one_line(pod, log):
    from k3infra.serving.timeline import timeline

    try:
        t = timeline(pod, log)
        t.rows()
    except FileFormatError as exc:
        one_line(str(exc))


@settings(max_examples=200, **CHECKS)
@given(text=st.one_of(st.text(max_size=200), st.sampled_from([
    '[[registry]]\nlocation = "host[:port][/path]"', "registry = 5", "[[registry]]\nmirror = 5",
    '[[registry]]\nlocation = "a.io"\n[[registry.mirror]]\nlocation = "u:p@m.io"',
    "a = " + "[" * 3000 + "]" * 3000, '[[registry]]\nprefix = "*.x.io"'])))
def test_a_registries_conf_is_used_or_one_line(tmp_path_factory, text):
    from k3infra.pins.mirrors import MirrorConfigError, load

    path = tmp_path_factory.mktemp("conf") / "registries.conf"
    path.write_text(text, errors="surrogatepass")
    try:
        load(path)
    except MirrorConfigError as exc:
        one_line(str(exc))


@settings(max_examples=150, **CHECKS)
@given(data=st.one_of(JSON, st.builds(lambda c: {"spec": {"template": {"spec": {"containers": [c]}}}},
                                      st.one_of(JSON, st.fixed_dictionaries(
                                          {"name": st.just("vllm"), "args": JSON, "env": JSON,
                                           "command": st.sampled_from([["sh", "-c", "vllm serve 'x"],
                                                                       ["vllm", "serve", "m"]])})))))
def test_a_statefulset_json_gives_flags_or_one_line(data):
    from k3infra.bench.receipt_writer import ReceiptInputs, ReceiptWriteError

    try:
        ReceiptInputs(id="x").with_statefulset(data)
    except ReceiptWriteError as exc:
        one_line(str(exc))


@settings(max_examples=200, **CHECKS)
@given(text=st.text(max_size=300))
def test_a_checksum_list_parses_or_is_one_line(text):
    from k3infra.fileformats import parse_sha256sums

    try:
        for name in parse_sha256sums(text, "SHA256SUMS"):
            assert not name.startswith("/") and ".." not in name.split("/")
    except FileFormatError as exc:
        one_line(str(exc))


@settings(max_examples=100, **CHECKS)
@given(doc=st.one_of(JSON, st.fixed_dictionaries({"resources": JSON, "config": JSON, "stack": JSON})))
def test_a_plan_is_typed_or_one_line(tmp_path_factory, doc):
    from k3infra.policies.runner import load_plan

    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(json.dumps(doc))
    try:
        load_plan(path)
    except ValueError as exc:
        one_line(str(exc))


RECEIPT_YAML = st.one_of(st.text(max_size=200), st.sampled_from([
    "a: &x [1]\nb: *x", "id: !!python/object:os.system x", "x: " + "[" * 100 + "]" * 100,
    "n: " + "1" * 5000, "measured_on: 2026-07-29", "a: 1\na: 2", "\t- x"]))


@settings(max_examples=150, **CHECKS)
@given(text=RECEIPT_YAML)
def test_a_receipt_loads_or_is_one_line(tmp_path_factory, text):
    from k3infra.receipt import ReceiptError, load_receipt

    path = tmp_path_factory.mktemp("receipt") / "r.yaml"
    path.write_text(text, errors="surrogatepass")
    try:
        load_receipt(str(path))
    except ReceiptError as exc:
        one_line(str(exc))


# ---- the commands, one kind of bad file at a time -------------------------------------------

def _content(kind: str) -> str:
    return {"deep": "[" * 100_000, "digits": "1" * 5000,
            "not-json": "{", "top-list": "[1, 2]"}[kind]


def bad_file(tmp_path: Path, kind: str) -> Path:
    if kind in SPECIALS:
        return special(tmp_path, kind)
    path = tmp_path / f"{kind}.json"
    path.write_text(_content(kind))
    return path


FILE_KINDS = [*SPECIALS, "deep", "digits", "not-json"]


@pytest.mark.parametrize("kind", FILE_KINDS)
@pytest.mark.parametrize("command", [
    ("bench", "compare", "{f}"), ("bench", "cost", "--node-rate", "80", "{f}"),
    ("bench", "receipt", "{f}", "--id", "x", "--out", "{out}"),
    ("policy", "check", "{f}"), ("weights", "verify", "{tmp}", "--lock", "{f}"),
    ("weights", "prefetch", "--lock", "{f}", "--dest", "{tmp}/dest"),
    ("receipt", "show", "--file", "{f}"),
    ("startup", "--log", "{log}", "--pod-json", "{f}"),
    ("startup", "--log", "{log}", "--budget", "@{f}"),
])
def test_each_command_refuses_each_bad_file_in_one_line(tmp_path, capsys, kind, command):
    f = bad_file(tmp_path, kind)
    log = tmp_path / "vllm.log"
    log.write_text("k3-phase name=gate event=start ts=2026-12-01T10:00:00.000Z\n")
    argv = [a.format(f=f, out=tmp_path / "out.yaml", tmp=tmp_path, log=log) for a in command]
    rc, text = cli(capsys, *argv)
    assert rc == 2, text
    assert str(f) in text or "(from K3INFRA_RECEIPT)" in text, text


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "sparse-2g", "directory"])
def test_startup_log_of_any_special_file_is_one_line(tmp_path, capsys, kind):
    """The kit's case: a FIFO as `startup --log` hung."""
    rc, text = cli(capsys, "startup", "--log", str(special(tmp_path, kind)))
    assert rc == 2 and SPECIAL_WORDS[kind] in text


@pytest.mark.parametrize("change, needle", [
    (lambda d: d.update(completed="abc"), "completed: Input should be a valid integer (got 'abc')"),
    (lambda d: d.pop("duration"), "missing key 'duration'"),
    (lambda d: d.update(num_prompts=True), "num_prompts: Input should be a valid integer"),
    (lambda d: d.update(ttfts=[1.0, "x", 2.0]), "ttfts[1]"),
    (lambda d: d.update(p50_e2el_ms={"a": 1}), "p50_e2el_ms"),
    (lambda d: d.update(max_concurrency=-3), "max_concurrency: Input should be greater"),
])
def test_a_mistyped_result_is_one_line_naming_the_field(tmp_path, capsys, change, needle):
    data = _result()
    change(data)
    path = write_result(tmp_path / "r.json", data)
    rc, text = cli(capsys, "bench", "compare", str(path))
    assert rc == 2 and needle in refusal_line(text)


def _accuracy_run(tmp_path: Path, scores: dict, sums_extra: str = "") -> Path:
    from k3infra.accuracy import runner

    d = tmp_path / "run-1"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"engine_image": "img"}))
    (d / "scores.json").write_text(json.dumps({"run_id": "run-1", "harness": "lm-eval",
                                               "task_config": {}, "scores": scores}))
    (d / "index.json").write_text(json.dumps({"status": "complete", "problems": []}))
    runner.write_sums(d)
    if sums_extra:
        with open(d / "SHA256SUMS", "a") as fh:
            fh.write(sums_extra)
    return d


@pytest.mark.parametrize("scores, extra, needle", [
    ({"t": {"metric": "m", "score": "abc", "samples": 5}}, "", "scores.t.score: Input should be a valid number"),
    ({"t": {"metric": "m", "score": 0.5, "samples": int("9" * 39)}}, "", "scores.t.samples"),
    ({"t": {"metric": "m", "score": 1.5, "samples": 5}}, "", "less than or equal to 1"),
    ({"t": {"metric": "m", "score": 0.5}}, "", "missing key 'scores.t.samples'"),
    ({}, "", "scores: Dictionary should have at least 1 item"),
    ({"t": {"metric": "m", "score": 0.5, "samples": 5}}, f"{SHA}  /dev/zero\n",
     "'/dev/zero' is not a relative path inside the run directory"),
    ({"t": {"metric": "m", "score": 0.5, "samples": 5}}, f"{SHA}  ../../etc/passwd\n",
     "is not a relative path inside the run directory"),
    ({"t": {"metric": "m", "score": 0.5, "samples": 5}}, "garbage\n", "expected '<sha256>  <file>'"),
])
def test_accuracy_compare_refuses_a_hostile_run_in_one_line(tmp_path, capsys, scores, extra, needle):
    run = _accuracy_run(tmp_path, scores, extra)
    rc, text = cli(capsys, "accuracy", "compare", str(run))
    assert rc == 2 and needle in refusal_line(text), text


def test_accuracy_compare_refuses_a_listed_fifo_without_waiting(tmp_path, capsys):
    run = _accuracy_run(tmp_path, {"t": {"metric": "m", "score": 0.5, "samples": 5}})
    fifo(run / "pipe")
    with open(run / "SHA256SUMS", "a") as fh:
        fh.write(f"{SHA}  pipe\n")
    rc, text = cli(capsys, "accuracy", "compare", str(run))
    assert rc == 2 and "pipe is listed in SHA256SUMS but cannot be read (a FIFO" in text


@pytest.mark.parametrize("budget, needle", [
    ('{"load": "x"}', "load: Input should be a valid integer (got 'x')"),
    ('{"load": 1e400}', "out of range"),
    ('{"load": ' + "1" * 5000 + "}", "an integer of 5000 digits"),
    ("[" * 100_000, "nested deeper than 64 levels"),
    ('{"load": -1}', "greater than or equal to 0"),
    ('{"load": true}', "valid integer"),
])
def test_startup_budget_is_typed(tmp_path, capsys, budget, needle):
    log = tmp_path / "vllm.log"
    log.write_text("k3-phase name=gate event=start ts=2026-12-01T10:00:00.000Z\n")
    rc, text = cli(capsys, "startup", "--log", str(log), "--budget", budget)
    assert rc == 2 and needle in text, text


@pytest.mark.parametrize("pod, needle", [
    ({"metadata": {"annotations": {"k3infra.dev/startup-budget": '{"load": "x"}'}}}, "load: Input"),
    ({"status": {"containerStatuses": [{"name": "vllm", "state": {"running": {"startedAt": "yesterday"}}}]}},
     "startedAt 'yesterday' is not an RFC 3339 time"),
    ({"status": {"containerStatuses": 5}}, "status.containerStatuses: Input should be a valid list"),
    ({"metadata": {"name": ["x"]}}, "metadata.name"),
])
def test_startup_pod_json_is_typed(tmp_path, capsys, pod, needle):
    log = tmp_path / "vllm.log"
    log.write_text("x\n")
    pod_json = tmp_path / "pod.json"
    pod_json.write_text(json.dumps(pod))
    rc, text = cli(capsys, "startup", "--log", str(log), "--pod-json", str(pod_json))
    assert rc == 2 and needle in text, text


def test_a_hostile_log_is_read_not_obeyed(tmp_path, capsys):
    """Bad stamps, markup and undecodable bytes in a log: a timeline, never a traceback."""
    log = tmp_path / "vllm.log"
    log.write_bytes(b"k3-phase name=gate event=start ts=garbage\n"
                    b"INFO 13-45 99:99:99 [x.py:1] Loading weights took 1.2.3 s\n"
                    b"\xff\xfe [red]markup[/red] Loading weights took 1e999 s\n")
    rc, text = cli(capsys, "startup", "--log", str(log))
    assert rc == 0 and "cold start of vllm.log" in text


@pytest.mark.parametrize("receipt, needle", [
    ("a: &x [1]\nb: *x\n", "YAML aliases"), ("id: !!python/object/apply:os.system [x]\n", "tag"),
    ("x: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than 32"), ("- 1\n", "not a mapping"),
])
def test_a_hostile_receipt_is_one_line_for_every_command(tmp_path, capsys, monkeypatch, receipt, needle):
    path = tmp_path / "r.yaml"
    path.write_text(receipt)
    monkeypatch.setenv("K3INFRA_RECEIPT", str(path))
    for argv in (["receipt", "show"], ["render", "--out", str(tmp_path / "r")],
                 ["bench", "compare", str(write_result(tmp_path / "x.json", _result()))]):
        rc, text = cli(capsys, *argv)
        assert rc == 2 and needle in refusal_line(text), (argv, text)


@pytest.mark.parametrize("plan, needle", [
    ({"resources": 5}, "resources: Input should be a valid list (got 5)"),
    ({"resources": [{"type": "x"}]}, "missing key 'resources[0].name'"),
    ({"resources": [{"type": 1, "name": "n", "urn": "u"}]}, "resources[0].type"),
])
def test_policy_check_types_the_plan(tmp_path, capsys, plan, needle):
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    rc, text = cli(capsys, "policy", "check", str(tmp_path))
    assert rc == 2 and needle in refusal_line(text)


def test_policy_config_is_typed(tmp_path, capsys):
    from conftest import render
    from k3infra.render import write_render

    write_render(render("existing"), tmp_path)
    cfg = tmp_path / "pack.json"
    cfg.write_text(json.dumps({"all": 5}))
    rc, text = cli(capsys, "policy", "check", str(tmp_path), "--policy-config", str(cfg))
    assert rc == 2 and "--policy-config" in refusal_line(text) and "all" in text


def test_bench_receipt_statefulset_and_lock_are_typed(tmp_path, capsys):
    result = write_result(tmp_path / "r.json", _result())
    sts = tmp_path / "sts.json"
    sts.write_text(json.dumps({"spec": 5}))
    rc, text = cli(capsys, "bench", "receipt", str(result), "--id", "x", "--out",
                   str(tmp_path / "o.yaml"), "--statefulset", str(sts))
    assert rc == 2 and "spec: Input should be a valid dictionary" in refusal_line(text)
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({**_lock_doc(), "files": [{"path": {"a": 1}, "size": 1, "sha256": SHA}]}))
    rc, text = cli(capsys, "bench", "receipt", str(result), "--id", "x", "--out",
                   str(tmp_path / "o.yaml"), "--lock", str(lock))
    assert rc == 2 and "must be a non-empty string" in refusal_line(text)
    assert not (tmp_path / "o.yaml").exists()


def test_a_fetched_run_is_bounded_and_never_written_through_a_link(tmp_path):
    import base64
    import io
    import tarfile

    from k3infra.bench.fetch import FetchError, unpack_run

    def archive(members: dict[str, bytes]) -> str:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return base64.b64encode(buf.getvalue()).decode()

    out = tmp_path / "out"
    out.mkdir()
    (out / "run").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(FetchError, match="exists and is not a directory"):
        unpack_run(archive({"run/index.json": b"{}"}), out)
    assert not (tmp_path / "elsewhere" / "index.json").exists()
    with pytest.raises(FetchError, match="refusing archive member"):
        unpack_run(archive({"run/a\nb": b""}), tmp_path / "o2")


def test_the_in_pod_reader_script_is_the_bounded_readers_rule(tmp_path):
    """verify reads markers and locks inside the serving container with READ_SCRIPT."""
    import subprocess
    import sys

    from k3infra.live.cluster import READ_SCRIPT

    def run(path, limit=100):
        return subprocess.run([sys.executable, "-c", READ_SCRIPT, str(path), str(limit)],
                              capture_output=True, text=True, timeout=20)

    ok = tmp_path / "m.json"
    ok.write_text("{}")
    assert run(ok).stdout == "{}" and run(ok).returncode == 0
    assert run(tmp_path / "absent").returncode == 3
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    for path in (fifo(tmp_path / "p"), link, Path("/dev/zero")):
        assert run(path).returncode == 4
    big = tmp_path / "big"
    big.write_text("x" * 200)
    assert run(big).returncode == 4
