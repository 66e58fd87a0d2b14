"""A loopback stand-in for the Hugging Face Hub: the endpoints huggingface_hub 2.4.0
calls for `model_info`, `list_repo_tree`, `get_hf_file_metadata` (HEAD /resolve) and
`http_get` / `hf_hub_download` (GET /resolve, then the CDN), for one generated repo.

Read from the installed client (huggingface_hub/file_download.py, hf_api.py,
utils/_http.py):
- HEAD /{repo}/resolve/{rev}/{path}: metadata from X-Repo-Commit, X-Linked-Etag or ETag,
  X-Linked-Size or Content-Length; redirects are followed only on the same origin, so an
  LFS file answers 302 to the "CDN" on another loopback address (127.0.0.2), as the Hub
  answers with a signed CDN URL, and the metadata rides on the 302 itself;
- GET on the CDN honours `Range: bytes=N-` with 206 + Content-Range (resume);
- GET /api/models/{repo}/revision/{rev} (model_info: id, sha, siblings);
- GET /api/models/{repo}/tree/{rev}?recursive=... (list_repo_tree: type, oid, size, path,
  lfs {oid, size, pointerSize}); one page, no Link header;
- errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound).
No X-Xet-* header is sent unless `advertise_xet` (then the client must run with Xet
disabled: there is no CAS server here), so the client stays on plain HTTP.

Faults, for the tests: drop the connection once after N bytes of a file, stall a file
after N bytes until released (to kill the client mid-file; every GET, or only the next
one), serve a corrupt byte (once or always); kill() the whole server (listening sockets
and open connections).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import parse_qs, quote, unquote, urlsplit

CDN_HOST = "127.0.0.2"
_SLICE = 1 << 20          # body write size (and pacing granularity)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_repo(shards: int = 4, shard_size: int = 256 * 1024, seed: int = 3) -> dict[str, bytes]:
    """A small model repo: random safetensors shards (LFS) plus small text files,
    one of them in a subdirectory."""
    import random

    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for i, name in enumerate(names):
        files[name] = rng.randbytes(shard_size + 4096 * i)
    files["model.safetensors.index.json"] = json.dumps(
        {"weight_map": {f"w{i}": n for i, n in enumerate(names)}}, indent=1).encode()
    files["config.json"] = b'{"architectures": ["KimiK3ForCausalLM"]}\n'
    files["README.md"] = b"# generated test repo\n"
    files[".gitattributes"] = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    files["original/params.json"] = b'{"dim": 8}\n'
    return files


@dataclass
class Hit:
    role: str            # "hub" or "cdn"
    method: str
    path: str            # repo path of the file, or the API path
    range: Optional[str]
    auth: bool
    sent: int = 0


@dataclass
class Faults:
    drop_once: dict = field(default_factory=dict)       # path -> bytes sent before dropping
    stall: dict = field(default_factory=dict)           # path -> bytes sent before stalling
    stall_once: dict = field(default_factory=dict)      # the same, for the next GET only
    corrupt_once: set = field(default_factory=set)
    corrupt_always: set = field(default_factory=set)
    released: threading.Event = field(default_factory=threading.Event)


class LoopbackHub:
    def __init__(self, repo: str, files: dict[str, bytes], commit: Optional[str] = None,
                 link_bytes_per_s: Optional[float] = None, advertise_xet: bool = False,
                 redirect_lfs: bool = True, host: str = "127.0.0.1", cdn_host: Optional[str] = None,
                 port: int = 0):
        self.repo = repo
        # host: where the Hub listens (a network namespace's own address, for pods); the
        # CDN on another loopback address, or on the same host at another port (another
        # origin all the same: the client does not follow the redirect itself).
        self.host, self.port = host, port
        self.cdn_host = cdn_host or (CDN_HOST if host == "127.0.0.1" else host)
        # redirect_lfs=False: LFS files are served at /resolve directly (no CDN hop), as an
        # in-cluster source (nginx in the Hub's layout) serves them.
        self.redirect_lfs = redirect_lfs
        # advertise_xet: LFS files say they are Xet-backed (X-Xet-Hash, refresh route) as
        # on the real Hub; there is no CAS server here, so clients must run with Xet off.
        self.advertise_xet = advertise_xet
        # Optional shared pace for all file bodies: a network link of this bandwidth
        # (benchmarks/weights_bench.py); None sends as fast as loopback goes.
        self.link_bytes_per_s = link_bytes_per_s
        self._link_free_at = 0.0
        self.files = dict(files)
        self.commit = commit or hashlib.sha1(repr(sorted(files)).encode()).hexdigest()
        self.faults = Faults()
        self.hits: list[Hit] = []
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self._conns: set = set()               # open client connections (kill() cuts them)
        self.stalled = threading.Event()       # set once a stalled file has sent its bytes

    # ---- what the tests read ----
    @property
    def endpoint(self) -> str:
        host, port = self._servers[0].server_address[:2]
        return f"http://{host}:{port}"

    @property
    def cdn(self) -> str:
        host, port = self._servers[1].server_address[:2]
        return f"http://{host}:{port}"

    def lfs(self, path: str) -> bool:
        return path.endswith(".safetensors")

    def gets(self, path: str) -> list[Hit]:
        """GETs that carried the bytes of `path` (CDN for LFS, the Hub otherwise)."""
        with self._lock:
            return [h for h in self.hits if h.method == "GET" and h.path == path
                    and (h.role == "cdn" or not self.lfs(path) or not self.redirect_lfs)]

    def body_bytes(self) -> int:
        """Every file byte this stand-in sent (Hub and CDN), all files."""
        with self._lock:
            return sum(h.sent for h in self.hits)

    def bytes_sent(self, path: str) -> int:
        return sum(h.sent for h in self.gets(path))

    def clear_hits(self) -> None:
        with self._lock:
            self.hits.clear()

    # ---- lifecycle ----
    def start(self) -> "LoopbackHub":
        for host, port, role in ((self.host, self.port, "hub"), (self.cdn_host, 0, "cdn")):
            handler = type(f"{role}Handler", (_Handler,), {"hub": self, "role": role})
            server = ThreadingHTTPServer((host, port), handler)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            self._servers.append(server)
        return self

    def stop(self) -> None:
        self.faults.released.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def kill(self) -> None:
        """The server dies: no new connection is accepted and every open one is cut
        (keep-alive connections included, which stop() alone leaves serving)."""
        self.stop()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "LoopbackHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- what the handler needs ----
    def pace(self, nbytes: int) -> None:
        """Wait for this slice's turn on the shared link (no-op when unthrottled)."""
        if not self.link_bytes_per_s:
            return
        with self._lock:
            start = max(time.monotonic(), self._link_free_at)
            self._link_free_at = start + nbytes / self.link_bytes_per_s
        delay = start - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def record(self, hit: Hit) -> Hit:
        with self._lock:
            self.hits.append(hit)
        return hit

    def content(self, path: str) -> bytes:
        data = self.files[path]
        with self._lock:
            corrupt = path in self.faults.corrupt_always or path in self.faults.corrupt_once
            self.faults.corrupt_once.discard(path)
        if corrupt:
            flipped = bytearray(data)
            flipped[len(flipped) // 2] ^= 0xFF
            return bytes(flipped)
        return data

    def tree_entries(self) -> list[dict]:
        dirs = sorted({"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)})
        out = [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
               for d in dirs]
        for path in sorted(self.files):
            data = self.files[path]
            entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
            if self.lfs(path):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": 134}
            out.append(entry)
        return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: LoopbackHub
    role: str

    def log_message(self, *args) -> None:  # quiet test output
        pass

    def setup(self) -> None:
        super().setup()
        with self.hub._lock:
            self.hub._conns.add(self.connection)

    def finish(self) -> None:
        with self.hub._lock:
            self.hub._conns.discard(self.connection)
        super().finish()

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # ---- routing ----
    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        hub = self.hub
        if self.role == "cdn":
            m = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
            name = parse_qs(url.query).get("name", [""])[0]
            if not m or name not in hub.files:
                return self._error(404, "EntryNotFound")
            hit = hub.record(Hit("cdn", self.command, name, self.headers.get("Range"),
                                 "authorization" in {k.lower() for k in self.headers}))
            return self._body(name, hit, head, {"ETag": f'"{m.group(1)}"'})
        auth = "authorization" in {k.lower() for k in self.headers}
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        if m:
            hub.record(Hit("hub", self.command, path, None, auth))
            if not self._repo_rev(m.group(1), m.group(2)):
                return
            return self._json({"id": hub.repo, "sha": hub.commit, "private": False,
                               "siblings": [{"rfilename": p} for p in sorted(hub.files)]}, head)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
        if m:
            hub.record(Hit("hub", self.command, path, None, auth))
            if not self._repo_rev(m.group(1), m.group(2)):
                return
            return self._json(hub.tree_entries(), head)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            repo, rev, name = m.groups()
            hit = hub.record(Hit("hub", self.command, name, self.headers.get("Range"), auth))
            if not self._repo_rev(repo, rev):
                return
            if name not in hub.files:
                return self._error(404, "EntryNotFound", {"X-Repo-Commit": hub.commit})
            data = hub.files[name]
            if hub.lfs(name) and hub.redirect_lfs:
                sha = hashlib.sha256(data).hexdigest()
                location = f"{hub.cdn}/cdn/{sha}?name={quote(name)}"
                self.send_response(302)
                for k, v in {"Location": location, "X-Repo-Commit": hub.commit,
                             "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                             "ETag": f'"{git_blob_id(data)}"', "Content-Length": "0"}.items():
                    self.send_header(k, v)
                if hub.advertise_xet:
                    self.send_header("X-Xet-Hash", hashlib.sha256(b"xet" + data).hexdigest())
                    self.send_header("X-Xet-Refresh-Route",
                                     f"{hub.endpoint}/api/models/{hub.repo}/xet-read-token/{hub.commit}")
                self.end_headers()
                return
            return self._body(name, hit, head, {"X-Repo-Commit": hub.commit,
                                                "ETag": f'"{git_blob_id(data)}"'})
        return self._error(404, "RepoNotFound")

    def _repo_rev(self, repo: str, rev: str) -> bool:
        if repo != self.hub.repo:
            self._error(401, "RepoNotFound")
            return False
        if unquote(rev) not in (self.hub.commit, "main"):
            self._error(404, "RevisionNotFound")
            return False
        return True

    # ---- responses ----
    def _error(self, status: int, code: str, extra: Optional[dict] = None) -> None:
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj, head: bool) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _body(self, name: str, hit: Hit, head: bool, headers: dict) -> None:
        hub = self.hub
        data = hub.files[name] if head else hub.content(name)
        start = 0
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-", rng.strip())
            if not m or int(m.group(1)) >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(m.group(1))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if head:
            return
        body = memoryview(data)[start:]
        faults = hub.faults
        with hub._lock:
            drop = faults.drop_once.pop(name, None)
            stall = faults.stall.get(name)
            if stall is None and drop is None:
                stall = faults.stall_once.pop(name, None)
        cut = drop if drop is not None else stall
        if cut is not None and cut < len(body):
            self.wfile.write(body[:cut])
            self.wfile.flush()
            hit.sent += cut
            if stall is not None and drop is None:
                hub.stalled.set()
                faults.released.wait(timeout=60)
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        try:
            for offset in range(0, len(body), _SLICE):
                piece = body[offset:offset + _SLICE]
                hub.pace(len(piece))
                self.wfile.write(piece)
                hit.sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass


def read_tree(model_dir) -> dict[str, bytes]:
    """A local model directory as the Hub's file map (relative POSIX paths; hidden files
    and huggingface_hub's local-dir metadata left out, as they are not in the repo)."""
    from pathlib import Path

    root = Path(model_dir)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}


def tree_commit(files: dict[str, bytes]) -> str:
    """A 40-hex revision that changes with any file's content (like a git commit does)."""
    return hashlib.sha1("".join(f"{p}\0{git_blob_id(d)}\n" for p, d in sorted(files.items()))
                        .encode()).hexdigest()


def serve(model_dir, repo: str, revision: Optional[str] = None, host: str = "127.0.0.1",
          port: int = 0, **kwargs) -> LoopbackHub:
    """A started Hub serving the files of model_dir as `repo` at a 40-hex revision
    (default: tree_commit of the files). Stop it with .stop() (or use it as a context)."""
    files = read_tree(model_dir)
    revision = revision or tree_commit(files)
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        raise ValueError(f"revision {revision!r}: a Hub revision here is a 40-hex commit")
    return LoopbackHub(repo, files, commit=revision, host=host, port=port, **kwargs).start()


def environment(hub: LoopbackHub, home: str, token: Optional[str] = None) -> dict:
    """Environment for a client process pointed at the loopback Hub."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    direct = ",".join(dict.fromkeys(["127.0.0.1", "127.0.0.2", hub.host, hub.cdn_host]))
    env.update({"HF_ENDPOINT": hub.endpoint, "HF_HOME": home,
                "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": direct, "no_proxy": direct})
    if token:
        env["HF_TOKEN"] = token
    return env
