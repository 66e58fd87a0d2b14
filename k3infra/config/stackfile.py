"""Reading config from a stack file and `--config KEY=VALUE` (the offline render)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from k3infra.config.base import (CONFIG_NAMESPACE, SECRET_PLACEHOLDER, ConfigError)
from k3infra.config.parse import decode_value
from k3infra.podcommon import read_regular

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


# A stack file is a few KiB: past this it is not one (and YAML's cost grows with it).
STACK_FILE_MAX_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_INT_DIGITS = 40          # as podcommon.JSON_MAX_DIGITS: past every count a file holds
# One `--config` key: `[namespace:]name(.name)*`, names of letters, digits, '_' and '-'.
_OVERRIDE_KEY = re.compile(r"([A-Za-z0-9_-]+:)?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+){0,8}")


class StackFileError(ConfigError):
    """A stack file that is not a Pulumi stack file: one line naming the file, where and why."""

    def __init__(self, path: Path, problem: str):
        self.key, self.value, self.accepted = str(path), None, problem
        ValueError.__init__(self, f"{path}: {problem}")


def _stack_loader(path: Path, yaml):
    """A yaml.SafeLoader that refuses, naming the line, what a stack file never holds:
    duplicate keys (YAML would keep the last silently), aliases (`*a`: an alias bomb
    expands exponentially in every later walk), nesting past MAX_YAML_DEPTH, and tags
    that construct more than JSON data (!!binary, !!timestamp, !!set, python/*). `yaml`:
    the module, imported by strict_yaml."""
    def where(node_or_mark) -> str:
        mark = getattr(node_or_mark, "start_mark", node_or_mark)
        return f"line {mark.line + 1}, column {mark.column + 1}"

    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise StackFileError(path, f"{where(event)}: YAML aliases (*{event.anchor}) are "
                                     "not accepted in a stack file; write the value out")
            self.depth += 1
            if self.depth > MAX_YAML_DEPTH:
                raise StackFileError(path, f"{where(self.peek_event())}: nested deeper than "
                                     f"{MAX_YAML_DEPTH} levels")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    raise StackFileError(path, f"{where(key_node)}: a mapping key must be a "
                                         "string") from None
                if key in seen:
                    raise StackFileError(path, f"{where(key_node)}: duplicate key {key!r} "
                                         f"(first at line {seen[key] + 1}); YAML would keep the "
                                         "last one silently")
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    def refuse(loader, node):
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        raise StackFileError(path, f"{where(node)}: the tag {tag} is not accepted in a "
                             "stack file (only strings, numbers, booleans, lists and mappings; "
                             "quote a date)")

    def bounded_int(loader, node):
        # Python's int-string limit would raise a ValueError traceback past 4300 digits.
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise StackFileError(path, f"{where(node)}: an integer of {digits} digits (at most "
                                 f"{MAX_INT_DIGITS} are accepted)")
        return yaml.SafeLoader.construct_yaml_int(loader, node)

    Loader.add_constructor("tag:yaml.org,2002:int", bounded_int)
    for tag in ("tag:yaml.org,2002:binary", "tag:yaml.org,2002:timestamp",
                "tag:yaml.org,2002:set", "tag:yaml.org,2002:omap", "tag:yaml.org,2002:pairs"):
        Loader.add_constructor(tag, refuse)
    Loader.add_constructor(None, refuse)            # any unknown tag: !!python/..., !foo
    return Loader


def load_stack_yaml(path: Path) -> Any:
    """The parsed YAML of a stack file, or StackFileError: a regular file (not a FIFO or a
    device, read without blocking), at most STACK_FILE_MAX_BYTES, UTF-8, valid YAML
    (tabs in indentation are a YAML error, named with its line), and see _stack_loader."""
    try:
        raw = read_regular(str(path), STACK_FILE_MAX_BYTES)
    except OSError as exc:
        raise StackFileError(path, f"cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise StackFileError(path, f"line {line}: byte {raw[exc.start]:#04x} is not UTF-8") from None
    return strict_yaml(text, path)


def strict_yaml(text: str, path: Path) -> Any:
    """`text` (read from `path`) parsed by the strict loader (_stack_loader): the one
    YAML reader of files a user hands the CLI (stack files, receipts); StackFileError
    naming the line otherwise."""
    # yaml here, not at the top: 0.04 s to import (python -X importtime), which `k3infra
    # startup` (it loads k3infra.config, never a YAML file) does not pay.
    import yaml

    try:
        return yaml.load(text, Loader=_stack_loader(path, yaml))
    except StackFileError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "\t" in what or "'\\t'" in what:
            what += " (YAML indents with spaces, never tabs)"
        raise StackFileError(path, f"{at}not valid YAML: {what}") from None
    except RecursionError:
        raise StackFileError(path, f"nested deeper than {MAX_YAML_DEPTH} levels") from None


def read_stack_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """`config:` of a Pulumi stack file -> ({'k3:key': value}, secret keys).

    `secure:` ciphertexts cannot be decrypted offline: they become the placeholder."""
    doc = load_stack_yaml(path)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise StackFileError(path, f"the top level is a {_yaml_kind(doc)}; a stack file is a "
                             "mapping with a `config:` mapping")
    config = doc.get("config")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise StackFileError(path, f"`config:` is a {_yaml_kind(config)}; it must be a mapping of "
                             "`namespace:key: value`")
    raw: dict[str, Any] = {}
    secrets: list[str] = []
    for key, value in config.items():
        if not isinstance(key, str):
            raise StackFileError(path, f"config key {key!r} is a {_yaml_kind(key)}; keys are "
                                 "`namespace:name` strings")
        if isinstance(value, dict) and set(value) == {"secure"}:
            raw[key] = SECRET_PLACEHOLDER
            secrets.append(key)
        else:
            raw[key] = value
    return raw, secrets


def _yaml_kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean",
            dict: "mapping"}.get(type(value), type(value).__name__)


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """`KEY=VALUE` (KEY may be `k3:a.b.c`, a dotted path into an object)."""
    if "=" not in assignment:
        raise ConfigError("--config", assignment, "takes KEY=VALUE")
    key, value = assignment.split("=", 1)
    if not _OVERRIDE_KEY.fullmatch(key):
        raise ConfigError("--config", key, "KEY is [namespace:]name(.name)*: letters, digits, "
                          "'_' and '-', at most 9 dotted parts")
    if ":" not in key:
        key = f"{CONFIG_NAMESPACE}:{key}"
    top, *path = key.split(".")
    parsed = decode_value(key, value)
    if not path:
        raw[top] = parsed
        return
    obj = decode_value(top, raw.get(top))
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise ConfigError(key, value, f"{top} is {obj!r}, not an object: a dotted key sets a key "
                          "inside an object")
    obj = dict(obj)
    cursor = obj
    for i, part in enumerate(path[:-1]):
        inner = cursor.get(part)
        if inner is None:
            inner = {}
        if not isinstance(inner, dict):
            where = ".".join([top, *path[:i + 1]])
            raise ConfigError(key, value, f"{where} is {inner!r}, not an object")
        cursor[part] = inner = dict(inner)
        cursor = inner
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
