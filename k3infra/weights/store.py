"""The weights' object store: the user's own bucket as the prefetch's origin instead of
the Hub (standard library, plus `obstore` for the transfers: runs in pods).

A store is named by a URL, one scheme per provider:

    s3://BUCKET[/PREFIX]              the S3 API: AWS, or any S3-compatible endpoint
    gs://BUCKET[/PREFIX]              Google Cloud Storage
    az://ACCOUNT/CONTAINER[/PREFIX]   Azure Blob Storage

Under the prefix the layout is the weights volume's own (k3infra/weights/manifests.py):

    <prefix>/<owner>--<name>/<revision>/<path>        every file of the locked tree
    <prefix>/<owner>--<name>/<revision>.lock.json     its lock, written last by the mirror

so a revision change needs no new URL, and `k3infra weights mirror` and the prefetch agree
on every key without being told. Nothing read from a store is trusted: every byte is
hashed against the lock as it is written (prefetch.py), and the lock itself is held to
the digest the stack pins (check-lock.sh) before a shard is fetched.

The client is `obstore` (Rust's object_store): one package for the three providers, with
each provider's own credential chain (environment variables, IRSA and EKS Pod Identity
token files, GKE's metadata server, Azure workload identity's federated token), parallel
ranged GETs that release the interpreter lock, and retries with backoff. Chosen by
measurement (benchmarks/store_bench.py, docs/weights.md). Credentials are never passed
here: obstore reads them from the environment, which the pod fills from a Kubernetes
Secret or the cloud's workload identity. What this module adds:

- the URL grammar and each provider's naming rules, so a bad URL is one line before
  anything is created (the stack config checks the same rules at render time);
- `read_ordered`: parallel ranged reads of one object, handed back in order with a
  bounded window, so the caller writes and hashes a growing prefix (resume = its size);
- the lock beside the tree.
"""
from __future__ import annotations

import ipaddress
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Optional
from urllib.parse import urlsplit

from . import tree

SCHEMES = {"s3": "the S3 API", "gs": "Google Cloud Storage", "az": "Azure Blob Storage"}
ACCEPTED_URL = ("s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX] or az://ACCOUNT/CONTAINER[/PREFIX]")
PREFIX_MAX = 512            # keys stay far below the providers' 1024-byte limit
LOCK_SUFFIX = ".lock.json"

# Pod environment (k3infra/weights/manifests.py sets them from k3:weights.store).
ENDPOINT_ENV = "K3_STORE_ENDPOINT"
REGION_ENV = "K3_STORE_REGION"
ALLOW_HTTP_ENV = "K3_STORE_ALLOW_HTTP"
VIRTUAL_HOSTED_ENV = "K3_STORE_VIRTUAL_HOSTED"
PART_BYTES_ENV = "K3_STORE_PART_BYTES"
PARTS_ENV = "K3_STORE_PARTS_PER_FILE"
# One ranged GET per part, several parts of a file in flight: object stores serve one
# connection at a fraction of a node's link (S3 documents ~100 MB/s per request stream),
# so a file's bytes come over several connections. Memory is bounded by
# download workers x parts in flight x part size (8 x 8 x 16 MiB = 1 GiB by default).
PART_BYTES = 16 << 20
PARTS_IN_FLIGHT = 8
# A ranged GET of one part (16 MiB: 16 s at 1 MB/s) must finish within this (obstore
# retries it with backoff); the prefetch's stall watchdog restarts a transfer that stops
# growing sooner, and an abandoned GET ends within this at the latest.
PART_TIMEOUT = "120s"
CONNECT_TIMEOUT = "30s"


class StoreError(ValueError):
    """A store URL or option that the provider would refuse: one line, never a traceback."""


def is_store_url(text: str) -> bool:
    return text.split("://", 1)[0] in SCHEMES and "://" in text


# ---- names each provider accepts ------------------------------------------------------

_S3_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_S3_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def _ip_like(name: str) -> bool:
    try:
        ipaddress.IPv4Address(name)
        return True
    except ValueError:
        return False


def s3_bucket_problem(name: str, aws: bool) -> Optional[str]:
    """AWS's rules for general purpose bucket names (an S3-compatible endpoint gets the
    same rules less AWS's reserved prefixes and suffixes)."""
    if not 3 <= len(name) <= 63:
        return "must be 3 to 63 characters"
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*[a-z0-9]", name):
        return ("must be lowercase letters, digits, '.' and '-', starting and ending with a "
                "letter or digit")
    if ".." in name:
        return "must not hold two adjacent periods"
    if _ip_like(name):
        return "must not be an IP address"
    if aws and name.startswith(_S3_RESERVED_PREFIXES):
        return f"must not start with {', '.join(_S3_RESERVED_PREFIXES)} (reserved by AWS)"
    if aws and name.endswith(_S3_RESERVED_SUFFIXES):
        return f"must not end with {', '.join(_S3_RESERVED_SUFFIXES)} (reserved by AWS)"
    return None


def gcs_bucket_problem(name: str) -> Optional[str]:
    """Google Cloud Storage's bucket naming rules."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*[a-z0-9]", name):
        return ("must be lowercase letters, digits, '-', '_' and '.', starting and ending with "
                "a letter or digit")
    limit = 222 if "." in name else 63
    if not 3 <= len(name) <= limit or any(len(p) > 63 for p in name.split(".")):
        return ("must be 3 to 63 characters (222 with dots, each dot-separated part at most 63)")
    if _ip_like(name):
        return "must not be an IP address"
    if name.startswith("goog") or re.search(r"g[o0]{2}g(l|1)e", name):
        return "must not start with 'goog' or contain 'google' (reserved by Google)"
    return None


def azure_account_problem(name: str) -> Optional[str]:
    if not re.fullmatch(r"[a-z0-9]{3,24}", name):
        return "must be 3 to 24 lowercase letters and digits (an Azure storage account)"
    return None


def azure_container_problem(name: str) -> Optional[str]:
    if not 3 <= len(name) <= 63 or not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name):
        return ("must be 3 to 63 lowercase letters, digits and single '-' between them, "
                "starting and ending with a letter or digit (an Azure container)")
    return None


def prefix_problem(prefix: str) -> Optional[str]:
    if len(prefix) > PREFIX_MAX:
        return f"must be at most {PREFIX_MAX} characters"
    for part in prefix.split("/"):
        if part in ("", ".", ".."):
            return "must not hold an empty, '.' or '..' component"
        if "\\" in part or any(ord(c) < 0x20 or ord(c) == 0x7F for c in part):
            return "must not hold a backslash or a control character"
    return None


@dataclass(frozen=True)
class StoreUrl:
    """A parsed store URL: scheme, bucket (a container for az), account (az) and prefix."""

    scheme: str
    bucket: str
    prefix: str = ""
    account: Optional[str] = None

    def __str__(self) -> str:
        where = f"{self.account}/{self.bucket}" if self.account else self.bucket
        return f"{self.scheme}://{where}" + (f"/{self.prefix}" if self.prefix else "")

    def tree_key(self, repo: str, revision: str, path: str = "") -> str:
        """The key of a file of the tree (or the tree's own prefix), relative to the URL."""
        base = f"{repo.replace('/', '--')}/{revision}"
        return f"{base}/{path}" if path else base

    def lock_key(self, repo: str, revision: str) -> str:
        return f"{repo.replace('/', '--')}/{revision}{LOCK_SUFFIX}"

    def where(self, key: str) -> str:
        """The full URL of a key, for messages."""
        return f"{self}/{key}"


def parse_store_url(text: str, *, aws: bool = True) -> StoreUrl:
    """`s3://bucket/models` -> StoreUrl; StoreError saying what is wrong and what is
    accepted (the caller names the key or argument and the value).
    `aws`: an S3 URL without a custom endpoint (AWS's reserved bucket names apply)."""
    if not isinstance(text, str) or "://" not in text:
        raise StoreError(f"accepted {ACCEPTED_URL}")
    scheme, rest = text.split("://", 1)
    if scheme not in SCHEMES:
        raise StoreError(f"unknown scheme {scheme!r}; accepted {ACCEPTED_URL}")
    if any(c in rest for c in "?#@") or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in rest):
        raise StoreError(f"a store URL holds no query, fragment, credentials, space "
                         f"or control character; accepted {ACCEPTED_URL}")
    parts = rest.rstrip("/").split("/")
    account = None
    if scheme == "az":
        if len(parts) < 2:
            raise StoreError("accepted az://ACCOUNT/CONTAINER[/PREFIX]")
        account = parts.pop(0)
        problem = azure_account_problem(account)
        if problem:
            raise StoreError(f"account {account!r} {problem}")
    bucket, prefix = parts[0], "/".join(parts[1:])
    problem = {"s3": lambda: s3_bucket_problem(bucket, aws), "gs": lambda: gcs_bucket_problem(bucket),
               "az": lambda: azure_container_problem(bucket)}[scheme]()
    if problem:
        what = "container" if scheme == "az" else "bucket"
        raise StoreError(f"{what} {bucket!r} {problem} ({SCHEMES[scheme]})")
    if prefix:
        problem = prefix_problem(prefix)
        if problem:
            raise StoreError(f"prefix {prefix!r} {problem}")
    return StoreUrl(scheme=scheme, bucket=bucket, prefix=prefix, account=account)


def endpoint_problem(endpoint: str, allow_http: bool) -> Optional[str]:
    """An endpoint is scheme://host[:port][/path]: no credentials in it (they come from a
    Secret or workload identity), plain HTTP only when stated."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http(s)://host[:port] URL"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return ("must not carry credentials (user:password@): they come from "
                "k3:weights.store.credentialsSecret or workload identity")
    if parts.query or parts.fragment:
        return "must not carry a query or fragment"
    if parts.scheme == "http" and not allow_http:
        return ("is plain HTTP: set k3:weights.store.allowHttp true to choose that (the "
                "bytes are still hashed against the lock; the credentials travel in the clear)")
    return None


# ---- the client (obstore) -----------------------------------------------------------------

@dataclass(frozen=True)
class StoreOptions:
    endpoint: Optional[str] = None
    region: Optional[str] = None
    allow_http: bool = False
    # S3 only: the bucket in the host name (https://BUCKET.example.com, the endpoint then
    # names the bucket's own host), for stores that refuse path-style requests.
    virtual_hosted: bool = False

    @classmethod
    def from_env(cls) -> "StoreOptions":
        return cls(endpoint=os.environ.get(ENDPOINT_ENV) or None,
                   region=os.environ.get(REGION_ENV) or None,
                   allow_http=os.environ.get(ALLOW_HTTP_ENV, "").lower() == "true",
                   virtual_hosted=os.environ.get(VIRTUAL_HOSTED_ENV, "").lower() == "true")


def virtual_hosted_problem(url: "StoreUrl", endpoint: Optional[str]) -> Optional[str]:
    """Virtual-hosted style names the bucket in the endpoint's host: say so before a
    request goes to another bucket's host."""
    if url.scheme != "s3":
        return "is for s3:// stores only"
    host = urlsplit(endpoint).hostname if endpoint else None
    if not host or not host.startswith(f"{url.bucket}."):
        return (f"needs an endpoint whose host starts with the bucket, "
                f"https://{url.bucket}.<store host>")
    return None


def open_store(url: StoreUrl, options: Optional[StoreOptions] = None):
    """An obstore store rooted at the URL's prefix. Credentials: the provider's own chain
    (environment, token files, metadata servers), read by obstore."""
    opts = options or StoreOptions.from_env()
    if opts.endpoint:
        problem = endpoint_problem(opts.endpoint, opts.allow_http)
        if problem:
            raise StoreError(f"endpoint {opts.endpoint!r} {problem}")
    try:
        # Here and in _obstore, not at the top: obstore is optional (the `store` extra;
        # a released vLLM image lacks it), needed only by pods that read a store.
        from obstore.store import AzureStore, GCSStore, S3Store
    except ImportError:
        raise StoreError("obstore is not installed in this image: k3:weights.store needs it (the "
                         "shipped recipe's runtime.lock carries it; a released vLLM image does "
                         "not: docs/weights.md, from your own object store)") from None

    # The store client's bounds, set here only: each request within PART_TIMEOUT (a part
    # of a ranged read, of a multipart upload), its connect within CONNECT_TIMEOUT; plain
    # HTTP only to an endpoint the user named with http:// and allowed (allowHttp).
    plain = opts.allow_http and bool(opts.endpoint) and urlsplit(opts.endpoint).scheme == "http"
    client = {"allow_http": plain, "timeout": PART_TIMEOUT, "connect_timeout": CONNECT_TIMEOUT}
    prefix = url.prefix or None
    if url.scheme == "s3":
        extra = {"endpoint": opts.endpoint} if opts.endpoint else {}
        if opts.region:
            extra["region"] = opts.region
        if opts.virtual_hosted:
            problem = virtual_hosted_problem(url, opts.endpoint)
            if problem:
                raise StoreError(f"virtual-hosted style {problem}")
            extra["virtual_hosted_style_request"] = True
        return S3Store(url.bucket, prefix=prefix, client_options=client, **extra)
    if url.scheme == "gs":
        extra = {"base_url": opts.endpoint} if opts.endpoint else {}
        return GCSStore(url.bucket, prefix=prefix, client_options=client, **extra)
    extra = {"endpoint": opts.endpoint} if opts.endpoint else {}
    return AzureStore(url.bucket, prefix=prefix, account_name=url.account,
                      client_options=client, **extra)


def _knob(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise StoreError(f"{name}={text!r}: must be a positive integer") from None
    if value < 1:
        raise StoreError(f"{name}={text!r}: must be a positive integer")
    return value


class ObjectReader:
    """Ranged reads of objects of one store: a file's parts fetched over several
    connections and handed back in order (bounded: parts in flight x part size per file)."""

    def __init__(self, url: StoreUrl, store, *, files: int = 8, parts: Optional[int] = None):
        self.url, self.store = url, store
        self.part_bytes = _knob(PART_BYTES_ENV, PART_BYTES)
        self.parts = parts or _knob(PARTS_ENV, PARTS_IN_FLIGHT)
        self._pool = ThreadPoolExecutor(max_workers=max(1, files) * self.parts,
                                        thread_name_prefix="k3-store")

    def size(self, key: str) -> int:
        return int(_obstore().head(self.store, key)["size"])

    def read_ordered(self, key: str, start: int, end: int) -> Iterator[memoryview]:
        """Bytes [start, end) of `key`, in order, as buffers of at most part_bytes; up to
        `parts` ranged GETs in flight. A short or failed part raises (the caller resumes
        from what it wrote)."""
        obstore = _obstore()

        def get(lo: int, hi: int):
            data = obstore.get_range(self.store, key, start=lo, end=hi)
            if len(data) != hi - lo:
                raise OSError(f"{self.url.where(key)}: bytes {lo}-{hi - 1}: got {len(data)} bytes")
            return data

        bounds = [(lo, min(lo + self.part_bytes, end)) for lo in range(start, end, self.part_bytes)]
        inflight: list = []
        nxt = 0
        try:
            while nxt < len(bounds) or inflight:
                while nxt < len(bounds) and len(inflight) < self.parts:
                    inflight.append(self._pool.submit(get, *bounds[nxt]))
                    nxt += 1
                yield memoryview(inflight.pop(0).result())
        finally:
            for fut in inflight:
                fut.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _obstore():
    """The obstore module, imported once a store is used (see open_store)."""
    import obstore

    return obstore


def fetch_lock(url: StoreUrl, repo: str, revision: str, store=None) -> tree.Lock:
    """The lock the mirror wrote beside the tree. Not trusted either: parsed (its digest
    recomputed from its file list), held to the pinned repo and revision here and to the
    pinned digest by check-lock.sh before a single shard is fetched."""
    key = url.lock_key(repo, revision)
    store = store if store is not None else open_store(url)
    # One byte past the bound at most: a huge object is refused without being read whole.
    raw = bytes(_obstore().get_range(store, key, start=0, end=tree.LOCK_MAX_BYTES + 1))
    return tree.parse_served_lock(raw, url.where(key), repo, revision, tree.LOCK_MAX_BYTES)
