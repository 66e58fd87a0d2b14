"""What Pulumi's schema inference cannot say, added to the schema it inferred.

The inference reads descriptions from docstrings in a class body and knows neither
defaults nor secrets. The shapes are derived from the config models (`shapes`), so their
descriptions come from the same places a reader finds them: the key tables of
docs/configuration.md and of each section's page (engine.md, clouds.md, ...), else the
comment above the model field, else the docstring of the section's model. The tables are
read from the package's `doc_rows.json`, generated from docs/ by
`python -m k3infra.plugin.schema docs` (tests/test_packaging.py fails when it is stale),
so an installed package needs no checkout. Scalar defaults are the models' own; the
secrets (`k3:apiKey`, `k3:hfToken`) are marked `secret`, so a generated SDK wraps them
as Pulumi secrets before they leave the consumer's program.
"""
from __future__ import annotations

import inspect
import json
import re
import sys
import types
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from k3infra.config import SECRET_KEYS
from k3infra.plugin.shapes import ARGS_NAME, SHAPES, Shape

PACKAGE = "k3infra"
COMPONENT = f"{PACKAGE}:index:K3ServingStack"
DOC_ROWS = "doc_rows.json"          # package data beside this module
_LINK = re.compile(r"\[([^\]]+)\]\([^)]+\)")
_FIELD = re.compile(r"^    (\w+)\s*:")


# Sections whose keys are tabled in their concern's page, relative to the section
# (`| \`build\` | ...` in engine.md is `k3:engine.build`).
SECTION_DOCS = {"engine": "engine.md", "nodePool": "clouds.md", "benchmark": "benchmark.md",
                "accuracy": "accuracy.md", "monitoring": "operations.md",
                "network": "operations.md", "host": "host.md"}
_CELL_KEY = re.compile(r"`(?:k3:)?([A-Za-z][\w.\[\]]*)`")


def _rows(text: str, section: str = "") -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| `") or len(cells) < 3:
            continue
        if re.fullmatch(r"\[[^\]]+\]\([^)]+\)", cells[-1]):    # an index row: a link only
            continue
        meaning = _LINK.sub(r"\1", cells[-1]).strip()
        if not meaning:
            continue
        for key in _CELL_KEY.findall(cells[0]):
            if section and not key.startswith(section + "."):
                key = f"{section}.{key}"
            rows.setdefault(key, meaning)
    return rows


def doc_rows(docs: Path) -> dict[str, str]:
    """The key tables of docs/configuration.md and of each section's page: dotted key
    (no `k3:`) -> its meaning. Rows of an index that only link to a page carry none."""
    rows: dict[str, str] = {}
    if (docs / "configuration.md").exists():
        rows.update(_rows((docs / "configuration.md").read_text()))
    for section, page in SECTION_DOCS.items():
        if (docs / page).exists():
            for key, meaning in _rows((docs / page).read_text(), section).items():
                rows.setdefault(key, meaning)
    return rows


def packaged_doc_rows() -> dict[str, str]:
    """`doc_rows` of the docs this package was generated from (its `doc_rows.json`)."""
    return json.loads(resources.files(__package__).joinpath(DOC_ROWS).read_text(encoding="utf-8"))


def write_doc_rows(docs: Path) -> Path:
    """Regenerate `doc_rows.json` from a checkout's docs/ (run after editing a key table)."""
    target = Path(__file__).with_name(DOC_ROWS)
    target.write_text(json.dumps(doc_rows(docs), indent=1, sort_keys=True, ensure_ascii=False)
                      + "\n", encoding="utf-8")
    return target


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """The `#` comment lines right above each field of a config model, by field name."""
    try:
        lines = inspect.getsource(model).splitlines()[1:]
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        text = line.strip()
        if text.startswith("#"):
            pending.append(text.lstrip("#").strip())
            continue
        m = _FIELD.match(line)
        if m and pending:
            found[m.group(1)] = " ".join(pending)
        pending = []
    return found


def _models_in(ann: Any) -> list[type[BaseModel]]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in get_args(ann) for m in _models_in(a)]


def _literals(ann: Any) -> list:
    if get_origin(ann) is Literal:
        return list(get_args(ann))
    if get_origin(ann) in (Union, types.UnionType):
        return [v for a in get_args(ann) for v in _literals(a)]
    return []


def _default(field) -> Any:
    """A scalar default of the model (lists, maps and derived defaults stay in the text)."""
    value = field.default
    if value is PydanticUndefined or value is None:
        return None
    return value if isinstance(value, (str, int, float, bool)) else None


def describe(shape: Shape, properties: dict[str, dict], rows: dict[str, str]) -> None:
    """Descriptions and scalar defaults on one object's schema properties, in place."""
    comments = field_comments(shape.model)
    for py_name, field in shape.model.model_fields.items():
        sub = field.alias or py_name
        prop = properties.get(sub)
        if prop is None:
            continue
        dotted = f"{shape.key}.{sub}" if shape.key else sub
        text = rows.get(dotted) or comments.get(py_name)
        if not text:
            docs = [(m.__doc__ or "").strip() for m in _models_in(field.annotation)]
            text = next((d for d in docs if d), "")
        section = (shape.model.__doc__ or "").strip().splitlines()
        if not text and section:        # a key only prose describes: name its section
            text = f"Part of: {section[0]}"
        accepted = _literals(field.annotation)
        if accepted and not all(f"`{v}`" in text for v in accepted):
            text = f"{text} One of: {', '.join(f'`{v}`' for v in accepted)}.".strip()
        prop["description"] = f"`k3:{dotted}`. {text}".strip()
        default = _default(field)
        if default is not None and "type" in prop:
            prop["default"] = default
        if not shape.key and sub in SECRET_KEYS:
            prop["secret"] = True


def complete(schema: dict, description: str) -> dict:
    """The inferred schema with descriptions, defaults and secrets added."""
    rows = packaged_doc_rows()
    schema["description"] = description
    for name, shape in SHAPES.items():
        if name == ARGS_NAME:
            describe(shape, schema["resources"][COMPONENT]["inputProperties"], rows)
        else:
            describe(shape, schema["types"][f"{PACKAGE}:index:{name}"].get("properties") or {},
                     rows)
    return schema


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1], "configuration.md").is_file():
        sys.exit("usage: python -m k3infra.plugin.schema <checkout>/docs "
                 "(the directory that holds configuration.md)")
    print(write_doc_rows(Path(sys.argv[1])))
