"""Shared pieces of the config models: constants, the error type, the secret wrapper,
the base section model and the checks several sections use."""
from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

# The Pulumi config namespace of every key (`k3:weightsRevision`); not a Kubernetes
# namespace (that is k3:namespace, by default the component's instance name).
CONFIG_NAMESPACE = "k3"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
DIGEST_IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SECRET_PLACEHOLDER = "[secret]"
# RFC 6750 bearer token (b64token): what the serving proxy compares byte for byte.
API_KEY_RE = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")
# The serving proxy (k3infra/serving/proxy.py): nginx, non-root, by digest. The shipped
# digest is an all-zero placeholder: renders work, `pulumi up` refuses it
# (docs/security.md shows how to read the real digest of the tag).
PROXY_IMAGE = "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:" + "0" * 64
SECRET_KEYS = ("apiKey", "hfToken")


class ConfigError(ValueError):
    """A `k3:*` key holds a value that is not accepted. The message names all three."""

    def __init__(self, key: str, value: Any, accepted: str):
        self.key, self.value, self.accepted = key, value, accepted
        shown = SECRET_PLACEHOLDER if isinstance(value, Secret) else repr(value)
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
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True,
                              arbitrary_types_allowed=True)


_LABEL_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def _check_labels(v: dict[str, str]) -> dict[str, str]:
    for key, value in v.items():
        if not _LABEL_KEY_RE.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
            raise ValueError(f"{key!r} is not a Kubernetes label key")
        if not isinstance(value, str) or not _LABEL_VALUE_RE.match(value) or len(value) > 63:
            raise ValueError(f"{key}={value!r}: not a Kubernetes label value "
                             "(a string of at most 63 letters, digits, '-', '_', '.')")
    return v


def _check_dns_labels(v: list[str]) -> list[str]:
    for name in v:
        if not DNS_LABEL_RE.match(name) or len(name) > 63:
            raise ValueError(f"{name!r} is not a namespace name (DNS label)")
    return v
