"""Reading config from a stack file and `--config KEY=VALUE` (the offline render)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


from k3infra.config.base import (CONFIG_NAMESPACE, SECRET_PLACEHOLDER, ConfigError)
from k3infra.config.parse import decode_value

STACK_DIR = "stacks"                 # Pulumi.yaml's stackConfigDir: the user's own stack files
STACK_TEMPLATES = "stacks/examples"  # tracked templates, never carrying a ciphertext


def stack_file(stack: str, root: Path) -> Path:
    """The user's `stacks/Pulumi.<stack>.yaml` if it exists, else the shipped template.

    Templates carry no `secure:` value (a ciphertext is bound to one stack's key); users
    copy a template into `stacks/` and `pulumi config set --secret` writes their own."""
    own = root / STACK_DIR / f"Pulumi.{stack}.yaml"
    return own if own.is_file() else root / STACK_TEMPLATES / f"Pulumi.{stack}.yaml"


def stack_names(root: Path) -> list[str]:
    """Every stack a render can name: the shipped templates and the user's own files."""
    files = [*(root / STACK_TEMPLATES).glob("Pulumi.*.yaml"), *(root / STACK_DIR).glob("Pulumi.*.yaml")]
    return sorted({p.name[len("Pulumi."):-len(".yaml")] for p in files})


def read_stack_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """`config:` of a Pulumi stack file -> ({'k3:key': value}, secret keys).

    `secure:` ciphertexts cannot be decrypted offline: they become the placeholder."""
    import yaml

    doc = yaml.safe_load(path.read_text()) or {}
    raw: dict[str, Any] = {}
    secrets: list[str] = []
    for key, value in (doc.get("config") or {}).items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            raw[key] = SECRET_PLACEHOLDER
            secrets.append(key)
        else:
            raw[key] = value
    return raw, secrets


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """`KEY=VALUE` (KEY may be `k3:a.b.c`, a dotted path into an object)."""
    if "=" not in assignment:
        raise ConfigError("--config", assignment, "takes KEY=VALUE")
    key, value = assignment.split("=", 1)
    if ":" not in key:
        key = f"{CONFIG_NAMESPACE}:{key}"
    top, *path = key.split(".")
    parsed = decode_value(key, value)
    if not path:
        raw[top] = parsed
        return
    obj = raw.get(top)
    obj = json.loads(obj) if isinstance(obj, str) else dict(obj or {})
    cursor = obj
    for part in path[:-1]:
        cursor = cursor.setdefault(part, {})
        if not isinstance(cursor, dict):
            raise ConfigError(key, value, f"{part} is not an object")
    cursor[path[-1]] = parsed
    raw[top] = obj


def to_pulumi_config(raw: dict[str, Any]) -> dict[str, str]:
    """Pulumi's wire form: every value a string, objects and lists JSON-encoded."""
    out = {}
    for key, value in raw.items():
        if isinstance(value, (dict, list)):
            out[key] = json.dumps(value)
        elif isinstance(value, bool):
            out[key] = "true" if value else "false"
        else:
            out[key] = str(value)
    return out
