"""A loopback HTTP server that misbehaves on purpose (issue 48): every way a registry, a
Hub, a mirror or an in-cluster source can answer badly, one route each. Raw sockets, so
it can send what no well-behaved server library would: an endless body, a Content-Length
of 10 GiB, a header a byte at a time, 150 headers, a header line of 100 KB, a redirect to
file://, a 401 whose realm is a local file, a manifest that does not hash to its digest.

`HostileServer(routes)`: `routes` maps a path prefix to a behaviour (a callable taking the
connected socket and the parsed request); the server records every request (method,
path, headers) in `.requests`, and stops every connection it holds on `close()`.
"""
from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass
class Request:
    method: str
    path: str
    headers: dict = field(default_factory=dict)


Behaviour = Callable[[socket.socket, Request], None]


def _send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def head(status: int = 200, headers: Optional[dict] = None, reason: str = "X") -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# ---- behaviours ---------------------------------------------------------------------------

def answer(body: bytes = b"", status: int = 200, headers: Optional[dict] = None) -> Behaviour:
    """A well-formed answer (the body may still be the wrong bytes)."""
    def run(conn, req):
        hdrs = {"Content-Length": str(len(body)), "Connection": "close", **(headers or {})}
        _send(conn, head(status, hdrs) + (b"" if req.method == "HEAD" else body))
    return run


def json_answer(obj, status: int = 200, headers: Optional[dict] = None) -> Behaviour:
    return answer(json.dumps(obj).encode(), status, {"Content-Type": "application/json",
                                                      **(headers or {})})


def endless(headers: Optional[dict] = None, chunk: bytes = b"x" * 65536) -> Behaviour:
    """200 with no length, and bytes for as long as the client reads."""
    def run(conn, req):
        _send(conn, head(200, {"Connection": "close", **(headers or {})}))
        try:
            while True:
                conn.sendall(chunk)
        except OSError:
            pass
    return run


def huge_length(size: int = 10 << 30) -> Behaviour:
    def run(conn, req):
        _send(conn, head(200, {"Content-Length": str(size)}) + b"x" * 1024)
        time.sleep(2)
    return run


def slow_headers(interval: float = 0.05) -> Behaviour:
    """Slow-loris: a status line, then a header a byte at a time, never ending."""
    def run(conn, req):
        _send(conn, b"HTTP/1.1 200 OK\r\n")
        try:
            while True:
                conn.sendall(b"X-Slow: " + b"a" * 4 + b"\r\n")
                time.sleep(interval)
        except OSError:
            pass
    return run


def slow_body(interval: float = 0.05, length: int = 1000) -> Behaviour:
    """Slow-loris in the body: one byte every `interval`, never reaching its length."""
    def run(conn, req):
        _send(conn, head(200, {"Content-Length": str(length)}))
        try:
            while True:
                conn.sendall(b"{")
                time.sleep(interval)
        except OSError:
            pass
    return run


def silent() -> Behaviour:
    """Accept, read the request, never answer."""
    def run(conn, req):
        time.sleep(30)
    return run


def many_headers(count: int = 150) -> Behaviour:
    def run(conn, req):
        _send(conn, head(200, {**{f"X-H{i}": "v" for i in range(count)}, "Content-Length": "2"})
              + b"{}")
    return run


def long_header(size: int = 100_000) -> Behaviour:
    def run(conn, req):
        _send(conn, head(200, {"X-Long": "a" * size, "Content-Length": "2"}) + b"{}")
    return run


def redirect(location: str, status: int = 302) -> Behaviour:
    return answer(b"", status, {"Location": location})


def chunked(pieces: list[bytes], bad_size: Optional[bytes] = None) -> Behaviour:
    def run(conn, req):
        _send(conn, head(200, {"Transfer-Encoding": "chunked", "Connection": "close"}))
        for p in pieces:
            _send(conn, b"%x\r\n" % len(p) + p + b"\r\n")
        _send(conn, (bad_size or b"0") + b"\r\n\r\n")
    return run


def manifest_digest_mismatch(body: bytes) -> Behaviour:
    """HEAD announces the digest of other bytes; GET by that digest serves `body`."""
    claimed = "sha256:" + hashlib.sha256(body + b" ").hexdigest()

    def run(conn, req):
        hdrs = {"Docker-Content-Digest": claimed,
                "Content-Type": "application/vnd.oci.image.manifest.v1+json"}
        answer(body, 200, hdrs)(conn, req)
    return run


# ---- the server ---------------------------------------------------------------------------

class HostileServer:
    def __init__(self, routes: dict[str, Behaviour], host: str = "127.0.0.1"):
        self.routes = routes
        self.requests: list[Request] = []
        self._conns: list[socket.socket] = []
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    @property
    def address(self) -> str:
        return self.url.split("://", 1)[1]

    def __enter__(self) -> "HostileServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        for c in list(self._conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (socket.timeout, OSError):
                continue
            self._conns.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data and len(data) < 1 << 16:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            method, path, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            req = Request(method, path, headers)
            self.requests.append(req)
            route = max((p for p in self.routes if path.startswith(p)), key=len, default=None)
            if route is None:
                _send(conn, head(404, {"Content-Length": "0"}))
            else:
                self.routes[route](conn, req)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass
