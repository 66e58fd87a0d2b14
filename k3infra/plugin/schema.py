"""What Pulumi's schema inference cannot say, added to the schema it inferred.

The inference reads descriptions from docstrings in a class body and knows neither
defaults nor secrets. The shapes are derived from the config models (`shapes`), and so
is everything added here, read from the models at run time through the key reference
(k3infra/config/reference.py): each key's description (its meaning, what it accepts,
what unset means), its scalar default, and the secrets (`k3:apiKey`, `k3:hfToken`)
marked `secret`, so a generated SDK wraps them as Pulumi secrets before they leave the
consumer's program. An installed package needs no checkout: nothing is read from docs/.
"""
from __future__ import annotations

from k3infra.config.reference import Key
from k3infra.plugin.shapes import ARGS_NAME, SHAPES, Shape

PACKAGE = "k3infra"
COMPONENT = f"{PACKAGE}:index:K3ServingStack"


def describe(shape: Shape, properties: dict[str, dict]) -> None:
    """Descriptions, scalar defaults and secrets on one object's schema properties, in place."""
    for py_name, field in shape.model.model_fields.items():
        sub = field.alias or py_name
        prop = properties.get(sub)
        if prop is None:
            continue
        key = Key(f"{shape.key}.{sub}" if shape.key else sub, field)
        prop["description"] = key.schema_description()
        if key.default is not None and "type" in prop:
            prop["default"] = key.default
        if key.secret:
            prop["secret"] = True


def complete(schema: dict, description: str) -> dict:
    """The inferred schema with descriptions, defaults and secrets added."""
    schema["description"] = description
    for name, shape in SHAPES.items():
        if name == ARGS_NAME:
            describe(shape, schema["resources"][COMPONENT]["inputProperties"])
        else:
            describe(shape, schema["types"][f"{PACKAGE}:index:{name}"].get("properties") or {})
    return schema
