"""Where the prefetch takes bytes from: the Hub, the user's object store, or an in-cluster
source of verified bytes, tried in order per file (standard library plus huggingface_hub,
and obstore for a store: runs in pods).

A source list is a comma-separated string (`K3_WEIGHTS_SOURCES`, `prefetch --sources`):
`hub` (the Hugging Face Hub: HF_ENDPOINT, HF_TOKEN), an object store's URL
(`s3://bucket/prefix`, `gs://...`, `az://...`: k3weights.store, its own fetcher in
prefetch.py) or the base URL of an in-cluster source
(`http://kimi-k3-weights-source-0:8080`). An in-cluster source is nginx serving a
verified copy read-only in the Hub's URL layout (`/<repo>/resolve/<revision>/<path>`,
`X-Repo-Commit`, Range), so the very same huggingface_hub download path (`_Fetcher`: HEAD,
then `http_get` with `Range` into the resumable partial file) runs against it, with
another endpoint and **no token** (the HF token never leaves for the cluster).

Nothing a source sends is trusted: every file is hashed against the lock as it lands
(prefetch.py). Per file:

- a source that fails (refused connection, dropped mid-file, 404, a wrong revision), or
  whose transfer the prefetch's stall watchdog abandoned (a new call for a file whose
  previous call still runs), hands the file to the next source, which resumes the same partial file with `Range` (the
  partial file is named by the lock's sha256, so bytes of one file are interchangeable
  between sources; a wrong one among them fails the hash below);
- a file whose bytes fail the lock is deleted; its next download starts at the source
  after the last one that contributed bytes to it (the last source is retried, as a
  hub-only prefetch always did), and the event is logged and counted
  (`PrefetchReport.refused_by_lock`, per source in `PrefetchReport.sources`).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional
from urllib.parse import urlsplit

from . import store, tree
from .tree import FileEntry, Lock

try:                       # in a pod: shipped beside this package's modules
    from .httpclient import Deadline, HttpClient, HttpError
    from .podcommon import CREDENTIALS_IN_FLAG, url_credentials
except ImportError:        # on the operator's machine: the one copy, k3infra/httpclient.py
    from ..httpclient import Deadline, HttpClient, HttpError
    from ..podcommon import CREDENTIALS_IN_FLAG, url_credentials

HUB = "hub"
# A source that failed this many downloads in a row (no success between) is skipped for
# the rest of the run: a dead source must not cost every remaining file its retries.
DOWN_AFTER_FAILURES = 3
# Where a source serves the lock it holds (beside the tree on its volume).
LOCK_ROUTE = "/k3/lock/{revision}.json"
LOCK_BYTES_MAX = 64 << 20
# `lock --hub`: every call of the command ends by this deadline (--timeout), each call
# within CALL_SECONDS (a slow source or Hub ends there, httpclient.py).
LOCK_DEADLINE_SECONDS = 900.0
CALL_SECONDS = 60.0

Emit = Callable[[str], None]


def parse_sources(text: Optional[str]) -> list[str]:
    """`hub,http://a:8080` -> ["hub", "http://a:8080"]; an empty or missing list is the
    Hub alone. ValueError names the value and what is accepted."""
    masked = url_credentials(text or "")
    if masked is not None:        # first: every message below shows the value
        raise ValueError(f"sources {masked[:200]!r} {CREDENTIALS_IN_FLAG}")
    items = [s.strip().rstrip("/") for s in (text or "").split(",") if s.strip()]
    if not items:
        return [HUB]
    for s in items:
        if store.is_store_url(s):
            try:
                store.parse_store_url(s, aws=not store.StoreOptions.from_env().endpoint)
            except store.StoreError as exc:
                raise ValueError(f"source {s[:200]!r}: {exc}") from None
        elif s != HUB and not s.startswith(("http://", "https://")):
            raise ValueError(f"source {s[:200]!r}: accepted 'hub', an http(s):// base URL of an "
                             f"in-cluster source, or an object store ({store.ACCEPTED_URL})")
        elif s != HUB and "@" in urlsplit(s).netloc:
            raise ValueError(f"source {urlsplit(s).scheme}://...@{urlsplit(s).hostname}: a source "
                             "URL carries no credentials (in-cluster sources take none)")
    if len(set(items)) != len(items):
        raise ValueError(f"sources {text!r}: each source once")
    return items


def http_client(deadline_seconds: float = LOCK_DEADLINE_SECONDS,
                call_seconds: float = CALL_SECONDS, what: str = "the lock command") -> HttpClient:
    """The one HTTP client (httpclient.py) with one command's deadline."""
    return HttpClient(deadline=Deadline(deadline_seconds, what),
                      call_seconds=min(call_seconds, deadline_seconds), user_agent="k3infra-weights")


def lock_client(args) -> HttpClient:
    """`lock --hub [--timeout SECONDS]`'s client (both command lines)."""
    return http_client(args.timeout or LOCK_DEADLINE_SECONDS)


def label(source: str) -> str:
    if source == HUB:
        return "the Hub"
    return f"the store {source}" if store.is_store_url(source) else f"cluster source {source}"


@dataclass
class SourceCount:
    """What one source delivered during a prefetch."""

    files: int = 0             # files whose last bytes came from it
    bytes: int = 0             # bytes it wrote into partial files
    failures: int = 0          # downloads from it that failed (the file moved on)
    refused_by_lock: int = 0   # files it contributed to that failed the lock


@dataclass
class _FileState:
    start: int = 0                                  # index of the next source to try
    contributed: set = field(default_factory=set)   # sources that wrote bytes of it
    calls: int = 0                                  # calls so far (the latest owns the file)
    running: Optional[int] = None                   # source of the call still running


class SourceChain:
    """A prefetch fetcher (`fetcher(entry)`) over several sources, in order, with the
    `rejected(entry, problem)` hook the prefetch calls when a landed file fails the lock."""

    def __init__(self, sources: list[str], make_fetcher: Callable[[str], Callable[[FileEntry], None]],
                 partial_size: Callable[[FileEntry], int], say: Emit):
        self.sources = list(sources)
        self.fetchers = [make_fetcher(s) for s in self.sources]
        self._partial_size = partial_size
        self._say = say
        self._lock = threading.Lock()
        self._files: dict[str, _FileState] = {}
        self.counts = {s: SourceCount() for s in self.sources}
        self.refused_by_lock = 0
        self.failovers = 0
        self._streak = {s: 0 for s in self.sources}    # failures in a row
        self.down: set = set()

    def _state(self, entry: FileEntry) -> _FileState:
        with self._lock:
            return self._files.setdefault(entry.path, _FileState())

    def __call__(self, entry: FileEntry):
        state = self._state(entry)
        last = len(self.sources) - 1
        with self._lock:
            state.calls += 1
            call = state.calls
            stalled = state.running
        if stalled is not None:
            # A new call while the previous one still runs: the prefetch's stall watchdog
            # abandoned that transfer. Its source stalled: resume from the next one.
            self._credit(self.sources[stalled], state, 0, ok=False)
            if stalled < last:
                with self._lock:
                    self.failovers += 1
                state.start = max(state.start, stalled + 1)
                self._say(f"prefetch: {entry.path}: {label(self.sources[stalled])} stalled; "
                          f"resuming at byte {self._partial_size(entry)} from "
                          f"{label(self.sources[state.start])}")
        i = state.start
        while True:
            while i < last and self.sources[i] in self.down:
                i += 1
            source = self.sources[i]
            before = self._partial_size(entry)
            state.running = i
            try:
                result = self.fetchers[i](entry)
            except Exception as exc:
                if state.calls != call:
                    raise                 # abandoned as stalled: a newer call owns the file
                state.running = None
                self._credit(source, state, self._partial_size(entry) - before, ok=False)
                if i >= last:
                    raise                 # the prefetch's retry and backoff take over
                with self._lock:
                    self.failovers += 1
                resumed = self._partial_size(entry)
                self._say(f"prefetch: {entry.path}: {label(source)} failed "
                          f"({type(exc).__name__}: {str(exc).strip()[:200]}); resuming at byte "
                          f"{resumed} from {label(self.sources[i + 1])}")
                i += 1
                state.start = i
                continue
            # Renamed into place: this source wrote what was still missing.
            state.running = None
            self._credit(source, state, entry.size - before, ok=True)
            return result         # a store's fetcher hands back the hash it computed

    def _credit(self, source: str, state: _FileState, nbytes: int, ok: bool) -> None:
        with self._lock:
            count = self.counts[source]
            if nbytes > 0:
                count.bytes += nbytes
                state.contributed.add(source)
            if ok:
                count.files += 1
                self._streak[source] = 0
                return
            count.failures += 1
            self._streak[source] += 1
            newly_down = (self._streak[source] >= DOWN_AFTER_FAILURES and source not in self.down
                          and source != self.sources[-1])
            if newly_down:
                self.down.add(source)
        if newly_down:
            self._say(f"prefetch: {label(source)} failed {DOWN_AFTER_FAILURES} downloads in a "
                      "row; skipping it for the rest of this run")

    def rejected(self, entry: FileEntry, problem: str, again: bool = True) -> None:
        """The landed file failed the lock (the prefetch has deleted it): blame every source
        that wrote bytes of it, start the next download after the last of them, and ask none
        of them (but the last source) again in this run."""
        state = self._state(entry)
        with self._lock:
            blamed = sorted(state.contributed, key=self.sources.index)
            for source in blamed:
                self.counts[source].refused_by_lock += 1
                if source != self.sources[-1]:
                    self.down.add(source)     # served bytes the lock refused: not asked again
            self.refused_by_lock += 1
            after = max((self.sources.index(s) for s in blamed), default=state.start)
            state.start = min(after + 1, len(self.sources) - 1)
            state.contributed = set()
        who = ", ".join(label(s) for s in blamed) or "no source"
        then = (f"deleted, fetching it again from {label(self.sources[state.start])}" if again
                else "deleted; no download left")
        self._say(f"prefetch: {entry.path}: {problem} (bytes from {who}, refused by the lock); {then}")


def fetch_lock(source: str, lock_revision: str, repo: str,
               client: Optional[HttpClient] = None) -> Lock:
    """The lock an in-cluster source serves beside its tree. Not trusted either: read
    through the one HTTP client (bounded, with the command's deadline), parsed (its
    digest recomputed from its file list), held to the pinned repo and revision here
    and to the pinned digest by check-lock.sh before a single shard is fetched."""
    client = client or http_client()
    url = client.allow_http(source) + LOCK_ROUTE.format(revision=lock_revision)
    try:
        raw = client.request("GET", url, body_max=LOCK_BYTES_MAX, kind="lock").body
    except HttpError as exc:
        raise tree.LockError(str(exc)) from None
    return tree.parse_served_lock(raw, url, repo, lock_revision, LOCK_BYTES_MAX)


def lock_from_sources(sources: list[str], repo: str, revision: str, *,
                      emit: Optional[Emit] = None, hub_lock: Optional[Callable[[], Lock]] = None,
                      client: Optional[HttpClient] = None) -> Lock:
    """The lock from the first source that has it: an in-cluster source's lock file, or
    Hub metadata (`hub_lock`)."""
    say = emit or (lambda _line: None)
    if sources == [HUB] and hub_lock is not None:
        return hub_lock()                 # the Hub alone: its own errors, unwrapped
    client = client or http_client()
    errors = []
    for source in sources:
        try:
            if source == HUB:
                if hub_lock is None:
                    raise tree.LockError("no Hub lock builder")
                return hub_lock()
            lock = (store.fetch_lock(store.parse_store_url(source), repo, revision)
                    if store.is_store_url(source) else fetch_lock(source, revision, repo, client))
            say(f"lock: {repo}@{revision} from {label(source)}")
            return lock
        except Exception as exc:          # next source; every failure is reported at the end
            first = (str(exc).strip().splitlines() or [""])[0]     # a store's errors run long
            errors.append(f"{label(source)}: {type(exc).__name__}: {first}")
            say(f"lock: {label(source)} failed ({type(exc).__name__}: {first}); trying the next source")
    raise tree.LockError("no source gave the lock: " + "; ".join(errors))


def hub_token_for(source: str, token):
    """The HF token goes to the Hub only; in-cluster sources get `False` (huggingface_hub:
    send no Authorization header, do not read HF_TOKEN either)."""
    return token if source == HUB else False


def endpoint_for(source: str, hub_endpoint: Optional[str]) -> Optional[str]:
    return (hub_endpoint or os.environ.get("HF_ENDPOINT") or None) if source == HUB else source
