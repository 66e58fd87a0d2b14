"""Which K3ServingStack args accept `pulumi.Input`, and how Output values are validated.

Plain values are validated before anything is registered. An Output value (an EKS
cluster's name, a build's image digest, a generated password) is replaced by a stand-in
of the right shape for that first pass: stand-ins only decide which resources exist and
are never rendered. Once the Outputs resolve, the whole config is validated again inside
`apply` by the same `parse_stack_config` (same messages, naming the key), the gates of
the wired keys run there too, and every manifest is built from that resolved config. A
failing check raises inside `apply`, which fails the update cleanly.

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

# Dotted key (`[]` for a list item) -> stand-in used for the plain pass.
WIREABLE: dict[str, Any] = {
    "weightsRevision": "a" * 40,
    "engineImage": "wired.invalid/engine@sha256:" + "a" * 64,
    "nodePool.aws.clusterName": "wired",
    "nodePool.aws.nodeRoleArn": "arn:aws:iam::000000000000:role/wired",
    "nodePool.aws.nodeRoleName": "wired",
    "nodePool.aws.subnets[].id": "subnet-00000000",
    "nodePool.aws.securityGroupIds": ["sg-00000000"],
    "nodePool.aws.securityGroupIds[]": "sg-00000000",
    "nodePool.aws.capacityBlock.reservationId": "cr-00000000",
    "nodePool.oci.clusterId": "ocid1.cluster.wired",
    "nodePool.oci.compartmentId": "ocid1.compartment.wired",
    "nodePool.oci.imageId": "ocid1.image.wired",
    "nodePool.oci.placements[].subnetId": "ocid1.subnet.wired",
    "nodePool.oci.placements[].capacityReservationId": "ocid1.capacityreservation.wired",
    "nodePool.oci.computeClusterId": "ocid1.computecluster.wired",
    "nodePool.oci.nsgIds": ["ocid1.networksecuritygroup.wired"],
    "nodePool.oci.nsgIds[]": "ocid1.networksecuritygroup.wired",
    "nodePool.nebius.clusterId": "mk8scluster-wired",
    "nodePool.nebius.subnetId": "vpcsubnet-wired",
    "nodePool.nebius.gpuClusterId": "wired",
    "nodePool.nebius.serviceAccountId": "wired",
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


def _split(value: Any, path: tuple, found: dict[tuple, pulumi.Output]) -> Any:
    if _is_output(value):
        pattern = _pattern(path)
        if pattern not in WIREABLE:
            raise ConfigError(_key(path), "<Output>",
                              "must be a plain value: it decides which resources exist; keys "
                              f"that accept an Output: {', '.join(sorted(WIREABLE))}")
        found[path] = value
        return copy.deepcopy(WIREABLE[pattern])
    if isinstance(value, dict):
        return {k: _split(v, (*path, k), found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_split(v, (*path, i), found) for i, v in enumerate(value)]
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
    `fn(plain)` when nothing is wired, else an Output of `fn(resolved)`."""

    plain: StackConfig
    resolved: Optional[pulumi.Output] = None
    wired: frozenset = field(default_factory=frozenset)

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
        return StackInputs(fn(self.plain), resolved, self.wired)


def stack_inputs(args: dict[str, Any], receipt: Receipt,
                 check_resolved: Callable[[StackConfig, frozenset], None] = lambda c, w: None
                 ) -> StackInputs:
    """Validate `args` (Outputs allowed at WIREABLE keys): the plain pass now, the
    resolved pass inside apply, followed by `check_resolved(config, wired_keys)`."""
    found: dict[tuple, pulumi.Output] = {}
    raw: dict[str, Any] = {}
    for full_key, value in args.items():
        ns, _, key = full_key.rpartition(":")
        if ns and ns != CONFIG_NAMESPACE:
            continue
        # Secrets may already be Outputs: the Secret wrapper carries them as they are.
        raw[key] = value if key in SECRET_KEYS else _split(value, (key,), found)
    plain = parse_stack_config(raw, receipt=receipt)
    if not found:
        return StackInputs(plain)
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

    return StackInputs(plain, pulumi.Output.all(*found.values()).apply(resolve), wired)


def built_kwargs(inputs: StackInputs, fn: Callable[[StackConfig], dict[str, Any]]) -> dict[str, Any]:
    """Keyword arguments of a cloud resource from a pure kwargs builder: as they are when
    nothing is wired, else one Output per argument (from the resolved config)."""
    plain = fn(inputs.plain)
    if inputs.resolved is None:
        return plain
    built = inputs.build(fn)
    return {k: built.apply(lambda a, k=k: a.get(k)) for k in plain}
