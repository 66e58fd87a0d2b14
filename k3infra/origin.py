"""Where each value of a container comes from (issue 47, point 1).

The builders of the serving pod, the prefetch Job and the benchmark Job tag every part of
a container that decides what runs (the image, each group of command and argument words,
each env entry) with its origin, and `container` makes the manifest from those parts: the
manifest is the untagged projection, so a tag cannot disagree with the value it
describes. While a render records (`recording`, k3infra/render.py) the tagged parts are
kept as well; `k3infra render --show` (k3infra/containerview.py) prints them beside the
container the render registered. Nothing else reads the tags.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

# The kinds of origin, in the words the view prints.
ENGINE_PATH = "receipt engine path"   # the measured serve flags and env: no stack changes them
SURFACE = "receipt surface"           # a name the receipt allows a stack to set
RECEIPT = "receipt"                   # another receipt field (the model, the workload)
STACK = "stack"                       # a k3: key, with its value
K3INFRA = "k3infra"                   # k3infra's own choice, or its pod runtime


@dataclass(frozen=True)
class Origin:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


def engine_path(why: str) -> Origin:
    return Origin(ENGINE_PATH, why)


def receipt(field: str, why: str = "") -> Origin:
    return Origin(RECEIPT, field + (f" ({why})" if why else ""))


def stack(key: str, value: Any, why: str = "") -> Origin:
    """A `k3:` key (dotted path, without the prefix) and the value this stack gives it."""
    return Origin(STACK, f"k3:{key} = {_shown(value)}" + (f" ({why})" if why else ""))


def k3infra(why: str) -> Origin:
    return Origin(K3INFRA, why)


def engine_image(cfg: Any) -> Origin:
    """Where the engine image comes from (k3infra.engine.resolve_engine's choice, which
    this follows: a test holds them together): `k3:engineImage`, or the digest a build
    pushes to `k3:engine.registry`."""
    if cfg.profile == "upstream" or cfg.engine.build == "prebuilt":
        return stack("engineImage", cfg.engine_image)
    return k3infra(f"the digest the {cfg.engine.build} build pushes to "
                   f"k3:engine.registry = {cfg.engine.registry} (k3:engine.build = "
                   f"{cfg.engine.build})")


def surface(value_from: Origin) -> Origin:
    """A name on the receipt's surface allow-list; `value_from` says where its value
    comes from (the stack or k3infra)."""
    return Origin(f"{SURFACE}, {value_from.kind}", value_from.detail)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class Tagged:
    """One part of a container with its origin: a tuple of command or argument words, an
    env entry, or the image."""

    value: Any
    origin: Origin


def words(origin: Origin, *values: Any) -> Tagged:
    return Tagged(tuple(values), origin)


def env(name: str, value: Any, origin: Origin) -> Tagged:
    return Tagged({"name": name, "value": value}, origin)


def secret_env(name: str, secret: Any, key: str, origin: Origin) -> Tagged:
    """A variable read from a Kubernetes Secret (its value never in the pod spec)."""
    return Tagged({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}},
                  origin)


def argv(parts: Iterable[Tagged]) -> list:
    """The words of tagged word groups, in order."""
    return [w for p in _checked(parts, tuple) for w in p.value]


def entries(parts: Iterable[Tagged]) -> list[dict]:
    """The env entries of tagged env parts, in order."""
    return [p.value for p in _checked(parts, dict)]


def _checked(parts: Iterable[Tagged], kind: type) -> list[Tagged]:
    parts = list(parts)
    for p in parts:
        if not isinstance(p, Tagged) or not isinstance(p.value, kind):
            raise TypeError(f"not a tagged {kind.__name__} part: {p!r} (k3infra.origin: every "
                            "value of a container says where it comes from)")
    return parts


@dataclass(frozen=True)
class ContainerSource:
    """A container as its builder tagged it."""

    name: str
    image: Tagged
    command: tuple[Tagged, ...]
    args: tuple[Tagged, ...]
    env: tuple[Tagged, ...]

    def projection(self) -> dict:
        """What the manifest holds for these four fields."""
        return {"image": self.image.value, "command": argv(self.command),
                "args": argv(self.args), "env": entries(self.env)}


_TAGGED_LISTS = {"command": argv, "args": argv, "env": entries}
# The containers built while a render records (None: nobody records, as in `pulumi up`).
# A module global, not a context variable: Pulumi may build an object in an Output's
# callback on another thread, and the render still wants it.
_recording: Optional[list[ContainerSource]] = None


def container(spec: dict) -> dict:
    """The container manifest of `spec`: `image` a Tagged value, `command`, `args` and
    `env` (where present) lists of Tagged parts; the same keys in the same order, each
    tagged field replaced by its projection, every other field as given."""
    if not isinstance(spec.get("image"), Tagged):
        raise TypeError(f"container {spec.get('name')}: the image is not tagged with its origin")
    out = {}
    for key, value in spec.items():
        if key == "image":
            out[key] = value.value
        elif key in _TAGGED_LISTS:
            out[key] = _TAGGED_LISTS[key](value)
        else:
            out[key] = value
    if _recording is not None:
        _recording.append(ContainerSource(
            spec["name"], spec["image"], tuple(spec.get("command", ())),
            tuple(spec.get("args", ())), tuple(spec.get("env", ()))))
    return out


@contextmanager
def recording() -> Iterator[list[ContainerSource]]:
    """Keep every container built inside the block (the render's own run)."""
    global _recording
    outer, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = outer
