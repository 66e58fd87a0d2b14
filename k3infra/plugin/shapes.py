"""K3ServingStack's args as typed shapes Pulumi's schema inference can read.

The inference (pulumi.provider.experimental.analyzer) reads TypedDicts: str, int,
float, bool, lists, string-keyed maps, nested TypedDicts, `pulumi.Input[T]`. The config
models (k3infra/config) are the one definition of every `k3:*` key, so the shapes are
derived from them here, never written twice: every section becomes a named object type
(`k3:nodePool.aws` -> `AwsPool`), never an untyped map. `StackKeys` is what the plugin's
args are inferred from; the descriptions, defaults and secrets the inference cannot read
are added by `schema.complete`. `K3ServingStackArgs` (`from k3infra import
K3ServingStackArgs`) and `K3HostStackArgs` are the Python components' args: the same keys,
with `receipt` also a `Receipt` object and required, and `offlineRender`
(k3infra/componentargs.py).

- keys in `k3infra.inputs.WIREABLE` and the secrets are `pulumi.Input[T]`; every other
  key is plain (it decides which resources exist), so a generated SDK types it plain;
- `Literal[...]` keys are strings (the accepted values are in the description; an enum
  would hand the component enum members instead of the strings the models check);
- `surface.args` maps a flag to a string or `true`: its values are `Any`, the only key
  the inference cannot type more closely;
- a key the model requires is required in its object.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import (Annotated, Any, Literal, NotRequired, Required, TypedDict, Union, get_args,
                    get_origin)

import pulumi
from pydantic import BaseModel

from k3infra.config import SECRET_KEYS, Secret, StackConfig
from k3infra.inputs import WIREABLE
from k3infra.receipt import Receipt

ARGS_NAME = "K3ServingStackArgs"


@dataclass(frozen=True)
class Shape:
    """One generated object type: its TypedDict, the model it mirrors, its dotted key."""

    typed_dict: type
    model: type[BaseModel]
    key: str            # `nodePool.aws`, `nodePool.aws.subnets[]`; "" for the args


def type_name(model: type[BaseModel]) -> str:
    """`AwsPoolConfig` -> `AwsPool`: the schema's type token is `k3infra:index:<name>`."""
    name = model.__name__
    return name[: -len("Config")] if name.endswith("Config") else name


def _is_input(key: str) -> bool:
    return key in WIREABLE or key in SECRET_KEYS


def _typed(ann: Any, key: str, shapes: dict[str, Shape]) -> Any:
    if get_origin(ann) is Annotated:    # a checked type (k3infra.fieldtypes): its base type
        return _typed(get_args(ann)[0], key, shapes)
    origin = get_origin(ann)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(ann) if a is not type(None)]
        if len(members) == 1:
            return _typed(members[0], key, shapes)
        if set(members) == {str, bool}:
            return Any      # a surface flag's value, or `true` for a switch
        raise TypeError(f"k3:{key}: no schema type for {ann}")
    if origin is Literal:
        return type(get_args(ann)[0])
    if origin is list:
        item = _typed(get_args(ann)[0], key + "[]", shapes)
        return list[pulumi.Input[item] if _is_input(key + "[]") else item]
    if origin is dict:
        key_type, value = get_args(ann)
        if get_origin(key_type) is Annotated:
            key_type = get_args(key_type)[0]
        if key_type is not str:
            raise TypeError(f"k3:{key}: map keys must be strings")
        return dict[str, _typed(value, key + ".*", shapes)]
    if ann is Secret:
        return str
    if ann in (str, int, float, bool):
        return ann
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return _shape(ann, key, type_name(ann), shapes)
    raise TypeError(f"k3:{key}: no schema type for {ann}")


def _shape(model: type[BaseModel], key: str, name: str, shapes: dict[str, Shape]) -> type:
    if name in shapes:
        if shapes[name].model is not model:
            raise TypeError(f"two config models map to the schema type {name}")
        return shapes[name].typed_dict
    fields: dict[str, Any] = {}
    for py_name, field in model.model_fields.items():
        sub = field.alias or py_name
        dotted = f"{key}.{sub}" if key else sub
        typed = _typed(field.annotation, dotted, shapes)
        if _is_input(dotted):
            typed = pulumi.Input[typed]
        fields[sub] = Required[typed] if field.is_required() else NotRequired[typed]
    typed_dict = TypedDict(name, fields)  # type: ignore[misc]
    typed_dict.__doc__ = (model.__doc__ or "").strip() or None
    typed_dict.__module__ = __name__
    shapes[name] = Shape(typed_dict, model, key)
    return typed_dict


def build_shapes() -> tuple[type, dict[str, Shape]]:
    """The args TypedDict (every `k3:*` key without the prefix) and every object type
    it references, by schema type name."""
    shapes: dict[str, Shape] = {}
    args = _shape(StackConfig, "", ARGS_NAME, shapes)
    return args, shapes


StackKeys, SHAPES = build_shapes()


def program_args(name: str, component: str) -> type:
    """The args of a Python program's `component`: every `k3:*` key (StackKeys), `receipt`
    required (a `Receipt`, or a receipt the project names, as `k3:receipt`), and
    `offlineRender` (set by `k3infra render` only). Not what the plugin schema is inferred
    from: a `Receipt` object does not cross languages, nor does render mode."""
    fields = dict(StackKeys.__annotations__)
    fields["receipt"] = Required[Union[str, Receipt]]
    fields["offlineRender"] = NotRequired[bool]
    typed_dict = TypedDict(name, fields)  # type: ignore[misc]
    typed_dict.__doc__ = (f"`{component}`'s args: the `k3:*` keys without the prefix, the "
                          "receipt and offlineRender (k3infra/componentargs.py).")
    typed_dict.__module__ = __name__
    return typed_dict


K3ServingStackArgs = program_args(ARGS_NAME, "K3ServingStack")
K3HostStackArgs = program_args("K3HostStackArgs", "K3HostStack")
