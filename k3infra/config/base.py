"""Shared pieces of the config models: constants, the error type, the secret wrapper,
the base section model and the checks several sections use."""
from __future__ import annotations

from typing import Any, ClassVar, Optional

from pydantic import BaseModel, ConfigDict

from k3infra.fieldtypes import API_KEY, COMMIT, DIGEST_IMAGE, DNS_LABEL, MAX_STRING

# The Pulumi config namespace of every key (`k3:weightsRevision`); not a Kubernetes
# namespace (that is k3:namespace, by default the component's instance name).
CONFIG_NAMESPACE = "k3"
# Anchored with \A..\Z (never `$`, which matches before a final newline); the checks
# themselves are the types of k3infra.fieldtypes, these are for callers that match text.
COMMIT_RE = COMMIT.anchored
DIGEST_IMAGE_RE = DIGEST_IMAGE.anchored
DNS_LABEL_RE = DNS_LABEL.anchored
SECRET_PLACEHOLDER = "[secret]"
# RFC 6750 bearer token (b64token): what the serving proxy compares byte for byte.
API_KEY_RE = API_KEY.anchored
# The serving proxy (k3infra/serving/proxy.py): nginx, non-root, by digest. The shipped
# digest is an all-zero placeholder: renders work, `pulumi up` refuses it
# (docs/security.md shows how to read the real digest of the tag).
PROXY_IMAGE = "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:" + "0" * 64


class ConfigError(ValueError):
    """A `k3:*` key holds a value that is not accepted. The message names all three."""

    def __init__(self, key: str, value: Any, accepted: str):
        self.key, self.value, self.accepted = key, value, accepted
        shown = SECRET_PLACEHOLDER if isinstance(value, Secret) else repr(value)
        if len(shown) > 200:          # one readable line, whatever was typed
            shown = shown[:200] + "..."
        super().__init__(f"{key} = {shown}: {accepted}")


class Secret:
    """A config secret. Never prints its value; the component wraps it in a Pulumi
    secret Output. Offline renders hold the placeholder, never the plaintext."""

    __slots__ = ("_value",)

    def __init__(self, value: Any):
        self._value = value

    def reveal(self) -> Any:
        return self._value

    def __repr__(self) -> str:
        return SECRET_PLACEHOLDER

    __str__ = __repr__


class _Section(BaseModel):
    # Every float of every section is finite and every string bounded, whatever its type
    # says (parse.check_values refuses control characters in any string before this).
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True,
                              arbitrary_types_allowed=True, allow_inf_nan=False,
                              str_max_length=MAX_STRING)
    # The docs page (docs/<page>) whose key table holds this section's keys; None: a table
    # of docs/configuration.md (k3infra/config/reference.py writes both).
    page: ClassVar[Optional[str]] = None


def unset(text: str) -> dict:
    """A key's `json_schema_extra` when its unset value (None) means something: `text`
    stands in the key tables' default column ("the instance name")."""
    return {"unset": text}
