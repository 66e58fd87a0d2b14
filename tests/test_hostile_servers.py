"""Issue 48, kind 2: every server the CLI talks to is hostile. The one HTTP client
(k3infra/httpclient.py) and its users (registries and mirrors, the Hub, in-cluster weights
sources) against a loopback server that misbehaves in every way the issue lists: each
call ends in an answer or one line, within its deadline; bodies are bounded and checked;
realms and redirects held to https; credentials stay with their origin.

Deadlines here are about half a second (parameters, never sleeps of minutes); a hang fails the
test through the alarm, not an assertion on speed."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile_server as hs
from hostile import bounded, one_line
from k3infra.httpclient import Deadline, HttpClient, HttpError, credential_for

ROOT = Path(__file__).resolve().parent.parent
REV = "0123456789abcdef0123456789abcdef01234567"


def client(server=None, seconds: float = 0.6, **kw) -> HttpClient:
    c = HttpClient(call_seconds=seconds, **kw)
    if server is not None:
        c.allow_http(server.url)
    return c


def refused(call, *needles: str) -> str:
    with bounded(20):
        with pytest.raises(HttpError) as err:
            call()
    text = str(err.value)
    one_line(text)
    for needle in needles:
        assert needle in text, text
    return text


# ---- the client alone ---------------------------------------------------------------------

@pytest.mark.parametrize("route, needle", [
    (hs.endless(), "sent more than the 4096 bytes accepted"),
    (hs.huge_length(), "declares a answer of 10737418240 bytes, more than the 4096 accepted"),
    (hs.slow_headers(), "no complete answer within 0.6 s"),
    (hs.slow_body(), "no complete answer within 0.6 s"),
    (hs.silent(), "no complete answer within 0.6 s"),
    (hs.many_headers(150), "more than 100 header lines"),
    (hs.many_headers(80), "sent 81 header lines; at most 64 are accepted"),
    (hs.long_header(), "longer than 65536 bytes"),
    (hs.chunked([b"ab"], bad_size=b"zz"), "broke off"),
    (hs.answer(b"short", headers={"Content-Length": "100"}), "ended after 5 of the 100 bytes"),
    (hs.answer(b"{}", headers={"Content-Length": "-1"}), "is not a byte count"),
])
def test_a_misbehaving_server_is_one_line_within_the_deadline(route, needle):
    with hs.HostileServer({"/": route}) as server:
        refused(lambda: client(server).request("GET", server.url + "/x", body_max=4096), needle)


def test_the_commands_deadline_covers_every_call():
    """Per call 0.6 s, the command 1 s: the second slow call ends at the command's."""
    with hs.HostileServer({"/": hs.slow_body()}) as server:
        c = client(server, deadline=Deadline(1.0, "the test command"))
        refused(lambda: c.request("GET", server.url + "/a", body_max=1 << 20), "within 0.6 s")
        refused(lambda: c.request("GET", server.url + "/b", body_max=1 << 20),
                "before the test command's deadline of 1 s")
        refused(lambda: c.request("GET", server.url + "/c", body_max=1 << 20),
                "deadline of 1 s has passed")


@pytest.mark.parametrize("body, needle", [
    (b"{not json", "not JSON"),
    (b"[" * 100_000, "nested deeper than 64 levels"),
    (b"1" * 5000, "an integer of 5000 digits"),
    (b'{"a": NaN}', "NaN is not a JSON number"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_malformed_json_is_one_line(body, needle):
    with hs.HostileServer({"/": hs.answer(body)}) as server:
        refused(lambda: client(server).json(server.url + "/j", body_max=1 << 20), needle)


def test_a_body_is_held_to_its_claimed_size_and_digest():
    body = b"the bytes"
    with hs.HostileServer({"/": hs.answer(body)}) as server:
        c = client(server)
        assert c.request("GET", server.url + "/", body_max=100, expect_size=9,
                         expect_sha256=hashlib.sha256(body).hexdigest()).body == body
        refused(lambda: c.request("GET", server.url + "/", body_max=100, expect_size=8),
                "declares 9 bytes; 8 were listed")
        refused(lambda: c.request("GET", server.url + "/", body_max=100,
                                  expect_sha256="0" * 64), "hash to sha256:", "refused")
    with hs.HostileServer({"/": hs.endless()}) as server:     # no length: the listed size
        refused(lambda: client(server).request("GET", server.url + "/", body_max=1 << 30,
                                               expect_size=22), "more than the 22 bytes listed")


@pytest.mark.parametrize("target, needle", [
    ("file:///etc/passwd", "scheme file: is refused"),
    ("ftp://127.0.0.1/x", "scheme ftp: is refused"),
    ("gopher://127.0.0.1/x", "scheme gopher: is refused"),
    ("http://127.0.0.2:9/x", "plain http:// to 127.0.0.2 is refused"),
    ("http://user:pw@127.0.0.1:9/x", "carries credentials"),
    ("//127.0.0.2:9/x", "plain http:// to 127.0.0.2 is refused"),
])
def test_redirects_only_to_https_or_an_opted_in_host(target, needle):
    with hs.HostileServer({"/": hs.redirect(target)}) as server:
        refused(lambda: client(server).request("GET", server.url + "/r", body_max=100), needle)


def test_credentials_never_leave_their_origin():
    with hs.HostileServer({"/": hs.answer(b"ok")}) as cdn:
        with hs.HostileServer({"/": hs.redirect(cdn.url + "/blob")}) as registry:
            c = client(registry)
            c.allow_http(cdn.url)          # same host, another port: another origin
            cred = credential_for(registry.url, "Authorization", "Bearer secret")
            assert c.request("GET", registry.url + "/x", body_max=10, credential=cred).body == b"ok"
    assert registry.requests[0].headers.get("authorization") == "Bearer secret"
    assert "authorization" not in cdn.requests[0].headers


def test_a_url_with_credentials_or_a_control_character_is_never_sent():
    c = HttpClient()
    for url in ("http://u:p@127.0.0.1:1/", "https://tok@example.org/", "https://a b/",
                "https://example.org/\r\nX: y", "https://exämple.org/"):
        refused(lambda: c.request("GET", url, body_max=1))


BEHAVIOURS = st.one_of(
    st.builds(hs.answer, st.binary(max_size=300), st.sampled_from([200, 204, 301, 404, 500]),
              st.dictionaries(st.sampled_from(["Content-Length", "Location", "X-A", "Content-Type"]),
                              st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                      max_size=40), max_size=3)),
    st.builds(hs.redirect, st.sampled_from(["file:///etc/passwd", "/loop", "http://127.0.0.3/",
                                            "https://127.0.0.1:1/", "//x", ""])),
    st.builds(hs.many_headers, st.integers(0, 200)),
    st.builds(hs.chunked, st.lists(st.binary(min_size=1, max_size=50), max_size=4),
              st.one_of(st.none(), st.sampled_from([b"zz", b"ffffffffffffffffff", b"-1"]))),
    st.just(hs.slow_headers(0.3)), st.just(hs.silent()), st.just(hs.endless()),
)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(route=BEHAVIOURS, method=st.sampled_from(["GET", "HEAD"]))
def test_any_server_behaviour_is_an_answer_or_one_line_within_the_deadline(route, method):
    with hs.HostileServer({"/": route}) as server:
        with bounded(20):
            try:
                resp = client(server, seconds=0.5).request(method, server.url + "/p",
                                                           body_max=4096, statuses=(200, 204))
                assert resp.body is None or len(resp.body) <= 4096
            except HttpError as exc:
                one_line(str(exc))


# ---- registries (k3infra pins) ------------------------------------------------------------

def _resolve(server, tag: str = "1", seconds: float = 0.6):
    from k3infra.pins import oci

    http = oci.client(10.0)
    http.call_seconds = seconds
    return oci.resolve(f"{server.address}/k3/img:{tag}", http=http)


def _resolve_refused(server, *needles: str) -> str:
    from k3infra.pins import oci

    with bounded(20):
        with pytest.raises(oci.ResolveError) as err:
            _resolve(server)
    text = str(err.value)
    one_line(text)
    for needle in needles:
        assert needle in text, text
    return text


def _challenge(realm: str):
    return hs.answer(b"", 401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="s"'})


def test_a_file_realm_is_never_read_nor_sent(tmp_path):
    """The kit's case: a 401 whose realm is file:// made pins read a local file and send
    it as a bearer token."""
    secret = tmp_path / "token.json"
    secret.write_text(json.dumps({"token": "local-file-content"}))
    with hs.HostileServer({"/v2/": _challenge(f"file://{secret}")}) as server:
        _resolve_refused(server, "auth realm", "scheme file: is refused")
    assert all("local-file-content" not in str(r.headers) for r in server.requests)
    assert len(server.requests) == 1


def test_a_realm_on_another_plain_http_host_is_refused():
    with hs.HostileServer({"/v2/": _challenge("http://127.0.0.2:1/token")}) as server:
        _resolve_refused(server, "plain http:// to 127.0.0.2 is refused")


def _manifest(config_digest: str) -> bytes:
    return json.dumps({"schemaVersion": 2, "config": {"digest": config_digest}}).encode()


def test_a_manifest_that_does_not_hash_to_its_digest_is_refused():
    body = _manifest("sha256:" + "c" * 64)
    with hs.HostileServer({"/v2/": hs.manifest_digest_mismatch(body)}) as server:
        _resolve_refused(server, "hash to sha256:", "not the sha256:", "refused")


def _registry(manifest: bytes, config: bytes = b"", extra: dict | None = None):
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    hdrs = {"Docker-Content-Digest": digest,
            "Content-Type": "application/vnd.oci.image.manifest.v1+json"}
    return {"/v2/k3/img/manifests/": hs.answer(manifest, 200, hdrs),
            "/v2/k3/img/blobs/": hs.answer(config), **(extra or {})}


@pytest.mark.parametrize("doc, needle", [
    ({"schemaVersion": 2, "manifests": 5}, "manifests: Input should be a valid list (got 5)"),
    ({"manifests": [{"digest": "sha256:x"}]}, "manifests[0].digest"),
    ({"config": {"digest": 7}}, "config.digest"),
    ([1, 2], "Input should be a valid dictionary"),
])
def test_a_mistyped_manifest_is_one_line_naming_the_field(doc, needle):
    with hs.HostileServer(_registry(json.dumps(doc).encode())) as server:
        _resolve_refused(server, needle)


def test_an_image_config_that_is_not_its_digest_is_refused_and_a_good_one_resolves():
    config = json.dumps({"os": "linux", "architecture": "amd64"}).encode()
    good = _manifest("sha256:" + hashlib.sha256(config).hexdigest())
    with hs.HostileServer(_registry(good, config)) as server:
        assert _resolve(server).digest == "sha256:" + hashlib.sha256(good).hexdigest()
    bad = _manifest("sha256:" + "d" * 64)
    with hs.HostileServer(_registry(bad, config)) as server:
        _resolve_refused(server, "blobs/sha256:dddd", "hash to")


@pytest.mark.parametrize("route, needle", [
    (hs.endless({"Docker-Content-Digest": "sha256:" + "a" * 64}), "sent more than the 4194304"),
    (hs.slow_headers(), "no complete answer within 0.6 s"),
    (hs.many_headers(150), "more than 100 header lines"),
    (hs.redirect("file:///etc/shadow"), "scheme file: is refused"),
])
def test_a_misbehaving_registry_is_one_line(route, needle):
    with hs.HostileServer({"/v2/": route}) as server:
        _resolve_refused(server, needle)


def test_a_token_answer_is_typed():
    """A token with a CR LF in it would inject a header: the answer's model refuses it."""
    routes = {"/token": hs.json_answer({"token": "a\r\nInjected: yes"})}
    with hs.HostileServer(routes) as server:
        server.routes["/v2/"] = _challenge(f"{server.url}/token")
        _resolve_refused(server, "token", "should match pattern")


# ---- the Hub (pins' branch commit, `weights lock --hub`) -----------------------------------

def _hub(server, seconds: float = 0.6):
    from k3infra.weights.hubapi import Hub

    return Hub(client(seconds=seconds), server.url, token=False)


def _tree_route(entries):
    return hs.json_answer(entries)


def test_the_hubs_commit_must_be_40_hex_never_markup():
    from k3infra.weights.hubapi import HubError

    for sha in ("[red]x[/red]", 5, None, "A" * 40):
        with hs.HostileServer({"/api/models/": hs.json_answer({"sha": sha})}) as server:
            with bounded(20), pytest.raises(HubError) as err:
                _hub(server).commit("o/m", "main")
        assert "names no 40-hex commit" in str(err.value)
        one_line(str(err.value))


@pytest.mark.parametrize("entry, needle", [
    ({"type": "file", "path": {"a": 1}, "size": 1, "oid": "a" * 40}, "must be a non-empty string"),
    ({"type": "file", "path": "a\udc80", "size": 1, "oid": "a" * 40}, "not valid UTF-8"),
    ({"type": "file", "path": "../x", "size": 1, "oid": "a" * 40}, "escapes"),
    ({"type": "file", "path": "a", "size": "22", "oid": "a" * 40}, "is not a byte count"),
    ({"type": "file", "path": "a", "size": 2 ** 60, "oid": "a" * 40}, "is not a byte count"),
    ({"type": "file", "path": "a", "size": 10 ** 40, "oid": "a" * 40}, "an integer of 41 digits"),
    ({"type": "file", "path": "a", "size": 1, "oid": "a" * 40, "lfs": {"oid": "x", "size": 1}},
     "64 lowercase hex"),
    ({"type": "link", "path": "a"}, "not a file or directory entry"),
    (5, "not a file or directory entry"),
])
def test_a_hostile_tree_listing_is_one_line(entry, needle):
    from k3infra.weights.hubapi import HubError

    body = json.dumps([entry]).replace("\\\\udc80", "\\udc80").encode()
    with hs.HostileServer({"/api/models/": hs.answer(body)}) as server:
        with bounded(20), pytest.raises(HubError) as err:
            _hub(server).files("o/m", REV)
    one_line(str(err.value))
    assert needle in str(err.value), str(err.value)


def test_a_tree_page_link_to_another_scheme_is_refused():
    from k3infra.weights.hubapi import HubError

    routes = {"/api/models/": hs.json_answer([], headers={"Link": '<file:///etc/passwd>; rel="next"'})}
    with hs.HostileServer(routes) as server:
        with bounded(20), pytest.raises(HubError, match="scheme file: is refused"):
            _hub(server).files("o/m", REV)


def _hub_routes(small: hs.Behaviour, size: int = 22):
    return {f"/api/models/o/m/revision/{REV}": hs.json_answer({"sha": REV}),
            f"/api/models/o/m/tree/{REV}": hs.json_answer(
                [{"type": "file", "path": "config.json", "size": size, "oid": "b" * 40}]),
            f"/o/m/resolve/{REV}/config.json": small}


def test_lock_hub_never_writes_more_than_the_listed_size(tmp_path):
    """The kit's case: an endless file listed as 22 bytes filled the disk."""
    from k3infra.weights import prefetch, tree

    with hs.HostileServer(_hub_routes(hs.endless())) as server:
        with bounded(20), pytest.raises(tree.LockError) as err:
            prefetch.lock_from_hub("o/m", REV, endpoint=server.url, client=client(seconds=1))
    assert "sent more than the 22 bytes listed" in str(err.value)
    with hs.HostileServer(_hub_routes(hs.answer(b"x" * 21))) as server:
        with bounded(20), pytest.raises(tree.LockError, match="declares 21 bytes; 22 were listed"):
            prefetch.lock_from_hub("o/m", REV, endpoint=server.url, client=client(seconds=1))
    with hs.HostileServer(_hub_routes(hs.answer(b"x" * 22))) as server:   # wrong blob id
        with bounded(20), pytest.raises(tree.LockError, match="git blob id"):
            prefetch.lock_from_hub("o/m", REV, endpoint=server.url, client=client(seconds=1))


def test_a_slow_source_times_out():
    """The kit's case: a slow in-cluster weights source never timed out."""
    from k3infra.weights import sources, tree

    with hs.HostileServer({"/k3/lock/": hs.slow_body()}) as server:
        with bounded(20), pytest.raises(tree.LockError, match="no complete answer within 0.6 s"):
            sources.fetch_lock(server.url, REV, "o/m", client())


# ---- the commands, end to end --------------------------------------------------------------

def _k3infra(*argv, env=None, timeout=60):
    return subprocess.run([sys.executable, "-c", "import sys; from k3infra.cli import main; "
                           "sys.exit(main())", *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


@pytest.mark.parametrize("route, needle", [
    (hs.endless(), "sent more than the 22 bytes listed"),
    (hs.slow_body(interval=0.5, length=22), "deadline of 1 s"),
    (hs.redirect("file:///etc/passwd"), "scheme file: is refused"),
])
def test_weights_lock_hub_against_a_hostile_hub(tmp_path, route, needle):
    out = tmp_path / "lock.json"
    with hs.HostileServer(_hub_routes(route)) as server:
        done = _k3infra("weights", "lock", "--hub", "o/m", "--revision", REV, "--timeout", "1",
                        "--out", str(out), env={"HF_ENDPOINT": server.url,
                                                "HF_HUB_OFFLINE": "0"})
    assert done.returncode == 1, done.stderr
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_weights_lock_sources_against_a_slow_source(tmp_path):
    with hs.HostileServer({"/": hs.slow_body()}) as server:
        done = _k3infra("weights", "lock", "--hub", "o/m", "--revision", REV, "--sources",
                        server.url, "--timeout", "1", "--out", str(tmp_path / "l.json"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "no source gave the lock" in done.stderr and "deadline of 1 s" in done.stderr


def test_a_request_body_is_sent_and_never_handed_to_another_origin():
    """What an object store client (issue 46) needs: PUT with a body, bounded as GET is."""
    with hs.HostileServer({"/": hs.answer(b"ok")}) as other:
        with hs.HostileServer({"/ok": hs.answer(b"stored"), "/away": hs.redirect(other.url + "/x", 307)}) as store:
            c = client(store)
            c.allow_http(other.url)
            assert c.request("PUT", store.url + "/ok", body_max=100, data=b"bytes").body == b"stored"
            assert store.requests[-1].headers["content-length"] == "5"
            refused(lambda: c.request("PUT", store.url + "/away", body_max=100, data=b"bytes"),
                    "redirects a request body", "another origin")
    assert other.requests == []


# ---- `weights mirror`: the Hub's files into the staging directory --------------------------

CONFIG = b'{"architectures": []}\n'          # 22 bytes, the lock's file


def _mirror(routes, tmp_path, monkeypatch, seconds: float = 1.0, token=None):
    """`weights mirror` of a one-file lock from `routes` (the Hub) into a memory store:
    (report, the store, the staging directory)."""
    from obstore.store import MemoryStore

    from k3infra.weights import store, tree
    from k3infra.weights.mirror import mirror

    lock = tree.make_lock("o/m", REV, [tree.FileEntry("config.json", len(CONFIG),
                                                      hashlib.sha256(CONFIG).hexdigest())])
    staging, memory = tmp_path / "staging", MemoryStore()
    staging.mkdir()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    with hs.HostileServer(routes) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with bounded(20):
            report = mirror(lock, store.parse_store_url("s3://weights/m"), store=memory,
                            staging=str(staging), emit=None, hub_seconds=seconds,
                            token=token)
        report.hub_requests = server.requests
    return report, memory, staging


@pytest.mark.parametrize("route, needle", [
    (hs.endless(), "sent more than the 22 bytes listed for it; stopped reading"),
    (hs.answer(b"x" * 21), "declares 21 bytes; 22 were listed"),
    (hs.chunked([b"x" * 21]), "sent 21 bytes; 22 were listed"),
    (hs.answer(b"y" * 22), f"hash to sha256:{hashlib.sha256(b'y' * 22).hexdigest()}, not the "
                           f"sha256:{hashlib.sha256(CONFIG).hexdigest()}"),
    (hs.slow_body(interval=0.3, length=22), "before the mirror's deadline of 1 s"),
    (hs.huge_length(), "declares a file of 10737418240 bytes, more than the 22 accepted"),
])
def test_the_mirror_takes_from_the_hub_at_most_the_locks_size_and_hash(tmp_path, monkeypatch,
                                                                       route, needle):
    """The kit's case for the mirror: hf_hub_download wrote whatever the Hub sent, for as
    long as it sent it, into the staging directory."""
    report, memory, staging = _mirror({f"/o/m/resolve/{REV}/config.json": route}, tmp_path,
                                      monkeypatch)
    assert not report.ok and report.uploaded_files == 0 and not report.lock_written
    [problem] = report.problems
    text = one_line(str(problem))
    assert text.startswith("config.json: not taken from the Hub: o/m@") and needle in text, text
    assert text.endswith(f"; the lock says 22 bytes, sha256 {hashlib.sha256(CONFIG).hexdigest()}")
    assert list(staging.iterdir()) == []                 # no partial file left behind
    assert memory.list().collect() == []                 # nothing uploaded


def test_the_mirror_sends_the_token_to_the_hub_only_never_to_its_cdn(tmp_path, monkeypatch):
    """The Hub answers an LFS file with a redirect to its CDN (another origin): the file
    is taken from there, without the token, and uploaded; nothing stays in staging."""
    import obstore

    with hs.HostileServer({"/": hs.answer(CONFIG)}) as cdn:
        report, memory, staging = _mirror(
            {f"/o/m/resolve/{REV}/config.json": hs.redirect(cdn.url + "/signed/config.json")},
            tmp_path, monkeypatch, token="hf_secret")
    assert report.ok and report.uploaded_files == 1, report.problems
    assert bytes(obstore.get(memory, f"o--m/{REV}/config.json").bytes()) == CONFIG
    assert list(staging.iterdir()) == []
    assert [r.headers.get("authorization") for r in report.hub_requests] == ["Bearer hf_secret"]
    [asked] = cdn.requests
    assert "authorization" not in asked.headers and asked.path == "/signed/config.json"


def test_the_mirror_never_follows_the_hub_to_plain_http_elsewhere(tmp_path, monkeypatch):
    report, _, staging = _mirror({f"/o/m/resolve/{REV}/config.json":
                                  hs.redirect("http://cdn.invalid/config.json")},
                                 tmp_path, monkeypatch, token="hf_secret")
    [problem] = report.problems
    assert "plain http:// to cdn.invalid is refused" in one_line(str(problem))
    assert list(staging.iterdir()) == []
