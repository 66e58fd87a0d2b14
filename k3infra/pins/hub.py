"""The commit a Hub branch points at today (huggingface_hub's own client; HF_ENDPOINT,
or the stack's k3:weights.hubEndpoint, names the Hub or a mirror). Only ever offered:
the receipt pins bytes, and `main` moves."""
from __future__ import annotations


class HubError(RuntimeError):
    """The Hub did not answer with a commit for the branch."""


def branch_commit(repo: str, branch: str = "main", endpoint: str | None = None) -> str:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi(endpoint=endpoint).model_info(repo, revision=branch)
    except HfHubHTTPError as exc:
        raise HubError(f"{repo}@{branch}: {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # httpx's connect and timeout errors are not OSError
        raise HubError(f"{repo}@{branch}: the Hub at {endpoint or 'HF_ENDPOINT'} is unreachable: "
                       f"{type(exc).__name__}: {exc}") from None
    if not info.sha:
        raise HubError(f"{repo}@{branch}: the Hub sent no commit")
    return info.sha
