"""The reference of every `k3:*` key, read from the config models (their one definition:
type, default, bounds, description), and the files written from it.

    python -m k3infra.config.reference           # rewrite the generated parts
    python -m k3infra.config.reference --check   # exit 1 naming each stale file

Written from the models: Pulumi.yaml's `config:` block, and each key table of docs/
between a `<!-- k3 keys: ... -->` marker and its `<!-- /k3 keys ... -->` (the prose
around the tables is hand-written). The plugin schema (k3infra/plugin/schema.py) reads
the same descriptions, defaults and secrets here at run time. Adding a key is one field
in k3infra/config/models.py (or pools.py) plus its use, then this command.

A marker names what its table holds, in order: `top-level` (one row per top-level key,
sections as one row), or dotted keys: a section or object expands to every key inside
it, a plain key is its own row. `<!-- k3 keys index: ... -->` writes the index form
(the page that documents each key instead of its meaning).
"""
from __future__ import annotations

import json
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Optional, Union, get_args, get_origin

import yaml
from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from k3infra.config.models import SECRET_KEYS, StackConfig
from k3infra.fieldtypes import Accepted, FullMatch

COMMAND = "python -m k3infra.config.reference"
ROOT = Path(__file__).resolve().parents[2]
PULUMI_YAML = "Pulumi.yaml"
DOCS = "docs"
_OPEN = re.compile(r"^<!-- k3 keys( index)?: ([^>]*?) -->\n", re.M)
_CLOSE = f"<!-- /k3 keys: written by `{COMMAND}` -->\n"
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_PLACEHOLDER = "@sha256:" + "0" * 64

# Why Pulumi.yaml declares the keys it declares, written once: emitted above the block.
PULUMI_CONFIG_RULE = f"""\
# The project's own `k3:*` keys, checked by the Pulumi CLI before the program runs.
# Written by `{COMMAND}` from k3infra/config/models.py; do not edit below.
# Declared: every top-level key of a type the CLI knows (string, integer, boolean) that is
# required or has a fixed default. A key declared without `default:` is REQUIRED in every
# stack (the CLI stops with "Stack ... is missing configuration value"), so only the keys
# the model requires are declared so. Optional keys without a fixed default (from the
# receipt, the instance name) and the object-valued sections are not declared: k3infra
# validates every key itself before creating anything (docs/configuration.md).
"""


@dataclass(frozen=True)
class Key:
    """One `k3:*` key: its dotted path (`serving.resources.cpu`, `nodePool.aws.subnets[].id`)
    and the model field that defines it."""

    path: str
    field: FieldInfo

    @property
    def name(self) -> str:
        return f"k3:{self.path}"

    @property
    def model(self) -> Optional[type[BaseModel]]:
        """The model of the key's value (of each item, for a list of objects), if an object."""
        return _model_in(self.field.annotation)

    @property
    def secret(self) -> bool:
        return self.path in SECRET_KEYS

    @property
    def page(self) -> Optional[str]:
        """The docs page of the top-level section the key lies in (None: configuration.md)."""
        top = _fields(StackConfig)[self.path.split(".", 1)[0].removesuffix("[]")]
        model = _model_in(top.annotation)
        return model.page if model is not None else None

    @property
    def description(self) -> str:
        """The meaning, as written in the model (markdown: links are relative to docs/)."""
        return self.field.description or ""

    @property
    def accepts(self) -> str:
        """What values are accepted, in words, from the type and its bounds."""
        return accepts(self.field.annotation, self.field.metadata)

    @property
    def default(self) -> Any:
        """The model's default when it is a scalar (str, int, float, bool); else None."""
        value = None if self.field.is_required() else self.field.get_default(
            call_default_factory=True)
        return value if isinstance(value, (str, int, float, bool)) else None

    def default_text(self, links: bool = True) -> str:
        """The default as the key tables show it (`1`, unset, derived, required...)."""
        extra = self.field.json_schema_extra if isinstance(self.field.json_schema_extra,
                                                          dict) else {}
        if self.field.is_required():
            text = "required"
        else:
            value = self.field.get_default(call_default_factory=True)
            if value is None:
                text = str(extra.get("unset", "unset"))
            elif isinstance(value, BaseModel):
                page = type(value).page if "." not in self.path else None
                text = (f"see [{page.removesuffix('.md')}]({page})" if page and links
                        else "see below")
            else:
                text = f"`{_shown(value)}`"
        return f"{text} (secret)" if self.secret else text

    def text(self) -> str:
        """The key in plain sentences (the plugin schema, Pulumi.yaml): its meaning, what it
        accepts unless the meaning names every value, what unset means."""
        text = plain(self.description)
        text = text[:1].upper() + text[1:]
        values = _literals(self.field.annotation)
        if self.accepts and not (values and all(f"`{v}`" in self.description for v in values)):
            text += f". Accepts {plain(self.accepts)}"
        if not self.field.is_required() and self.default is None:
            unset = self.default_text(links=False).removesuffix(" (secret)")
            if unset not in ("unset", "see below"):
                text += f". Default: {plain(unset)}"
        return text + "."

    def schema_description(self) -> str:
        return f"`{self.name}`. {self.text()}"


def _fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {f.alias or n: f for n, f in model.model_fields.items()}


def _unwrap(ann: Any) -> Any:
    """Optional[X] -> X (a key may be unset); other unions stay."""
    if get_origin(ann) in (Union, types.UnionType):
        members = [a for a in get_args(ann) if a is not type(None)]
        if len(members) == 1:
            return members[0]
    return ann


def _model_in(ann: Any) -> Optional[type[BaseModel]]:
    ann = _unwrap(ann)
    if get_origin(ann) is list:
        ann = _unwrap(get_args(ann)[0])
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _literals(ann: Any) -> tuple:
    ann = _unwrap(ann)
    return get_args(ann) if get_origin(ann) is Literal else ()


def keys(model: type[BaseModel] = StackConfig, prefix: str = "") -> Iterator[Key]:
    """Every key inside `model`, depth first: a nested object's key, then its keys (a list
    of objects: `subnets`, then `subnets[].id`...)."""
    for sub, field in _fields(model).items():
        key = Key(prefix + sub, field)
        yield key
        inner = key.model
        if inner is not None:
            many = get_origin(_unwrap(field.annotation)) is list
            yield from keys(inner, f"{key.path}{'[]' if many else ''}.")


def key(path: str) -> Key:
    """The key at a dotted path (no `k3:`); KeyError names it when there is none."""
    for k in keys():
        if k.path == path:
            return k
    raise KeyError(f"k3:{path} is no key of the config models")


# ---- what a key accepts, from its type --------------------------------------------------

def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _metadata(items) -> list:
    """Constraint objects, nested FieldInfos (from Annotated types) flattened."""
    out = []
    for m in items:
        out.extend(_metadata(m.metadata) if isinstance(m, FieldInfo) else [m])
    return out


_SIGNS = ((Ge, "ge", "≥"), (Gt, "gt", ">"), (Le, "le", "≤"), (Lt, "lt", "<"))


def _bounds(meta: list) -> str:
    found = [(sign, getattr(m, attr)) for m in meta for cls, attr, sign in _SIGNS
             if isinstance(m, cls)]
    signs = dict(found)
    if "≥" in signs and "≤" in signs:
        return f"{_number(signs['≥'])}–{_number(signs['≤'])}"
    return ", ".join(f"{sign} {_number(value)}" for sign, value in found)


def _count(meta: list) -> str:
    low = next((m.min_length for m in meta if isinstance(m, MinLen)), None)
    high = next((m.max_length for m in meta if isinstance(m, MaxLen)), None)
    if low and high:
        return f"{low}–{high} items"
    if low:
        return f"at least {low} item{'s' if low > 1 else ''}"
    return f"at most {high} items" if high else ""


def _words(meta: list) -> str:
    """The words a check carries: Accepted, a full-match pattern's message, a pattern."""
    for m in meta:
        if isinstance(m, Accepted):
            return m.text.removeprefix("must be ")
        check = getattr(m, "func", None)
        if isinstance(check, FullMatch):
            return check.accepted.removeprefix("must be ")
        if getattr(m, "pattern", None):
            return f"matching `{m.pattern}`"
    return ""


def accepts(ann: Any, metadata=()) -> str:
    """What a value of type `ann` (with its field's constraints) may be, in words."""
    meta = _metadata(metadata)
    ann = _unwrap(ann)
    while get_origin(ann) is not None and hasattr(ann, "__metadata__"):   # Annotated
        meta += _metadata(ann.__metadata__)
        ann = get_args(ann)[0]
    words = _words(meta)
    origin = get_origin(ann)
    if origin is Literal:
        values = [f"`{_shown(v)}`" for v in get_args(ann)]
        return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"
    if origin is list:
        item = get_args(ann)[0]
        count = _count(meta)
        text = words or ("a list of objects" if _model_in(item)
                         else f"a list, each {accepts(item)}")
        return f"{text} ({count})" if count else text
    if origin is dict:
        if words:
            return words
        k, v = (accepts(a) for a in get_args(ann))
        return f"a map: keys {k or 'text'}; values {v or 'text'}"
    if origin in (Union, types.UnionType):
        return " or ".join(accepts(a) for a in get_args(ann))
    if ann is bool:
        return "`true` or `false`"
    if ann in (int, float):
        kind = "an integer" if ann is int else "a number"
        bounds = _bounds(meta)
        return f"{kind}, {bounds}" if bounds else kind
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "an object"
    if words:
        return words
    count = next((m.min_length for m in meta if isinstance(m, MinLen)), None)
    return "non-empty text" if count else "text"


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value.replace(_PLACEHOLDER, "@sha256:0…0")
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def plain(text: str) -> str:
    """Markdown links of docs/ pages as plain text: `[weights](weights.md#x)` -> `weights
    (docs/weights.md#x)` (the schema and Pulumi.yaml are read outside docs/)."""
    return _LINK.sub(r"\1 (docs/\2)", text)


# ---- the key tables ----------------------------------------------------------------------

def table_keys(spec: str) -> list[Key]:
    """The keys a marker's spec names (module docstring), in order."""
    out: list[Key] = []
    for item in spec.split():
        if item == "top-level":
            out += [Key(sub, f) for sub, f in _fields(StackConfig).items()]
            continue
        k = key(item)
        inner = k.model
        if inner is None:
            out.append(k)
        else:
            many = get_origin(_unwrap(k.field.annotation)) is list
            out += list(keys(inner, f"{k.path}{'[]' if many else ''}."))
    return out


def _cell(text: str) -> str:
    """One table cell: one line, `|` escaped (code spans too, as GFM tables need), `<`
    escaped outside code spans (`<repository>` is no HTML tag)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(p.replace("<", "\\<") if i % 2 == 0 else p for i, p in enumerate(parts))


def table(spec: str, index: bool = False) -> str:
    """A marker's table, markdown."""
    if index:
        lines = ["| key | default | documented in |", "|---|---|---|"]
        for k in table_keys(spec):
            page = k.page or "configuration.md"
            lines.append(f"| `{k.name}` | {_cell(k.default_text())} | "
                         f"[{page.removesuffix('.md')}]({page}) |")
    else:
        lines = ["| key | default | accepts | meaning |", "|---|---|---|---|"]
        for k in table_keys(spec):
            lines.append(f"| `{k.name}` | {_cell(k.default_text())} | {_cell(k.accepts)} | "
                         f"{_cell(k.description)} |")
    return "\n".join(lines) + "\n"


def write_tables(text: str, where: str = "") -> str:
    """`text` (a docs page) with every marked table written from the models."""
    out, pos = [], 0
    for m in _OPEN.finditer(text):
        if m.start() < pos:
            continue
        end = text.find("<!-- /k3 keys", m.end())
        if end < 0:
            raise ValueError(f"{where}: the k3 keys table of {m.group(0).strip()} has no "
                             "closing <!-- /k3 keys ... --> line")
        close = text.index("\n", end) + 1
        out += [text[pos:m.end()], table(m.group(2), index=bool(m.group(1))), _CLOSE]
        pos = close
    return "".join(out) + text[pos:]


def tabled_keys(text: str) -> list[str]:
    """The dotted keys the marked tables of `text` hold."""
    return [k.path for m in _OPEN.finditer(text) for k in table_keys(m.group(2))]


# ---- Pulumi.yaml -------------------------------------------------------------------------

def _declared(k: Key) -> Optional[dict]:
    """Pulumi.yaml's declaration of a top-level key, or None when it is not declared
    (PULUMI_CONFIG_RULE)."""
    kind = {str: "string", int: "integer", bool: "boolean"}.get(
        _unwrap(k.field.annotation) if not k.secret else str)
    if _literals(k.field.annotation):
        kind = "string"
    if kind is None or not (k.field.is_required() or k.default is not None):
        return None
    decl: dict[str, Any] = {"type": kind}
    if k.secret:
        decl["secret"] = True
    if not k.field.is_required():
        decl["default"] = k.default
    decl["description"] = k.text() + (" Required." if k.field.is_required() else "")
    return decl


def pulumi_config() -> str:
    """Pulumi.yaml's `config:` block, with the rule above it."""
    block = {k.path: d for k in (Key(s, f) for s, f in _fields(StackConfig).items())
             if (d := _declared(k)) is not None}
    return PULUMI_CONFIG_RULE + yaml.safe_dump({"config": block}, sort_keys=False,
                                               allow_unicode=True, width=92)


def write_pulumi_yaml(text: str) -> str:
    """Pulumi.yaml with its `config:` block (the rule comment to the end) rewritten."""
    start = text.find(PULUMI_CONFIG_RULE.splitlines()[0])
    if start < 0:
        start = text.index("\nconfig:") + 1
    return text[:start] + pulumi_config()


# ---- the generated files -----------------------------------------------------------------

def generated(root: Optional[Path] = None) -> dict[Path, str]:
    """Every generated file under `root` (the checkout) with the content the models give it."""
    root = ROOT if root is None else root
    files = {root / PULUMI_YAML: write_pulumi_yaml((root / PULUMI_YAML).read_text())}
    for page in sorted((root / DOCS).glob("*.md")):
        text = page.read_text()
        if _OPEN.search(text):
            files[page] = write_tables(text, str(page.relative_to(root)))
    return files


def stale(root: Optional[Path] = None) -> list[Path]:
    """The generated files whose content is not what the models give."""
    return [path for path, text in generated(root).items() if path.read_text() != text]


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--check"]):
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    files = generated()
    changed = [p for p, text in files.items() if p.read_text() != text]
    for path in changed:
        rel = path.relative_to(ROOT)
        if argv:
            print(f"stale: {rel} (run `{COMMAND}`)", file=sys.stderr)
        else:
            path.write_text(files[path])
            print(f"wrote {rel}")
    return 1 if argv and changed else 0


if __name__ == "__main__":
    sys.exit(main())
