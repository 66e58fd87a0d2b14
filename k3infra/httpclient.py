"""The one HTTP client for every server k3infra talks to: registries and their mirrors
(k3infra.pins.oci), the Hub's API and its files (k3infra.weights.hubapi, for
`k3infra pins`, `weights lock --hub` and `weights mirror`), in-cluster weights sources
(k3infra.weights.sources), and any store a later command adds. Nothing a server sends
is trusted:

- **Deadlines.** Every call ends within `call_seconds`, and every call of one command
  within the command's `Deadline`: a watchdog shuts the socket down when time is up,
  so a server that sends one byte a second (slow-loris) or nothing at all ends there,
  whatever the library's per-read timeout would allow.
- **Bounded headers and bodies.** At most MAX_HEADERS header lines of MAX_HEADER_BYTES
  in all (http.client refuses over 100 lines and a line over 64 KiB itself); a body is
  read to the size it declares, and never past the cap its caller gives for its kind: a
  `Content-Length` over the cap is refused before a byte is read, an endless body at
  the cap.
- **Verified bodies.** `expect_size` / `expect_sha256`: a body of another length or hash
  is refused (a registry's manifest by its digest, a Hub file by its listed size).
- **Where it goes.** Only `https://`, or `http://` for a host the caller opted in
  (`HttpClient(http_hosts=...)`: a host the user named with `http://`, a registry on
  loopback or one registries.conf marks insecure); redirects and auth realms are held
  to the same rule (a `file://` realm, a redirect to another scheme, or to plain HTTP
  elsewhere, is refused). Credentials are a `Credential` bound to one origin (scheme,
  host, port): sent only there, never after a redirect elsewhere; a URL carrying
  `user:password@` is refused, never sent.
- HTTP(S)_PROXY / NO_PROXY are honoured as urllib does (loopback never goes through a
  proxy); TLS is verified against the system's CAs (SSL_CERT_FILE / SSL_CERT_DIR).

Standard library only (http.client, ssl): the weights runtime ships this file beside its
own modules into pods (k3weights, like podcommon.py), so one client runs on the
operator's machine and in the prefetch Job.
"""
from __future__ import annotations

import base64
import hashlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections import namedtuple
from typing import Iterable, Optional

# Beside it on the operator's machine (k3infra/) and in pods (k3weights/) alike.
from .podcommon import JsonRefused, parse_json

MAX_HEADERS = 64
MAX_HEADER_BYTES = 64 * 1024
MAX_REDIRECTS = 5
CALL_SECONDS = 60.0
CHUNK = 64 * 1024
_REDIRECTS = (301, 302, 303, 307, 308)


class HttpError(RuntimeError):
    """A call that gave no usable answer: one line naming the URL and why."""

    def __init__(self, url: str, problem: str, status: Optional[int] = None,
                 headers: Optional[dict] = None):
        self.url, self.problem, self.status = url, problem, status
        self.headers = headers or {}
        super().__init__(f"{url}: {problem}")


class Deadline:
    """The moment by which every call of one command must have finished."""

    def __init__(self, seconds: float, what: str = "the command"):
        self.seconds, self.what = float(seconds), what
        self.at = time.monotonic() + self.seconds

    def left(self) -> float:
        return self.at - time.monotonic()


# `origin`: (scheme, host, port) the credential belongs to; `header`: its name; `value`.
Credential = namedtuple("Credential", "origin header value")
Response = namedtuple("Response", "status headers body url")


def origin(url: str) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


def show(url: str) -> str:
    """A URL as messages print it: no query (a signed URL's signature stays out)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))[:300]


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def credential_for(url: str, header: str, value: str) -> Credential:
    return Credential(origin(url), header, value)


class HttpClient:
    """One command's client: its Deadline, the hosts it may speak plain HTTP to, and the
    per-call limit. `request` is the one way a call is made."""

    def __init__(self, *, deadline: Optional[Deadline] = None, call_seconds: float = CALL_SECONDS,
                 http_hosts: Iterable[str] = (), user_agent: str = "k3infra",
                 max_redirects: int = MAX_REDIRECTS):
        self.deadline = deadline
        self.call_seconds = float(call_seconds)
        self.http_hosts = {h.lower() for h in http_hosts}
        self.user_agent = user_agent
        self.max_redirects = max_redirects

    def allow_http(self, url: str) -> str:
        """The user named `url` with http://: plain HTTP is opted in for its host."""
        if urllib.parse.urlsplit(url).scheme.lower() == "http":
            self.http_hosts.add(origin(url)[1])
        return url

    # ---- what may be asked ----
    def check_url(self, url: str, what: str = "URL") -> tuple[str, str, int]:
        """(scheme, host, port) of a URL this client may ask; HttpError otherwise."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise HttpError(show(url), f"not a usable {what} ({exc})") from None
        scheme = parts.scheme.lower()
        host = (parts.hostname or "").lower()
        if scheme not in ("http", "https"):
            raise HttpError(show(url), f"the {what}'s scheme {scheme or '(none)'}: is refused; "
                            "only https:// (or http:// for a host you named with it)")
        if not host or any(c.isspace() or not 0x20 < ord(c) < 0x7f for c in url):
            raise HttpError(show(url).encode("ascii", "backslashreplace").decode(),
                            f"not a usable {what} (no host, or a space, control or non-ASCII "
                            "character in it)")
        if parts.username is not None or parts.password is not None:
            raise HttpError(f"{scheme}://{host}", f"the {what} carries credentials "
                            "(user:password@): never sent; pass them as a secret")
        if scheme == "http" and host not in self.http_hosts:
            raise HttpError(show(url), f"plain http:// to {host} is refused (not a host you "
                            "named with http://); only https:// elsewhere")
        return scheme, host, port or (443 if scheme == "https" else 80)

    # ---- a call ----
    def request(self, method: str, url: str, *, body_max: int, kind: str = "answer",
                headers: Optional[dict] = None, credential: Optional[Credential] = None,
                expect_size: Optional[int] = None, expect_sha256: Optional[str] = None,
                statuses: Iterable[int] = (200,), sink=None, data: Optional[bytes] = None,
                seconds: Optional[float] = None) -> Response:
        """`method url`, following redirects within the rules; the body read whole (at
        most `body_max` bytes, or exactly `expect_size`) and checked against
        `expect_sha256`, into memory or written to `sink` (then `body` is None). `data`:
        a request body (PUT, POST), sent with its length, and again to a 307/308 target
        (only to the same origin: a body is not handed to another host). `seconds`: this
        call's limit instead of `call_seconds` (a large file's), still within the Deadline.
        HttpError for a status outside `statuses` (with .status and .headers)."""
        statuses = tuple(statuses)
        limit = self._call_limit(seconds)
        ends = time.monotonic() + limit
        current = url
        for _hop in range(self.max_redirects + 1):
            self.check_url(current, "redirect target" if current != url else "URL")
            send = {"User-Agent": self.user_agent, "Accept-Encoding": "identity",
                    **(headers or {})}
            if credential is not None and origin(current) == tuple(credential.origin):
                send[credential.header] = credential.value
            if data is not None:
                send["Content-Length"] = str(len(data))
            status, got, resp, conn, watch = self._open(method, current, send, ends, limit, data)
            try:
                if status in _REDIRECTS and got.get("location"):
                    nxt = urllib.parse.urljoin(current, got["location"])
                    if status in (301, 302, 303) and method not in ("GET", "HEAD"):
                        method, data = "GET", None       # as browsers and urllib do
                    if data is not None and origin(nxt) != origin(current):
                        raise HttpError(show(current), f"redirects a request body to "
                                        f"{show(nxt)}: another origin, not followed")
                    current = nxt
                    continue
                if status not in statuses:
                    raise HttpError(show(current), f"answered {status} {resp.reason}"[:200],
                                    status, got)
                body = None if method == "HEAD" else self._body(
                    resp, got, show(current), kind, body_max, expect_size, expect_sha256,
                    sink, watch, limit)
                return Response(status, got, body, current)
            finally:
                watch.cancel()
                conn.close()
        raise HttpError(show(url), f"more than {self.max_redirects} redirects")

    def json(self, url: str, *, body_max: int, kind: str = "answer", **kw):
        """(parsed JSON, Response): the body through podcommon.parse_json."""
        resp = self.request("GET", url, body_max=body_max, kind=kind,
                            headers={"Accept": "application/json", **(kw.pop("headers", None) or {})},
                            **kw)
        try:
            return parse_json(resp.body), resp
        except JsonRefused as exc:
            raise HttpError(show(resp.url), f"the {kind} is {exc}") from None

    # ---- internals ----
    def _call_limit(self, seconds: Optional[float] = None) -> float:
        limit = self.call_seconds if seconds is None else float(seconds)
        if self.deadline is not None:
            left = self.deadline.left()
            if left <= 0:
                raise HttpError("(no call made)", f"{self.deadline.what}'s deadline of "
                                f"{self.deadline.seconds:g} s has passed")
            limit = min(limit, left)
        return limit

    def _expired(self, limit: float) -> str:
        if self.deadline is not None and self.deadline.left() <= 0:
            return (f"no complete answer before {self.deadline.what}'s deadline of "
                    f"{self.deadline.seconds:g} s")
        return f"no complete answer within {limit:g} s"

    def _open(self, method: str, url: str, send: dict, ends: float, limit: float,
              data: Optional[bytes] = None):
        scheme, host, port = origin(url)
        parts = urllib.parse.urlsplit(url)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        proxy = _proxy(scheme, host)
        left = ends - time.monotonic()
        if left <= 0:
            raise HttpError(show(url), self._expired(limit))
        if proxy is not None:
            p_host, p_port, p_auth = proxy
            if scheme == "https":
                conn = http.client.HTTPSConnection(p_host, p_port, timeout=left,
                                                   context=ssl.create_default_context())
                conn.set_tunnel(host, port, headers=p_auth)
            else:
                conn = http.client.HTTPConnection(p_host, p_port, timeout=left)
                target = urllib.parse.urlunsplit((scheme, parts.netloc, target, "", ""))
                send = {**send, **p_auth}
        elif scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=left,
                                               context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=left)
        watch = _Watchdog(conn, ends)
        try:
            conn.connect()
            watch.arm()
            conn.putrequest(method, target, skip_accept_encoding=True)
            for key, value in send.items():
                conn.putheader(key, value)
            conn.endheaders(data)
            resp = conn.getresponse()
        except http.client.LineTooLong:
            watch.cancel()
            conn.close()
            raise HttpError(show(url), "a status or header line longer than 65536 bytes") from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            watch.cancel()
            conn.close()
            if watch.fired or isinstance(exc, (socket.timeout, TimeoutError)):
                raise HttpError(show(url), self._expired(limit)) from None
            text = str(exc) or type(exc).__name__
            if "more than 100 headers" in text:
                text = "more than 100 header lines"
            raise HttpError(show(url), f"no usable answer ({text[:200]})") from None
        try:
            if watch.fired:         # headers cut off by the deadline are no answer
                raise HttpError(show(url), self._expired(limit))
            got = _headers(resp, show(url))
        except BaseException:
            watch.cancel()
            conn.close()
            raise
        return resp.status, got, resp, conn, watch

    def _body(self, resp, got: dict, url: str, kind: str, body_max: int,
              expect_size: Optional[int], expect_sha256: Optional[str], sink, watch,
              limit: float) -> Optional[bytes]:
        declared = got.get("content-length")
        if declared is not None:
            if not declared.isdigit() or len(declared) > 19:
                raise HttpError(url, f"Content-Length {declared[:40]!r} is not a byte count")
            declared = int(declared)
            if declared > body_max:
                raise HttpError(url, f"declares a {kind} of {declared} bytes, more than the "
                                f"{body_max} accepted")
            if expect_size is not None and declared != expect_size:
                raise HttpError(url, f"declares {declared} bytes; {expect_size} were listed")
        most = min(body_max, expect_size) if expect_size is not None else body_max
        digest = hashlib.sha256()
        chunks, total = [], 0
        try:
            while True:
                chunk = resp.read1(min(CHUNK, most + 1 - total))
                if not chunk:
                    break
                total += len(chunk)
                if total > most:
                    raise HttpError(url, f"sent more than the {most} bytes "
                                    + (f"listed for it" if expect_size is not None and most == expect_size
                                       else f"accepted for a {kind}") + "; stopped reading")
                digest.update(chunk)
                if sink is not None:
                    sink.write(chunk)
                else:
                    chunks.append(chunk)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            if watch.fired or isinstance(exc, (socket.timeout, TimeoutError)):
                raise HttpError(url, self._expired(limit)) from None
            raise HttpError(url, f"the {kind} broke off after {total} bytes "
                            f"({str(exc)[:120] or type(exc).__name__})") from None
        if watch.fired:
            raise HttpError(url, self._expired(limit))
        if declared is not None and total != declared:
            raise HttpError(url, f"ended after {total} of the {declared} bytes it declared")
        if expect_size is not None and total != expect_size:
            raise HttpError(url, f"sent {total} bytes; {expect_size} were listed")
        if expect_sha256 is not None and digest.hexdigest() != expect_sha256:
            raise HttpError(url, f"the {kind}'s bytes hash to sha256:{digest.hexdigest()}, not "
                            f"the sha256:{expect_sha256} claimed for it: refused")
        return None if sink is not None else b"".join(chunks)


class _Watchdog:
    """Shuts the connection's socket down at `ends`: every blocked read returns then."""

    def __init__(self, conn, ends: float):
        self.conn, self.ends, self.fired = conn, ends, False
        self._timer: Optional[threading.Timer] = None

    def arm(self) -> None:
        self._timer = threading.Timer(max(0.0, self.ends - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = getattr(self.conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _headers(resp, url: str) -> dict:
    items = resp.msg.items()
    if len(items) > MAX_HEADERS:
        raise HttpError(url, f"sent {len(items)} header lines; at most {MAX_HEADERS} are accepted")
    size = sum(len(k) + len(v) for k, v in items)
    if size > MAX_HEADER_BYTES:
        raise HttpError(url, f"sent {size} bytes of headers; at most {MAX_HEADER_BYTES} are accepted")
    out: dict = {}
    for key, value in items:
        key = key.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def _proxy(scheme: str, host: str) -> Optional[tuple[str, int, dict]]:
    """(host, port, auth headers) of the proxy for `scheme` to `host`, as urllib reads
    HTTP(S)_PROXY and NO_PROXY; None for a direct connection (always for loopback)."""
    if is_loopback(host):
        return None
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme)
    if not url or urllib.request.proxy_bypass_environment(host, proxies):
        return None
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise HttpError(show(url), f"{scheme}_proxy: only an http:// proxy is supported")
    auth = {}
    if parts.username is not None:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        auth = {"Proxy-Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
    return parts.hostname, parts.port or 8080, auth
