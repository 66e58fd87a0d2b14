"""The commit a Hub branch points at today, through the Hub's API reader of the weights
runtime (k3infra/weights/hubapi.py: the one HTTP client, the command's deadline, a
40-hex commit or a refusal). HF_ENDPOINT, or the stack's k3:weights.hubEndpoint, names
the Hub or a mirror. Only ever offered: the receipt pins bytes, and `main` moves."""
from __future__ import annotations

from typing import Optional

from k3infra.httpclient import HttpError
from k3infra.pins.oci import client
from k3infra.weights.hubapi import Hub, HubError as ApiError


class HubError(RuntimeError):
    """The Hub did not answer with a commit for the branch."""


def branch_commit(repo: str, branch: str = "main", endpoint: Optional[str] = None,
                  http=None) -> str:
    try:
        return Hub(http or client(), endpoint).commit(repo, branch)
    except (ApiError, HttpError) as exc:
        raise HubError(str(exc)) from None
