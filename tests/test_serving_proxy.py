"""The serving proxy (issue 21, item 2), run for real: nginx with the rendered config in
front of a loopback stand-in for vLLM, driven over every route vLLM's app registers.

Needs the `nginx` binary (Debian: `apt-get install nginx-light`); skipped with that
reason when it is missing. The config text is the product's (proxy.nginx_conf); only
the key file, the temp dir and the ports are this test's.
"""
from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from k3infra.config import parse_stack_config
from k3infra.receipt import load_receipt
from k3infra.serving import proxy
from vllm_routes import TRICK_PATHS, VLLM_ROUTES

NGINX = shutil.which("nginx") or (Path("/usr/sbin/nginx").is_file() and "/usr/sbin/nginx")
KEY = "k3-Test.key+with/every~char_-0123456789=="
ALLOWED = {(r.method, r.path) for r in proxy.ALLOWED_ROUTES}
ALLOWED_PATHS = {r.path for r in proxy.ALLOWED_ROUTES}
METHODS_WITH_BODY = {"POST", "PUT", "PATCH"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandIn(BaseHTTPRequestHandler):
    """Answers every method on every path with what it received. (HTTP trims trailing
    spaces of a header value, so `Bearer <key> ` is the key itself: not a case.)"""

    seen: list[tuple[str, str, str]] = []
    # Streaming: the first event is sent, the second only once the client has the first.
    first_event_received = threading.Event()
    body_sizes: list[int] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            StandIn.body_sizes.append(len(self.rfile.read(length)))
        if self.headers.get("X-Test-Stream"):
            return self._stream()
        StandIn.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        body = json.dumps({"upstream": self.path, "method": self.command}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in (b"data: first\n\n", None, b"data: [DONE]\n\n"):
            if event is None:
                StandIn.first_event_received.wait(timeout=30)
                continue
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _answer

    def log_message(self, *args) -> None:
        pass


def as_proxy_user(tmp: Path) -> list[str]:
    """Run nginx as the pod does: the proxy's non-root uid, owning only its temp dir.
    (As root, nginx would start its workers as `nobody` instead.)"""
    import os

    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or not setpriv:
        return []
    for path in (tmp, *tmp.iterdir()):
        os.chown(path, proxy.PROXY_UID, proxy.PROXY_UID)
    return [setpriv, f"--reuid={proxy.PROXY_UID}", f"--regid={proxy.PROXY_UID}",
            "--clear-groups"]


@pytest.fixture(scope="module")
def running():
    if not NGINX:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light); "
                    ".ci/run installs it")
    import tempfile

    # Directly under /tmp: pytest's own temp root is private to this user.
    tmp = Path(tempfile.mkdtemp(prefix="k3-proxy-"))
    engine = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    ports = {"port": free_port(), "metricsPort": free_port(), "healthPort": free_port(),
             "enginePort": engine.server_address[1]}
    cfg = parse_stack_config({"weightsRevision": "a" * 40, "apiKey": KEY,
                              "engineImage": "r/vllm@sha256:" + "1" * 64, "serving": ports}, receipt=load_receipt())
    (tmp / proxy.KEYS_KEY).write_text(proxy.secret_files(KEY)[proxy.KEYS_KEY])
    conf = proxy.nginx_conf(cfg, keys_file=str(tmp / proxy.KEYS_KEY), tmp_dir=str(tmp))
    # The product's text with only the key file and temp dir moved.
    assert conf.replace(str(tmp / proxy.KEYS_KEY), f"{proxy.CONF_DIR}/{proxy.KEYS_KEY}") \
               .replace(str(tmp), proxy.TMP_DIR) == proxy.config_files(cfg)[proxy.CONF_KEY]
    (tmp / "nginx.conf").write_text(conf)
    # The access log goes to /dev/stdout: a file the proxy's user owns, as runc hands a
    # container its stdio.
    (tmp / "stdout").write_text("")
    as_pod = as_proxy_user(tmp)
    stdout = open(tmp / "stdout", "a")
    test = subprocess.run([*as_pod, NGINX, "-t", "-e", "stderr", "-c", str(tmp / "nginx.conf")],
                          stdout=stdout, stderr=subprocess.PIPE, text=True)
    assert test.returncode == 0, test.stderr
    proc = subprocess.Popen([*as_pod, NGINX, "-e", "stderr", "-c", str(tmp / "nginx.conf"),
                             "-g", "daemon off;"], stdout=stdout, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 10
    for port in (ports["port"], ports["metricsPort"], ports["healthPort"]):
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    pytest.fail(f"nginx did not listen on {port}: {proc.stderr.read()}")
                time.sleep(0.05)
    yield {**ports, "access_log": tmp / "stdout"}
    proc.terminate()
    proc.wait(timeout=10)
    stdout.close()
    engine.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def call(port: int, method: str, path: str, auth: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Authorization": auth} if auth is not None else {}
    body = b'{"model": "kimi-k3", "prompt": "hi"}' if method in METHODS_WITH_BODY else None
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def reached_engine(fn) -> list:
    before = len(StandIn.seen)
    fn()
    return StandIn.seen[before:]


def test_route_table_covers_the_allowed_routes():
    assert ALLOWED <= set(VLLM_ROUTES)


@pytest.mark.parametrize("method,path", VLLM_ROUTES)
def test_every_vllm_route_without_a_key_is_401_or_404(running, method, path):
    box: dict = {}
    seen = reached_engine(lambda: box.update(r=call(running["port"], method, path)))
    expected = 401 if path in ALLOWED_PATHS else 404
    assert box["r"][0] == expected, f"{method} {path}: {box['r']}"
    assert seen == []


@pytest.mark.parametrize("method,path", VLLM_ROUTES)
def test_every_vllm_route_with_the_key_reaches_vllm_only_if_allowed(running, method, path):
    box: dict = {}
    seen = reached_engine(lambda: box.update(r=call(running["port"], method, path,
                                                    f"Bearer {KEY}")))
    status, body = box["r"]
    if (method, path) in ALLOWED:
        assert status == 200 and json.loads(body) == {"upstream": path, "method": method}
        assert seen == [(method, path, f"Bearer {KEY}")]   # vLLM's own key check still runs
    else:
        assert status == 404 if path not in ALLOWED_PATHS else status == 403
        assert seen == []


@pytest.mark.parametrize("auth", [
    None, "", "Bearer", "Bearer ", f"bearer {KEY}", f"Bearer {KEY.upper()}",
    f"Bearer {KEY.lower()}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", f"Bearer  {KEY}",
    f"Basic {KEY}", KEY, f"Bearer {KEY.replace('.', 'X')}", f"Bearer {KEY.replace('+', 'X')}",
    f"Bearer {KEY},Bearer x", f"Bearer x,Bearer {KEY}"])
def test_a_wrong_key_is_401_and_never_reaches_vllm(running, auth):
    for route in proxy.ALLOWED_ROUTES:
        box: dict = {}
        seen = reached_engine(lambda: box.update(r=call(running["port"], route.method,
                                                        route.path, auth)))
        assert box["r"][0] == 401, (auth, route)
        assert seen == []


@pytest.mark.parametrize("path", TRICK_PATHS)
def test_unlisted_paths_are_404_with_or_without_the_key(running, path):
    for auth in (None, f"Bearer {KEY}"):
        box: dict = {}
        seen = reached_engine(lambda: box.update(r=call(running["port"], "POST", path, auth)))
        assert box["r"][0] == 404, (path, auth, box["r"])
        assert seen == []


def test_a_merged_slash_path_is_forwarded_normalized(running):
    assert call(running["port"], "GET", "//v1//models")[0] == 401
    seen = reached_engine(lambda: call(running["port"], "GET", "//v1//models", f"Bearer {KEY}"))
    assert [s[1] for s in seen] == ["/v1/models"]


@pytest.mark.parametrize("method,path", VLLM_ROUTES)
def test_the_metrics_port_serves_only_get_metrics(running, method, path):
    box: dict = {}
    seen = reached_engine(lambda: box.update(r=call(running["metricsPort"], method, path)))
    if (method, path) == ("GET", "/metrics"):
        assert box["r"][0] == 200 and [s[1] for s in seen] == ["/metrics"]
    else:
        assert box["r"][0] == (403 if path == "/metrics" else 404), (method, path)
        assert seen == []


@pytest.mark.parametrize("method,path", VLLM_ROUTES)
def test_the_health_port_serves_only_get_health(running, method, path):
    box: dict = {}
    seen = reached_engine(lambda: box.update(r=call(running["healthPort"], method, path)))
    if (method, path) == ("GET", "/health"):
        assert box["r"][0] == 200 and [s[1] for s in seen] == ["/health"]
    else:
        assert box["r"][0] == (403 if path == "/health" else 404), (method, path)
        assert seen == []


def test_the_proxy_answers_its_own_liveness_without_vllm(running):
    box: dict = {}
    seen = reached_engine(lambda: box.update(r=call(running["healthPort"], "GET",
                                                    proxy.LIVE_PATH)))
    assert box["r"][0] == 200
    assert seen == []


def test_server_sent_events_reach_the_client_as_they_are_sent(running):
    """Tokens stream: the stand-in sends its second event only after the client read the
    first, so a proxy that held events back until the response ended would make the read
    below time out (20 s) before the stand-in gives up waiting (30 s). (nginx forwards
    what it has with proxy_buffering on too; `off` is there so nothing spools to disk.)"""
    StandIn.first_event_received.clear()
    conn = http.client.HTTPConnection("127.0.0.1", running["port"], timeout=20)
    conn.request("POST", "/v1/completions", body=b'{"stream": true}',
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json",
                          "X-Test-Stream": "1"})
    resp = conn.getresponse()
    assert resp.status == 200
    first = resp.readline()           # chunk-aware: returns as soon as the line is in
    assert first.strip() == b"data: first"
    StandIn.first_event_received.set()
    rest = resp.read()
    assert b"data: [DONE]" in rest
    conn.close()


def test_a_prompt_of_the_receipts_size_passes(running):
    """Workload A's prompts are ~36K tokens (~150 KB); 1 MiB passes whole."""
    body = b'{"prompt": "' + b"x" * (1 << 20) + b'"}'
    conn = http.client.HTTPConnection("127.0.0.1", running["port"], timeout=20)
    StandIn.body_sizes.clear()
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert conn.getresponse().status == 200
    assert StandIn.body_sizes == [len(body)]
    conn.close()


def test_the_access_log_never_holds_the_key(running):
    """Every request above is logged (method, path, status), the key never is."""
    call(running["port"], "POST", "/v1/completions", f"Bearer {KEY}")
    call(running["port"], "POST", "/invocations", f"Bearer {KEY}")
    log = running["access_log"].read_text()
    assert '"POST /v1/completions" 200' in log and '"POST /invocations" 404' in log
    assert KEY not in log and KEY.replace("+", "%2B") not in log


def test_the_benchmarks_tokenize_passes_with_the_key_only(running):
    """Issue 27: `vllm bench serve` through the proxy found no /tokenize; the benchmark
    Job holds Workload A's lengths to the server's own count, POST /tokenize with the
    key. Without the key (vLLM's --api-key does not guard it) it is 401; nothing else
    of the tokenizer router passes."""
    box: dict = {}
    seen = reached_engine(lambda: box.update(r=call(running["port"], "POST", "/tokenize",
                                                    f"Bearer {KEY}")))
    assert box["r"][0] == 200 and seen == [("POST", "/tokenize", f"Bearer {KEY}")]
    for auth in (None, f"Bearer {KEY}x"):
        seen = reached_engine(lambda: box.update(r=call(running["port"], "POST", "/tokenize",
                                                        auth)))
        assert box["r"][0] == 401 and seen == []
    for method, path, status in (("GET", "/tokenize", 403), ("POST", "/detokenize", 404),
                                 ("GET", "/tokenizer_info", 404)):
        seen = reached_engine(lambda: box.update(r=call(running["port"], method, path,
                                                        f"Bearer {KEY}")))
        assert box["r"][0] == status and seen == [], (method, path)


def test_the_access_log_needs_stdout_owned_by_the_proxys_user(tmp_path):
    """Issue 27: run by hand with a stdout owned by root, nginx (as the proxy's user)
    could not open /dev/stdout. nginx 1.22 reopens the access log by path (`access_log
    stderr` would be a file named `stderr`), so the log needs the fd's owner to be the
    container's user: runc does that for every container (libcontainer's
    fixStdioPermissions fchowns PID 1's stdio to the process user), so a pod's and a
    Compose service's proxy log; a hand-made harness must do the same. Both sides,
    with the real nginx: a root-owned pipe (what containerd hands runc) is refused with
    the path named, the same pipe chowned as runc does is accepted."""
    import os

    if not NGINX:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light)")
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run nginx as the proxy's user")
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="k3-proxy-stdout-"))
    try:
        cfg = parse_stack_config({"weightsRevision": "a" * 40, "apiKey": KEY,
                                  "engineImage": "r/vllm@sha256:" + "1" * 64},
                                 receipt=load_receipt())
        (tmp / proxy.KEYS_KEY).write_text(proxy.secret_files(KEY)[proxy.KEYS_KEY])
        (tmp / "nginx.conf").write_text(proxy.nginx_conf(cfg, keys_file=str(tmp / proxy.KEYS_KEY),
                                                         tmp_dir=str(tmp)))
        as_pod = as_proxy_user(tmp)

        def nginx_test(chown: bool) -> subprocess.CompletedProcess:
            read, write = os.pipe()
            if chown:
                os.fchown(write, proxy.PROXY_UID, proxy.PROXY_UID)
            try:
                return subprocess.run([*as_pod, NGINX, "-t", "-e", "stderr", "-c",
                                       str(tmp / "nginx.conf")], stdout=write,
                                      stderr=subprocess.PIPE, text=True, timeout=30)
            finally:
                os.close(write)
                os.close(read)

        refused = nginx_test(chown=False)
        assert refused.returncode != 0
        assert 'open() "/dev/stdout" failed (13: Permission denied)' in refused.stderr
        accepted = nginx_test(chown=True)
        assert accepted.returncode == 0, accepted.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
