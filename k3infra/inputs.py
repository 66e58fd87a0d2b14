"""Which K3ServingStack args accept `pulumi.Input`, and how Output values are validated.

Plain values are validated before anything is registered. An Output value (an EKS
cluster's name, a build's image digest, a generated password) is replaced by a stand-in
of the right shape for that first pass: stand-ins only decide which resources exist and
are never rendered. Once the Outputs resolve, the whole config is validated again inside
`apply` by the same `parse_stack_config` (same messages, naming the key), the gates of
the wired keys run there too, and the objects are built from that resolved config. A
failing check raises inside `apply`, which fails the update cleanly.

The wired values reach only the leaves they land on (`wired_build`): each object is built
from two stand-in configs that differ in every wired value; where the two builds agree
the value is plain and a preview shows it, where they differ it is an Output of the
resolved build (unknown in a preview until its source is known). The resolved build must
agree with the stand-ins everywhere else, or the update fails naming the wired keys.

Keys that decide which resources exist (k3:weights.mode, k3:engine.build, replicas, ...)
stay plain: an unknown value cannot decide what a preview shows.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar, Union

import pulumi

from k3infra.config import (CONFIG_NAMESPACE, SECRET_KEYS, ConfigError, StackConfig,
                            parse_stack_config)
from k3infra.receipt import Receipt

T = TypeVar("T")

# Dotted key (`[]` for a list item) -> two stand-ins for the plain passes, as different as
# the key's check allows (other hosts and names, whole lists of other lengths), so every
# leaf a wired value reaches differs between the two builds.
WIREABLE: dict[str, tuple[Any, Any]] = {
    "weightsRevision": ("a" * 40, "b" * 40),
    "engineImage": ("wired.invalid/engine@sha256:" + "a" * 64,
                    "other-wired.invalid:5000/team/vllm@sha256:" + "b" * 64),
    "nodePool.aws.clusterName": ("wired", "other-wired"),
    "nodePool.aws.nodeRoleArn": ("arn:aws:iam::000000000000:role/wired",
                                 "arn:aws:iam::111111111111:role/other-wired"),
    "nodePool.aws.nodeRoleName": ("wired", "other-wired"),
    "nodePool.aws.subnets[].id": ("subnet-00000000", "subnet-11111111"),
    "nodePool.aws.securityGroupIds": (["sg-00000000"], ["sg-11111111", "sg-22222222"]),
    "nodePool.aws.securityGroupIds[]": ("sg-00000000", "sg-11111111"),
    "nodePool.aws.capacityBlock.reservationId": ("cr-00000000", "cr-11111111"),
    "nodePool.oci.clusterId": ("ocid1.cluster.wired", "ocid1.cluster.otherwired"),
    "nodePool.oci.compartmentId": ("ocid1.compartment.wired", "ocid1.compartment.otherwired"),
    "nodePool.oci.imageId": ("ocid1.image.wired", "ocid1.image.otherwired"),
    "nodePool.oci.placements[].subnetId": ("ocid1.subnet.wired", "ocid1.subnet.otherwired"),
    "nodePool.oci.placements[].capacityReservationId": (
        "ocid1.capacityreservation.wired", "ocid1.capacityreservation.otherwired"),
    "nodePool.oci.computeClusterId": ("ocid1.computecluster.wired",
                                      "ocid1.computecluster.otherwired"),
    "nodePool.oci.nsgIds": (["ocid1.networksecuritygroup.wired"],
                            ["ocid1.networksecuritygroup.otherwired",
                             "ocid1.networksecuritygroup.third"]),
    "nodePool.oci.nsgIds[]": ("ocid1.networksecuritygroup.wired",
                              "ocid1.networksecuritygroup.otherwired"),
    "nodePool.nebius.clusterId": ("mk8scluster-wired", "mk8scluster-otherwired"),
    "nodePool.nebius.subnetId": ("vpcsubnet-wired", "vpcsubnet-otherwired"),
    "nodePool.nebius.gpuClusterId": ("wired", "other-wired"),
    "nodePool.nebius.serviceAccountId": ("wired", "other-wired"),
}


def _is_output(value: Any) -> bool:
    return isinstance(value, pulumi.Output)


def _pattern(path: tuple) -> str:
    out = ""
    for part in path:
        out += "[]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _key(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return f"{CONFIG_NAMESPACE}:{out}"


def _split(value: Any, path: tuple, found: dict[tuple, pulumi.Output], which: int) -> Any:
    """`value` with each Output replaced by stand-in `which` (0 or 1) of its key."""
    if _is_output(value):
        pattern = _pattern(path)
        if pattern not in WIREABLE:
            raise ConfigError(_key(path), "<Output>",
                              "must be a plain value: it decides which resources exist; keys "
                              f"that accept an Output: {', '.join(sorted(WIREABLE))}")
        found[path] = value
        return copy.deepcopy(WIREABLE[pattern][which])
    if isinstance(value, dict):
        return {k: _split(v, (*path, k), found, which) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_split(v, (*path, i), found, which) for i, v in enumerate(value)]
    return value


def _set(raw: dict, path: tuple, value: Any) -> None:
    cursor: Any = raw
    for part in path[:-1]:
        cursor = cursor[part]
    cursor[path[-1]] = value


@dataclass
class StackInputs:
    """The validated config, and (when an arg was an Output) the config resolved from it.

    `plain` decides structure; `build(fn)` computes anything rendered from the config:
    `fn(plain)` when nothing is wired, else an Output of `fn(resolved)`. `alternate` is
    `plain` with the other stand-ins (see `wired_build`)."""

    plain: StackConfig
    resolved: Optional[pulumi.Output] = None
    wired: frozenset = field(default_factory=frozenset)
    alternate: Optional[StackConfig] = None

    @classmethod
    def of(cls, cfg: Union["StackInputs", StackConfig]) -> "StackInputs":
        return cfg if isinstance(cfg, StackInputs) else cls(cfg)

    def build(self, fn: Callable[[StackConfig], T]) -> Union[T, pulumi.Output]:
        return fn(self.plain) if self.resolved is None else self.resolved.apply(fn)

    def is_wired(self, prefix: str) -> bool:
        """Whether any wired key starts with `prefix` (a dotted key without `k3:`)."""
        return any(k == prefix or k.startswith(prefix + ".") or k.startswith(prefix + "[")
                   for k in self.wired)

    def with_plain(self, fn: Callable[[StackConfig], StackConfig]) -> "StackInputs":
        """The same inputs with `fn` applied to both configs (component-level defaults)."""
        resolved = None if self.resolved is None else self.resolved.apply(fn)
        alternate = None if self.alternate is None else fn(self.alternate)
        return StackInputs(fn(self.plain), resolved, self.wired, alternate)


def stack_inputs(args: dict[str, Any], receipt: Receipt,
                 check_resolved: Callable[[StackConfig, frozenset], None] = lambda c, w: None
                 ) -> StackInputs:
    """Validate `args` (Outputs allowed at WIREABLE keys): the plain pass now, the
    resolved pass inside apply, followed by `check_resolved(config, wired_keys)`."""
    found: dict[tuple, pulumi.Output] = {}
    raw: dict[str, Any] = {}
    other: dict[str, Any] = {}
    for full_key, value in args.items():
        ns, _, key = full_key.rpartition(":")
        if ns and ns != CONFIG_NAMESPACE:
            continue
        # Secrets may already be Outputs: the Secret wrapper carries them as they are.
        raw[key] = value if key in SECRET_KEYS else _split(value, (key,), found, 0)
        other[key] = value if key in SECRET_KEYS else _split(value, (key,), {}, 1)
    plain = parse_stack_config(raw, receipt=receipt)
    if not found:
        return StackInputs(plain)
    alternate = parse_stack_config(other, receipt=receipt)
    paths = list(found)
    wired = frozenset(_key(p).split(":", 1)[1] for p in paths)

    def resolve(values: list) -> StackConfig:
        resolved_raw = copy.deepcopy({k: v for k, v in raw.items() if k not in SECRET_KEYS})
        for path, value in zip(paths, values):
            _set(resolved_raw, path, value)
        resolved_raw.update({k: v for k, v in raw.items() if k in SECRET_KEYS})
        cfg = parse_stack_config(resolved_raw, receipt=receipt)
        check_resolved(cfg, wired)
        return cfg

    return StackInputs(plain, pulumi.Output.all(*found.values()).apply(resolve), wired, alternate)


# --- the wired values down to the leaves they reach ------------------------------------

Place = tuple  # keys and list indexes from the root of a built value


def _differences(a: Any, b: Any, at: Place = ()) -> list[Place]:
    """Where two builds differ: the deepest place whose structure still agrees (dicts with
    the same keys and lists of the same length are compared item by item)."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [p for k in a for p in _differences(a[k], b[k], (*at, k))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in _differences(x, y, (*at, i))]
    return [] if a == b else [at]


def _at(value: Any, place: Place) -> Any:
    for part in place:
        value = value[part]
    return value


def _with(value: Any, place: Place, leaf: Any) -> Any:
    """`value` with `leaf` at `place` (copies only the path down to it)."""
    if not place:
        return leaf
    head, rest = place[0], place[1:]
    if isinstance(value, dict):
        return {**value, head: _with(value[head], rest, leaf)}
    return [_with(v, rest, leaf) if i == head else v for i, v in enumerate(value)]


def wired_build(inputs: StackInputs, build: Callable[[StackConfig], T]) -> Union[T, Any]:
    """`build(config)` with the wired values at the leaves they reach, known everywhere
    else (a preview shows all of an object but those leaves). `build` must be pure."""
    shape = build(inputs.plain)
    if inputs.resolved is None or inputs.alternate is None:
        return shape
    places = _differences(shape, build(inputs.alternate))
    if not places:
        return shape
    if places == [()]:
        return inputs.build(build)
    wired = ", ".join(f"{CONFIG_NAMESPACE}:{k}" for k in sorted(inputs.wired))

    def agrees(real: Any) -> Any:
        # What the stand-ins decided must hold for the real values too.
        masked_real, masked_shape = real, shape
        for place in places:
            masked_real, masked_shape = _with(masked_real, place, None), _with(masked_shape, place, None)
        if masked_real != masked_shape:
            where = ".".join(map(str, (_differences(masked_shape, masked_real) or [()])[0]))
            raise ConfigError(wired, "<Output>",
                              f"the resolved value changes {where or 'the whole object'} beyond "
                              "the fields it fills, which a preview already decided from a "
                              "stand-in; pass it as a plain value")
        return real

    real = inputs.resolved.apply(build).apply(agrees)
    out: Any = shape
    for place in places:
        out = _with(out, place, real.apply(lambda r, p=place: _at(r, p)))
    return out


def built_kwargs(inputs: StackInputs, fn: Callable[[StackConfig], dict[str, Any]]) -> dict[str, Any]:
    """Keyword arguments of a cloud resource from a pure kwargs builder, the wired values
    at the leaves they reach (`wired_build`)."""
    built = wired_build(inputs, fn)
    if isinstance(built, dict):
        return built
    return {k: built.apply(lambda a, k=k: a.get(k)) for k in fn(inputs.plain)}
