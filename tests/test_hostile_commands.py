"""Issue 48, kinds 4-8: a flag bounded like the stack key it mirrors; credentials never in
a URL of any key; addresses parsed, every spelling of the wildcard needing the opt-in;
text from files, servers and users printed without markup; a refused engine recipe one
line before anything is created; NetworkPolicies judged by the exposure they leave."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from bench_results import receipt_latencies_ms, result_dict, write_result
from conftest import GOOD_REVISION
from hostile import bounded, cli, one_line
from k3infra.config import ConfigError, parse_stack_config
from k3infra.receipt import load_receipt

R = load_receipt()
BASE = {"k3:weightsRevision": GOOD_REVISION, "k3:apiKey": "sk-test"}
HOST = {**BASE, "k3:engineImage": "registry.example.com/k3/vllm@sha256:" + "ab" * 32}


# ---- 4. a flag is bounded like its stack key --------------------------------------------------

def _result(tmp_path: Path, scale: float = 1.0) -> str:
    lat = [v * scale for v in receipt_latencies_ms(18695.0, 18766.0)]
    return str(write_result(tmp_path / f"r{scale}.json", result_dict(lat)))


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "101", "1e308", "abc", "true"])
def test_tolerance_is_bounded_like_its_key(tmp_path, capsys, value):
    """The kit's case: --tolerance-pct inf passed a run ten times slower than the receipt."""
    slow = _result(tmp_path, 10.0)
    for argv in (["bench", "compare", slow], ["verify", "--no-results", "--docker-host", "unix:///x"]):
        rc, text = cli(capsys, *argv, "--tolerance-pct", value)
        assert rc == 2 and "k3:benchmark.tolerancePct" in text, text
    rc, text = cli(capsys, "bench", "compare", slow, "--tolerance-pct", "100")
    assert rc == 1 and "FAIL" in text


@pytest.mark.parametrize("argv, key", [
    (["bench", "cost", "--node-rate", "inf", "{r}"], "k3:monitoring.nodeRateUsdPerHour"),
    (["bench", "cost", "--node-rate", "80", "--nodes", "100000", "{r}"], "k3:replicas"),
    (["bench", "prompts", "--tokenizer", "t", "--out", "{d}", "--run-id", "x", "--seed", "-1"],
     "k3:benchmark.seed"),
    (["bench", "prompts", "--tokenizer", "t", "--out", "{d}", "--run-id", "x", "--runs", "1e9"],
     "k3:benchmark.runs"),
    (["bench", "prompts", "--tokenizer", "t", "--out", "{d}", "--run-id", "x", "--concurrencies",
      "8,0"], "k3:benchmark.concurrencies"),
    (["accuracy", "run", "--endpoint", "http://e", "--out", "{d}", "--limit", "0"], "k3:accuracy.limit"),
    (["accuracy", "run", "--endpoint", "http://e", "--out", "{d}", "--concurrency", "100000"],
     "k3:accuracy.concurrency"),
    (["accuracy", "run", "--endpoint", "http://e", "--out", "{d}", "--max-tokens", "inf"],
     "k3:accuracy.maxTokens"),
    (["weights", "mirror", "--to", "s3://k3-weights/m", "--region", "US East"],
     "k3:weights.store.region"),
    (["weights", "mirror", "--to", "s3://k3-weights/m", "--region", "x" * 64],
     "k3:weights.store.region"),
])
def test_flags_mirroring_keys_take_the_keys_bounds(tmp_path, capsys, argv, key):
    rc, text = cli(capsys, *[a.format(r=_result(tmp_path), d=tmp_path / "d") for a in argv])
    assert rc == 2 and key in text, text


def test_a_flag_mirroring_a_text_key_takes_the_text_as_typed():
    """A section's cross-key rules (a store's one identity) judge keys the flag does not
    set; a region of digits stays the text the key would hold."""
    from k3infra.cli import flags

    region = flags.mirrors("StoreConfig", "region", "k3:weights.store.region")
    assert region("us-east-2") == "us-east-2" and region("1") == "1"


@pytest.mark.parametrize("value", ["0", "-1", "4.5", "inf", "1e9", "257"])
def test_mirror_workers_are_bounded_like_hash_workers(capsys, value):
    """`weights mirror --workers` mirrors no key: bounded like k3:weights.hashWorkers."""
    rc, text = cli(capsys, "weights", "mirror", "--to", "s3://k3-weights/m", "--workers", value)
    assert rc == 2 and f"argument --workers: '{value}': must be an integer from 1 to 256" in text, text


@pytest.mark.parametrize("argv", [
    ["weights", "verify", ".", "--lock", "x", "--workers", "1000000000"],
    ["weights", "prefetch", "--lock", "x", "--dest", "d", "--attempts", "0"],
    ["weights", "lock", "--hub", "o/m", "--revision", "0" * 40, "--out", "x", "--timeout", "inf"],
    ["startup", "--log", "x", "--restarts", "-1"],
    ["pins", "--timeout", "nan"],
    ["accuracy", "run", "--endpoint", "http://user:pw@e", "--out", "d"],
    ["accuracy", "run", "--endpoint", "file:///etc/passwd", "--out", "d"],
])
def test_other_numbers_and_urls_of_the_cli_are_bounded(capsys, argv):
    rc, text = cli(capsys, *argv)
    assert rc == 2, text


# ---- 5. credentials never inside a URL ---------------------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("k3:weights", {"hubEndpoint": "http://user:pass@hub.lan:8080"}),
    ("k3:weights", {"hubEndpoint": "https://hf_token123@hub.lan"}),
    ("k3:autoscaling", {"enabled": True, "min": 2, "max": 4,
                        "prometheusUrl": "http://admin:admin@prometheus:9090"}),
    ("k3:engine", {"build": "in-cluster", "context": "git",
                   "gitUrl": "https://ghp_secret@github.com/me/vllm.git"}),
    ("k3:custom", {"args": [["--hf-endpoint", "https://u:p@hub.lan"]]}),
])
def test_a_url_with_credentials_is_refused_with_the_key_and_the_way(key, value):
    with pytest.raises(ConfigError) as err:
        parse_stack_config({**BASE, key: value}, receipt=R)
    text = str(err.value)
    one_line(text)
    assert text.startswith(key) and "a secret" in text and "k3:hfToken" in text
    assert "://***@" in text                       # shown masked, never as typed
    for secret in ("user:pass@", "hf_token123", "admin:admin@", "ghp_secret", "u:p@"):
        assert secret not in text


def test_render_refuses_the_kits_hub_endpoint_before_anything_is_written(tmp_path, capsys):
    rc, text = cli(capsys, "render", "--config", f"weightsRevision={GOOD_REVISION}", "--config",
                   "k3:weights.hubEndpoint=http://user:pass@hub.lan", "--out", str(tmp_path / "o"))
    assert rc == 2 and "k3:weights" in text and "pass@" not in text
    assert not (tmp_path / "o").exists()


def test_an_ssh_user_is_not_a_credential():
    cfg = parse_stack_config({**BASE, "k3:profile": "custom", "k3:engine": {
        "build": "in-cluster", "context": "git", "gitUrl": "ssh://git@github.com/me/vllm.git",
        "gitRevision": "1" * 40}}, receipt=R)
    assert cfg.engine.git_url.startswith("ssh://git@")


@pytest.mark.parametrize("flag, url", [
    ("--to", "s3://AKIA:secret@k3-weights/m"),
    ("--to", "gs://key:secret@k3-weights/m"),
    ("--endpoint", "https://AKIA:secret@minio.lan:9000"),
    ("--endpoint", "https://secret@minio.lan"),
])
def test_weights_mirror_refuses_a_store_url_with_credentials_masked(capsys, flag, url):
    """The stack keys' rule (podcommon.url_credentials) for the flags that mirror them:
    the flag named, the credentials masked, the environment named as their way in."""
    to = [] if flag == "--to" else ["--to", "s3://k3-weights/m"]
    rc, text = cli(capsys, "weights", "mirror", *to, flag, url, "--revision", GOOD_REVISION)
    assert rc == 2 and f"argument {flag}: '" in text and "://***@" in text, text
    assert "secret" not in text and "AWS_ACCESS_KEY_ID" in text


@pytest.mark.parametrize("command, sources", [
    ("lock", "s3://AKIA:secret@k3-weights/m"),
    ("lock", "hub,az://acct:secret@k3acct/weights"),
    ("lock", "http://user:secret@kimi-k3-weights-source-0:8080"),
    ("prefetch", "gs://key:secret@k3-weights/m"),
])
def test_weights_sources_refuse_a_url_with_credentials_masked(tmp_path, capsys, command, sources):
    """`weights lock|prefetch --sources`: one line naming the flag, masked, before any read."""
    argv = (["lock", "--hub", "o/m", "--revision", GOOD_REVISION, "--out", str(tmp_path / "l.json")]
            if command == "lock" else ["prefetch", "--lock", str(tmp_path / "missing.json"),
                                       "--dest", str(tmp_path / "d")])
    rc, text = cli(capsys, "weights", *argv, "--sources", sources)
    one_line(text)
    assert rc == 2 and "--sources: sources '" in text and "://***@" in text, text
    assert "secret" not in text and "AWS_ACCESS_KEY_ID" in text
    assert not (tmp_path / "d").exists() and not (tmp_path / "l.json").exists()

# ---- 6. addresses parsed -----------------------------------------------------------------------

@pytest.mark.parametrize("address", ["0.0.0.0", "::", "::ffff:0.0.0.0", "0:0:0:0:0:ffff:0:0",
                                     "::0.0.0.0", "0::0", "0:0:0:0:0:0:0:0", "::%eth0"])
def test_every_spelling_of_the_wildcard_needs_the_opt_in(address):
    host = {"k3:host": {"publishAddress": address}}
    with pytest.raises(ConfigError, match="publishAllInterfaces"):
        parse_stack_config({**HOST, **host}, receipt=R)
    chosen = {"k3:host": {"publishAddress": address, "publishAllInterfaces": True}}
    assert parse_stack_config({**HOST, **chosen}, receipt=R).host.publish_all_interfaces


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "::ffff:127.0.0.1", "10.0.0.5"])
def test_a_single_address_needs_no_opt_in(address):
    assert parse_stack_config({**HOST, "k3:host": {"publishAddress": address}},
                              receipt=R).host.publish_address == address


def test_the_host_policy_parses_the_address_too():
    from k3infra.policies.host import host_port_binding
    from k3infra.policies.runner import check_plan
    from conftest import render

    plan = render("host").plan()
    for r in plan["resources"]:
        for port in (r.get("inputs") or {}).get("ports", []) or []:
            if isinstance(port, dict) and "ip" in port:
                port["ip"] = "::ffff:0.0.0.0"
    found = check_plan(plan).by_policy(host_port_binding.name)
    assert found and "::ffff:0.0.0.0" in found[0].message


# ---- 7. text printed as it is ------------------------------------------------------------------

def test_the_console_prints_markup_literally():
    from k3infra.display import console, styled

    buf = io.StringIO()
    c = console(file=buf, width=200, color_system=None)
    c.print("host[:port][/path] [red]x[/red] [/] :smile:")
    c.print(styled(("PASS", "green"), ": [bold]value[/bold]"))
    assert buf.getvalue() == "host[:port][/path] [red]x[/red] [/] :smile:\nPASS: [bold]value[/bold]\n"


def test_pins_prints_a_bad_mirror_location_literally(tmp_path, capsys, monkeypatch):
    """The kit's case: a refusal naming host[:port][/path] crashed rich while printing."""
    conf = tmp_path / "registries.conf"
    conf.write_text('[[registry]]\nlocation = "[red]oops[/red]"\n')
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("COLUMNS", "400")
    rc, text = cli(capsys, "pins", "--timeout", "5")
    assert rc in (0, 1)
    assert "expected host[:port][/path]" in text and "'[red]oops[/red]'" in text


def test_markup_in_a_stack_value_is_printed_as_it_is(tmp_path, capsys):
    rc, text = cli(capsys, "render", "--config", f"weightsRevision={GOOD_REVISION}",
                   "--config", "k3:namespace=[red]x", "--out", str(tmp_path / "o"))
    assert rc == 2 and "'[red]x'" in text


# ---- 8a. a refused engine recipe: one line, nothing created -------------------------------------

def _recipe(tmp_path: Path, kind: str) -> Path:
    d = tmp_path / "recipe"
    d.mkdir()
    if kind == "no-dockerfile":
        return d
    if kind == "fifo":
        os.mkfifo(d / "Dockerfile")
    elif kind == "link":
        (d / "Dockerfile").symlink_to("/etc/passwd")
    elif kind == "over-size":
        (d / "Dockerfile").write_text("FROM scratch\n" + "#" * (900 * 1024))
    elif kind == "not-utf8":
        (d / "Dockerfile").write_bytes(b"FROM \xff\n")
    elif kind == "a-file":
        d.rmdir()
        d.write_text("x")
    return d


RECIPE_CASES = [("no-dockerfile", "no engine recipe (Dockerfile)"), ("fifo", "a FIFO"),
                ("link", "a symbolic link"), ("over-size", "fit the context ConfigMap"),
                ("not-utf8", "not UTF-8"), ("a-file", "is not a directory")]


@pytest.mark.parametrize("kind, needle", RECIPE_CASES)
def test_a_bad_recipe_is_one_line_from_render(tmp_path, capsys, kind, needle):
    recipe = _recipe(tmp_path, kind)
    rc, text = cli(capsys, "render", "--config", f"weightsRevision={GOOD_REVISION}",
                   "--config", "k3:profile=custom", "--config", "k3:engine.build=local",
                   "--config", f"k3:engine.recipeDir={recipe}", "--out", str(tmp_path / "o"))
    assert rc == 2 and text.startswith("k3infra render: k3:engine.recipeDir = ") and needle in text
    assert len(text.strip().splitlines()) == 1


@pytest.mark.parametrize("kind, needle", RECIPE_CASES[:3])
def test_a_bad_recipe_refuses_the_program_before_anything_is_registered(tmp_path, kind, needle):
    from program_harness import record

    from k3infra.engine.component import RecipeError
    from k3infra.stack import K3ServingStack

    recipe = _recipe(tmp_path, kind)
    cfg = parse_stack_config({**BASE, "k3:profile": "custom",
                              "k3:engine": {"build": "local", "recipeDir": str(recipe),
                                            "registry": "registry.example.com/k3/vllm"}},
                             receipt=R)
    caught = []

    def program():
        try:
            K3ServingStack("kimi-k3", {"config": cfg, "receipt": R})
        except RecipeError as exc:        # a ConfigError: the program prints it in one line
            caught.append(exc)

    recording = record(program)
    assert caught and needle in str(caught[0]) and recording.resources == []


# ---- 8b. NetworkPolicies: the semantics of covering --------------------------------------------

def _peer(raw, ns="kimi-k3"):
    from k3infra.policies.exposure import _peer as parse

    return parse(raw, ns)


@pytest.mark.parametrize("narrow, wide, inside", [
    ({"ipBlock": {"cidr": "10.1.0.0/16"}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}, True),
    ({"ipBlock": {"cidr": "10.0.0.0/8"}}, {"ipBlock": {"cidr": "10.1.0.0/16"}}, False),
    ({"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}},
     {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "169.254.0.0/16"]}}, False),
    ({"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "169.254.0.0/16"]}},
     {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "169.254.0.0/16"]}}, True),
    ({"ipBlock": {"cidr": "0.0.0.0/0", "except": ["0.0.0.0/1", "128.0.0.0/1"]}},
     {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}, True),
    ({"ipBlock": {"cidr": "::/0"}}, {"ipBlock": {"cidr": "0.0.0.0/0"}}, False),
    ({"namespaceSelector": {}}, {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "c"}}}, False),
    ({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "c"}}}, {"namespaceSelector": {}}, True),
    ({"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                  "operator": "NotIn", "values": ["x"]}]}},
     {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "c"}}}, False),
    ({"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                  "operator": "In", "values": ["c"]}]}},
     {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "c"}}}, True),
    ({"podSelector": {"matchLabels": {"a": "1", "b": "2"}}}, {"podSelector": {"matchLabels": {"a": "1"}}}, True),
    ({"podSelector": {}}, {"podSelector": {"matchLabels": {"a": "1"}}}, False),
    ({"podSelector": {"matchLabels": {"a": "1"}}},
     {"namespaceSelector": {}, "podSelector": {"matchLabels": {"a": "1"}}}, True),
    ({"namespaceSelector": {}, "podSelector": {"matchLabels": {"a": "1"}}},
     {"podSelector": {"matchLabels": {"a": "1"}}}, False),
    ({"ipBlock": {"cidr": "10.0.0.1/32"}}, {"podSelector": {}}, False),
])
def test_a_peer_is_within_another_by_what_it_selects(narrow, wide, inside):
    from k3infra.policies.exposure import peer_within

    assert peer_within(_peer(narrow), _peer(wide)) is inside


@pytest.mark.parametrize("narrow, wide, inside", [
    ({"port": 8000}, {"port": 8000, "protocol": "TCP"}, True),
    ({"port": 8000, "protocol": "UDP"}, {"port": 8000}, False),
    ({"port": 1024, "endPort": 2048}, {"port": 1024, "endPort": 65535}, True),
    ({"port": 1000, "endPort": 2048}, {"port": 1024, "endPort": 65535}, False),
    ({"port": "http"}, {"port": "http"}, True),
    ({"port": "http"}, {"port": 8000}, False),
    ({}, {"port": 8000}, False),
])
def test_a_port_is_within_another_by_range_and_protocol(narrow, wide, inside):
    from k3infra.policies.exposure import _port, port_within

    assert port_within(_port(narrow), _port(wide)) is inside


def test_without_a_config_the_serving_pods_are_still_held_to_the_fixed_rule():
    """An embedding program without k3:* keys: nothing admits every namespace to them."""
    from k3infra.policies.exposure import ALL_PORTS, Peer, _open_to_all

    assert _open_to_all(None) == [(Peer("any"), ALL_PORTS)]
    wide = [(_peer({"namespaceSelector": {}}), ALL_PORTS),
            (_peer({"ipBlock": {"cidr": "0.0.0.0/0"}}), ALL_PORTS),
            (_peer({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "c"}}}),
             ALL_PORTS)]
    assert len(_open_to_all(wide)) == 2


def test_accuracy_run_refuses_an_endpoint_with_credentials_masked(capsys):
    """`accuracy run --endpoint` by the same one URL rule: never echoed."""
    rc, text = cli(capsys, "accuracy", "run", "--endpoint", "https://user:secret@k3.example.com",
                   "--out", "d")
    assert rc == 2 and "argument --endpoint: '" in text and "://***@" in text, text
    assert "secret" not in text


def test_a_proxy_cpu_limit_left_null_is_the_request():
    """k3:serving.proxyResources.cpuLimit null: nginx's workers from the request (its
    cpu_max), never a TypeError in the render."""
    from conftest import manifest, render

    r = render("existing", f"weightsRevision={GOOD_REVISION}",
               'serving={"proxyResources": {"cpu": 1, "cpuLimit": null}}')
    conf = manifest(r, "ConfigMap", "kimi-k3-proxy")["data"]["nginx.conf"]
    assert "worker_processes 1;" in conf
