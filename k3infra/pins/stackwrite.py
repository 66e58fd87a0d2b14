"""Setting pinned values in a Pulumi stack file, keeping its comments, order and every
other value (`secure:` ciphertexts included) byte for byte: ruamel.yaml's round trip."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import yaml

from k3infra.config.stackfile import STACK_FILE_MAX_BYTES
from k3infra.podcommon import read_regular


class StackWriteError(RuntimeError):
    """The stack file cannot take the value where it belongs; the message says why."""


def _ruamel():
    """ruamel.yaml's YAML class and its comments and scalarstring modules."""
    # Here, not at the top: ruamel.yaml is optional (the `pins` extra), needed by
    # `pins --write` only.
    try:
        from ruamel.yaml import YAML, comments, scalarstring
    except ImportError:
        raise StackWriteError("--write needs ruamel.yaml: pip install -c constraints.txt "
                              "-e '.[pins]'") from None
    return YAML, comments, scalarstring


def _yaml():
    yaml = _ruamel()[0]()               # round-trip mode: comments, order, quoting kept
    yaml.preserve_quotes = True
    yaml.width = 4096           # never fold a long image reference
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def set_values(path: Path, values: list[tuple[tuple[str, ...], Any]]) -> str:
    """The stack file's text with each (config path, value) set; objects created as
    needed under `config:`. Returns the new text; the caller writes it."""
    yaml = _yaml()
    comments = _ruamel()[1]
    CommentedMap, CommentedSeq = comments.CommentedMap, comments.CommentedSeq
    try:    # the one bounded reader (the strict loader has already read this file)
        text = read_regular(str(path), STACK_FILE_MAX_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StackWriteError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    doc = yaml.load(text)
    if doc is None:
        doc = CommentedMap()
    config = doc.setdefault("config", CommentedMap())
    for keys, value in values:
        cursor = config
        for i, part in enumerate(keys[:-1]):
            nxt = cursor.get(part)
            if nxt is None:
                nxt = cursor[part] = CommentedMap()
            elif isinstance(nxt, str):
                raise StackWriteError(f"{path}: {'.'.join(keys[:i + 1])} is a JSON string; "
                                      f"write it as a YAML object to let pins set {'.'.join(keys)}")
            elif not isinstance(nxt, dict) or set(nxt) == {"secure"}:
                raise StackWriteError(f"{path}: {'.'.join(keys[:i + 1])} is not an object")
            cursor = nxt
        cursor[keys[-1]] = CommentedSeq(map(_scalar, value)) if isinstance(value, list) else _scalar(value)
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()


def _scalar(value: Any) -> Any:
    """A string YAML would read back as something else (a commit of digits and one `e`
    is a float) is written double-quoted."""
    if isinstance(value, str) and yaml.safe_load(value) != value:
        return _ruamel()[2].DoubleQuotedScalarString(value)
    return value


__all__ = ["set_values", "StackWriteError"]
