"""The Hub's API as k3infra reads it, through the one HTTP client (k3infra/httpclient.py):
a revision's commit (`model_info`'s `sha`), a revision's file list (`list_repo_tree`,
recursive, page by page), and a small file's bytes (`/resolve`). The same URLs, query
and headers as huggingface_hub's HfApi (hf_api.py: /api/models/<repo>/revision/<rev>,
/api/models/<repo>/tree/<rev>?recursive=true&expand=false with `Link: rel="next"`
pages, /<repo>/resolve/<rev>/<path>, for a small file or, in `weights mirror`, a locked
file streamed to disk); huggingface_hub still builds the headers (its
user agent, and the token from HF_TOKEN or its token file), which it has in every
version the engine images carry.

Why not HfApi itself: its client reads an answer whole into memory, waits on a server
that trickles bytes for as long as each read keeps arriving, and writes a file as long
as the server sends it. Here each call is bounded (the client's deadline, the body caps
below, a file's listed size), and every value is checked before it is used: the commit
is 40 hex, paths follow the lock's rules, sizes are integers, LFS digests are 64 hex.
The token is bound to the Hub's origin: a redirect to a CDN never carries it.

Standard library plus huggingface_hub: runs in pods (k3weights) and on the operator's
machine (`k3infra pins`, `k3infra weights lock --hub`, `k3infra weights mirror`).
"""
from __future__ import annotations

import os
import re
from collections import namedtuple
from typing import Optional
from urllib.parse import quote

from . import tree

try:                       # in a pod: shipped beside this package's modules
    from .httpclient import HttpClient, HttpError, credential_for
except ImportError:        # on the operator's machine: the one copy, k3infra/httpclient.py
    from ..httpclient import HttpClient, HttpError, credential_for

INFO_MAX_BYTES = 16 << 20          # model_info: siblings of a large repo
PAGE_MAX_BYTES = 32 << 20          # one tree page (the Hub sends 1000 entries a page)
SMALL_FILE_MAX_BYTES = 64 << 20    # a non-LFS file (the Hub keeps files over 10 MB in LFS)
MAX_PAGES = 10_000
MAX_SIZE = 1 << 50                 # a file's size: 1 PiB
_HEX40 = re.compile(r"[0-9a-f]{40}")
_NEXT = re.compile(r'<([^>]*)>\s*;\s*rel="?next"?')

# One file of the tree listing: `lfs_sha256`/`lfs_size` None for a file kept in git.
HubFile = namedtuple("HubFile", "path size blob_id lfs_sha256 lfs_size")


class Hub:
    """The Hub (or a mirror: HF_ENDPOINT, k3:weights.hubEndpoint) through `client`."""

    def __init__(self, client: HttpClient, endpoint: Optional[str] = None, token=None):
        # Here, not at the top: huggingface_hub takes 0.25 s to import (python -X
        # importtime) and reads HF_* variables then; hub_environment() sets them first.
        from huggingface_hub import constants, utils

        self.client = client
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        client.allow_http(self.endpoint)        # the user named it, scheme included
        client.check_url(self.endpoint, "Hub endpoint")
        headers = {k.lower(): v for k, v in utils.build_hf_headers(token=token).items()}
        auth = headers.pop("authorization", None)
        self.headers = {k: v for k, v in headers.items() if k == "user-agent"}
        self.credential = credential_for(self.endpoint, "Authorization", auth) if auth else None

    def _get_json(self, url: str, what: str, body_max: int, repo: str, revision: str):
        try:
            return self.client.json(url, body_max=body_max, kind=what, headers=self.headers,
                                    credential=self.credential)
        except HttpError as exc:
            raise HubError(_refusal(repo, revision, exc)) from None

    def commit(self, repo: str, revision: str) -> str:
        """The 40-hex commit `revision` (a commit or a branch) names on the Hub today."""
        url = f"{self.endpoint}/api/models/{repo}/revision/{quote(revision, safe='')}"
        info, _ = self._get_json(url, "model info", INFO_MAX_BYTES, repo, revision)
        sha = info.get("sha") if isinstance(info, dict) else None
        if not isinstance(sha, str) or not _HEX40.fullmatch(sha):
            raise HubError(f"{repo}@{revision}: the Hub's answer names no 40-hex commit "
                           f"(sha = {str(sha)[:80]!r})")
        return sha

    def files(self, repo: str, revision: str) -> list[HubFile]:
        """Every file of the repo at `revision` (directories left out), checked."""
        url = (f"{self.endpoint}/api/models/{repo}/tree/{quote(revision, safe='')}"
               "?recursive=true&expand=false")
        out: list[HubFile] = []
        for _page in range(MAX_PAGES):
            items, resp = self._get_json(url, "tree listing", PAGE_MAX_BYTES, repo, revision)
            if not isinstance(items, list):
                raise HubError(f"{repo}@{revision}: the tree listing is not a list")
            out += [f for f in (_file(item, repo, revision) for item in items) if f is not None]
            nxt = _NEXT.search(resp.headers.get("link", ""))
            if not nxt:
                return out
            url = nxt.group(1)
        raise HubError(f"{repo}@{revision}: the tree listing ran past {MAX_PAGES} pages")

    def small_file(self, repo: str, revision: str, item: HubFile) -> bytes:
        """The bytes of a file kept in git, exactly its listed size."""
        if item.size > SMALL_FILE_MAX_BYTES:
            raise tree.LockError(f"{item.path}: listed as a {item.size}-byte file outside LFS; "
                                 f"at most {SMALL_FILE_MAX_BYTES} bytes are fetched to hash")
        return self._resolve(repo, revision, item.path, item.size, SMALL_FILE_MAX_BYTES).body

    def file(self, repo: str, revision: str, path: str, size: int, sha256: str, sink,
             seconds: Optional[float] = None) -> None:
        """A locked file's bytes into `sink` (`weights mirror`): never more than `size`,
        hashed as they arrive, refused unless exactly `size` bytes of sha256 `sha256`;
        `seconds`: this call's limit (the command's deadline still holds)."""
        self._resolve(repo, revision, path, size, size, sha256=sha256, sink=sink, seconds=seconds)

    def _resolve(self, repo: str, revision: str, path: str, size: int, body_max: int, *,
                 sha256: Optional[str] = None, sink=None, seconds: Optional[float] = None):
        """GET /<repo>/resolve/<revision>/<path>: the listed size exactly, from that commit."""
        url = f"{self.endpoint}/{repo}/resolve/{quote(revision, safe='')}/{quote(path)}"
        try:
            resp = self.client.request("GET", url, body_max=body_max, kind="file",
                                       expect_size=size, headers=self.headers,
                                       credential=self.credential, expect_sha256=sha256,
                                       sink=sink, seconds=seconds)
        except HttpError as exc:
            raise HubError(_refusal(repo, revision, exc)) from None     # the URL names the file
        commit = resp.headers.get("x-repo-commit")
        if commit is not None and commit != revision:
            raise tree.LockError(f"{path}: the Hub served it from commit {commit[:80]!r}, "
                                 f"not {revision}")
        return resp


class HubError(RuntimeError):
    """The Hub gave no usable answer; one line naming the repo, the revision and why."""


def _refusal(repo: str, revision: str, exc: HttpError) -> str:
    code = exc.headers.get("x-error-code", "")
    message = exc.headers.get("x-error-message", "")
    extra = f" ({'; '.join(x[:200] for x in (code, message) if x)})" if code or message else ""
    return f"{repo}@{revision}: {exc}{extra}"


def _file(item, repo: str, revision: str) -> Optional[HubFile]:
    where = f"{repo}@{revision}: tree entry"
    if not isinstance(item, dict) or item.get("type") not in ("file", "directory"):
        raise HubError(f"{where} {str(item)[:120]!r}: not a file or directory entry")
    if item["type"] == "directory":
        return None
    path = item.get("path")
    try:
        tree.check_path(path)
    except tree.LockError as exc:
        raise HubError(f"{where}: {exc}") from None
    size, blob = item.get("size"), item.get("oid")
    if not _count(size):
        raise HubError(f"{where} {path}: size {str(size)[:40]!r} is not a byte count")
    if not isinstance(blob, str) or not _HEX40.fullmatch(blob):
        raise HubError(f"{where} {path}: oid {str(blob)[:80]!r} is not a 40-hex git blob id")
    lfs = item.get("lfs")
    if lfs is None:
        return HubFile(path, size, blob, None, None)
    if not isinstance(lfs, dict) or not _count(lfs.get("size")):
        raise HubError(f"{where} {path}: lfs {str(lfs)[:120]!r} has no byte count")
    try:
        sha = tree.check_sha256(lfs.get("oid"), path)
    except tree.LockError as exc:
        raise HubError(f"{where}: lfs {exc}") from None
    return HubFile(path, size, blob, sha, lfs["size"])


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SIZE
