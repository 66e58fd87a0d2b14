"""`git daemon` on 127.0.0.1 serving one bare repository with a refs/pull/N/head, for
`k3infra pins` (git's own protocol: `git ls-remote`). Test-only."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

IDENTITY = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def git_daemon(workdir: Path, pull_request: int) -> Iterator[SimpleNamespace]:
    """`url` (git://127.0.0.1:PORT/vllm.git), `first` (the PR head it starts with),
    `commit(msg)` and `push_pr(sha)` (move the PR head)."""
    base, work = workdir / "git", workdir / "vllm-work"
    _run("git", "init", "-q", "--bare", str(base / "vllm.git"))
    _run("git", "init", "-q", str(work))

    def commit(msg: str) -> str:
        _run("git", *IDENTITY, "-C", str(work), "commit", "-q", "--allow-empty", "-m", msg)
        return _run("git", "-C", str(work), "rev-parse", "HEAD")

    def push_pr(sha: str) -> None:
        _run("git", "-C", str(work), "push", "-q", "--force", str(base / "vllm.git"),
             f"{sha}:refs/pull/{pull_request}/head")

    first = commit("the measured engine")
    push_pr(first)
    port = _free_port()
    proc = subprocess.Popen(["git", "daemon", "--export-all", f"--base-path={base}",
                             "--listen=127.0.0.1", f"--port={port}", "--reuseaddr",
                             "--informative-errors", str(base)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"git://127.0.0.1:{port}/vllm.git"
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(["git", "ls-remote", url], capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"git daemon did not start on {url}")
            time.sleep(0.1)
        yield SimpleNamespace(url=url, first=first, commit=commit, push_pr=push_pr)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
