"""The receipt's short engine commit -> the full commit of the pull request's head, by
git's own protocol (`git ls-remote <repo> refs/pull/<N>/head`): no clone, no API token."""
from __future__ import annotations

import os
import re
import subprocess

TIMEOUT_S = 60.0
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


class RefError(RuntimeError):
    """The ref is absent, unreachable, or its head does not match the receipt."""


def pr_ref(pull_request: int) -> str:
    return f"refs/pull/{pull_request}/head"


def ls_remote(repo: str, ref: str, timeout: float = TIMEOUT_S) -> str | None:
    """The commit `ref` names on `repo` today, or None when the remote has no such ref."""
    try:
        done = subprocess.run(["git", "ls-remote", "--", repo, ref], capture_output=True,
                              text=True, errors="replace", timeout=timeout,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except FileNotFoundError:
        raise RefError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise RefError(f"git ls-remote {repo} {ref} ran past {timeout:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RefError(f"git ls-remote {repo} {ref} failed ({done.returncode}): {last}")
    for line in done.stdout.splitlines():
        sha, _, name = line.partition("\t")
        if name == ref and _SHA_RE.match(sha):
            return sha
    return None


def resolve_pr_head(repo: str, pull_request: int, prefix: str) -> str:
    """The 40-hex head of the PR, refused unless it starts with the receipt's `prefix`."""
    ref = pr_ref(pull_request)
    sha = ls_remote(repo, ref)
    if sha is None:
        raise RefError(f"{repo} has no {ref}")
    if not sha.startswith(prefix):
        raise RefError(f"{repo} {ref} is {sha}, which does not start with the receipt's "
                       f"commit {prefix}: the PR head moved past the measured engine")
    return sha
