"""Real object-store servers on loopback for the weights store tests, the benchmark and the
node tier: each one started here, on a free port of 127.0.0.1 (or a given host), and
stopped whatever happens (a context manager; the child also dies with its parent:
PR_SET_PDEATHSIG).

- S3: versitygw's posix backend (tools/testbed/s3server, a Go part): objects are plain
  files under ROOT/<bucket>/<key>, so a test can tamper with one in place;
- GCS: fake-gcs-server (tools/testbed/fakegcs, a Go part). It serves the reads obstore
  makes (HEAD, ranged GETs) but not the XML API's object PUT that obstore uploads with
  (fsouza/fake-gcs-server v1.56.1 answers "invalid uploadType"), so objects are seeded
  through its JSON API here, and `mirror`'s upload into GCS is not exercised;
- Azure: Azurite (tools/azurite, npm, locked), the container created with a SharedKey
  request (obstore has no call for it).

Every client here is given credentials: without them obstore falls back to the cloud's
metadata service (169.254.169.254), which a test must never reach.
"""
from __future__ import annotations

import base64
import ctypes
import email.utils
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
S3_KEYS = {"AWS_ACCESS_KEY_ID": "k3test", "AWS_SECRET_ACCESS_KEY": "k3test-secret-0123456789"}
# Azurite's well-known development account (its documentation; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
BUCKET = "weights"


def testbed_binary(name: str, part: str) -> Optional[str]:
    """A Go part's binary: K3INFRA_TESTBED_BIN (make test/e2e), else the newest complete
    build of the part in the testbed cache."""
    bin_dir = os.environ.get("K3INFRA_TESTBED_BIN")
    if bin_dir and (Path(bin_dir) / name).is_file():
        return str(Path(bin_dir) / name)
    root = Path(os.environ.get("K3INFRA_TESTBED_CACHE", Path.home() / ".cache/k3infra/testbed"))
    builds = [p for p in root.glob(f"{part}-*/{name}") if (p.parent / ".complete").is_file()]
    return str(max(builds, key=lambda p: p.stat().st_mtime)) if builds else None


def azurite_binary() -> Optional[str]:
    """`azurite-blob`: K3INFRA_AZURITE_BIN (make test), else tools/azurite/install.sh's cache."""
    explicit = os.environ.get("K3INFRA_AZURITE_BIN")
    if explicit and (Path(explicit) / "azurite-blob").is_file():
        return str(Path(explicit) / "azurite-blob")
    root = Path(os.environ.get("K3INFRA_AZURITE_CACHE", Path.home() / ".cache/k3infra"))
    found = [p for p in root.glob("azurite-*/node_modules/.bin/azurite-blob")
             if (p.parents[2] / ".complete").is_file()]
    return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


@dataclass
class StoreServer:
    """One running server and what a client needs: the URL prefix of a bucket, the options
    (endpoint, plain HTTP) and the credentials as the pod's environment would hold them."""

    scheme: str
    root: Path
    host: str
    port: int
    argv: list
    env: dict = field(default_factory=dict)
    proc: Optional[subprocess.Popen] = None

    @property
    def endpoint(self) -> str:
        base = f"http://{self.host}:{self.port}"
        return f"{base}/{AZURITE_ACCOUNT}" if self.scheme == "az" else base

    def url(self, prefix: str = "models") -> str:
        where = f"{AZURITE_ACCOUNT}/{BUCKET}" if self.scheme == "az" else BUCKET
        return f"{self.scheme}://{where}" + (f"/{prefix}" if prefix else "")

    def client_env(self) -> dict:
        """The prefetch pod's environment for this store (k3weights.store reads it)."""
        return {"K3_STORE_ENDPOINT": self.endpoint, "K3_STORE_ALLOW_HTTP": "true",
                "K3_STORE_REGION": "us-east-1", **self.env}

    def options(self):
        from k3infra.weights.store import StoreOptions

        return StoreOptions(endpoint=self.endpoint, region="us-east-1", allow_http=True)

    def start(self, timeout: float = 60.0) -> "StoreServer":
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env={**os.environ, **self.server_env()},
                                     preexec_fn=_die_with_parent, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited {self.proc.returncode}: "
                                   f"{self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                socket.create_connection((self.host, self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError(f"{self.argv[0]} did not listen on {self.host}:{self.port} "
                               f"within {timeout:g} s")
        self.create_bucket()
        return self

    def server_env(self) -> dict:
        if self.scheme == "s3":
            return {"S3SERVER_ACCESS_KEY": S3_KEYS["AWS_ACCESS_KEY_ID"],
                    "S3SERVER_SECRET_KEY": S3_KEYS["AWS_SECRET_ACCESS_KEY"]}
        return {}

    def create_bucket(self) -> None:
        if self.scheme == "s3":
            (self.root / BUCKET).mkdir(parents=True, exist_ok=True)   # posix: a folder is a bucket
        elif self.scheme == "gs":
            _request("POST", f"http://{self.host}:{self.port}/storage/v1/b",
                     json.dumps({"name": BUCKET}).encode(), {"Content-Type": "application/json"})
        else:
            _azure_create_container(self.host, self.port, BUCKET)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self) -> "StoreServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- what tests do to the objects behind the client's back ----
    def object_file(self, key: str) -> Path:
        """S3 only: the file that holds an object (versitygw's posix backend)."""
        return self.root / BUCKET / key

    def seed(self, key: str, data: bytes) -> None:
        """GCS only: an object written through fake-gcs-server's JSON API."""
        from urllib.parse import quote

        _request("POST", f"http://{self.host}:{self.port}/upload/storage/v1/b/{BUCKET}/o"
                 f"?uploadType=media&name={quote(key, safe='')}", data,
                 {"Content-Type": "application/octet-stream"})


def s3_server(root: Path, host: str = "127.0.0.1", port: Optional[int] = None) -> StoreServer:
    binary = testbed_binary("s3server", "s3server")
    if binary is None:
        raise FileNotFoundError("s3server not built: tools/testbed/build.sh with "
                                "K3INFRA_TESTBED_PARTS=s3server (Go module proxy)")
    port = port or free_port(host)
    root.mkdir(parents=True, exist_ok=True)
    return StoreServer("s3", root, host, port, [binary, "-root", str(root), "-listen", f"{host}:{port}"],
                       env=dict(S3_KEYS))


def gcs_server(root: Path, host: str = "127.0.0.1", port: Optional[int] = None) -> StoreServer:
    binary = testbed_binary("fake-gcs-server", "fakegcs")
    if binary is None:
        raise FileNotFoundError("fake-gcs-server not built: tools/testbed/build.sh with "
                                "K3INFRA_TESTBED_PARTS=fakegcs (Go module proxy)")
    port = port or free_port(host)
    root.mkdir(parents=True, exist_ok=True)
    # A service account key with OAuth off and the emulator as base URL (object_store's
    # documented way to reach an emulator); its token URI is a closed loopback port.
    key = json.dumps({"gcs_base_url": f"http://{host}:{port}", "disable_oauth": True,
                      "client_email": "", "private_key": "", "private_key_id": "",
                      "token_uri": "http://127.0.0.1:1/token"})
    return StoreServer("gs", root, host, port,
                       [binary, "-scheme", "http", "-host", host, "-port", str(port),
                        "-backend", "filesystem", "-filesystem-root", str(root),
                        "-public-host", f"{host}:{port}", "-log-level", "error"],
                       env={"GOOGLE_SERVICE_ACCOUNT_KEY": key})


def azure_server(root: Path, host: str = "127.0.0.1", port: Optional[int] = None) -> StoreServer:
    binary = azurite_binary()
    if binary is None:
        raise FileNotFoundError("Azurite not installed: tools/azurite/install.sh (npm registry)")
    port = port or free_port(host)
    root.mkdir(parents=True, exist_ok=True)
    return StoreServer("az", root, host, port,
                       [binary, "--blobHost", host, "--blobPort", str(port), "--location", str(root),
                        "--silent", "--skipApiVersionCheck", "--disableProductStyleUrl"],
                       env={"AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY})


SERVERS = {"s3": s3_server, "gs": gcs_server, "az": azure_server}


def _request(method: str, url: str, data: Optional[bytes], headers: dict) -> bytes:
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:      # noqa: S310 (loopback)
        return resp.read()


def _azure_create_container(host: str, port: int, container: str) -> None:
    """Create Container with a SharedKey signature (Azure Storage's REST authorization)."""
    date = email.utils.formatdate(usegmt=True)
    headers = {"x-ms-date": date, "x-ms-version": "2021-08-06"}
    canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
    resource = f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{container}\nrestype:container"
    # VERB, Content-Encoding, -Language, -Length (empty for 0), -MD5, -Type, Date,
    # If-Modified-Since, If-Match, If-None-Match, If-Unmodified-Since, Range.
    kind = "application/octet-stream"            # urllib would add a form type otherwise
    to_sign = f"PUT\n\n\n\n\n{kind}\n" + "\n" * 6 + canonical_headers + resource
    headers["Content-Type"] = kind
    sig = base64.b64encode(hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(),
                                    hashlib.sha256).digest()).decode()
    headers["Authorization"] = f"SharedKey {AZURITE_ACCOUNT}:{sig}"
    _request("PUT", f"http://{host}:{port}/{AZURITE_ACCOUNT}/{container}?restype=container",
             b"", headers)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
