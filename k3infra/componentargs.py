"""The one shape of every k3infra component: `Component(name, args, opts=None)`.

`args` is the component's typed args (a TypedDict, camelCase keys, `pulumi.Input` where a
value may be wired, as pulumi-eks and pulumi-awsx take theirs); what the component waits
for goes in `opts` (`pulumi.ResourceOptions(depends_on=...)`) and is recorded on every
child. A key named `...DependsOn` in args is not the component's dependencies: it is what
one child (a Job, the serving workload) waits for on top of them.

The two top-level components (`K3ServingStack`, `K3HostStack`) take the `k3:*` keys
(`K3ServingStackArgs`, k3infra/plugin/shapes.py) with the receipt and `offlineRender`,
or a config validated already (`StackConfigArgs`: the stack program's, and tests').
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NotRequired, Optional, Required, TypedDict, Union

from k3infra.config import StackConfig
from k3infra.inputs import StackInputs
from k3infra.receipt import Receipt, stack_receipt

_MISSING = object()


def required(args: Mapping[str, Any], key: str, component: str, kind: Any = None,
             what: str = "") -> Any:
    """args[key], or a TypeError naming the component, the key and what it must be."""
    value = args.get(key, _MISSING) if isinstance(args, Mapping) else _MISSING
    if value is _MISSING or (kind is not None and not isinstance(value, kind)):
        got = "missing" if value is _MISSING else f"a {type(value).__name__}"
        if not what:
            kinds = kind if isinstance(kind, tuple) else (kind,)
            what = "a " + " or a ".join(k.__name__ for k in kinds)
        raise TypeError(f"{component}: args[{key!r}] must be {what} ({got})")
    return value


class StackConfigArgs(TypedDict):
    """A top-level component's args from a config validated already (the stack program
    parses the `k3:*` keys Pulumi passes before it builds anything)."""

    config: Required[Union[StackConfig, StackInputs]]
    receipt: Required[Receipt]     # the receipt the config was validated against
    offlineRender: NotRequired[bool]


# Only in a Python program: not `k3:*` keys (config is the keys, validated).
PROGRAM_KEYS = ("config", "offlineRender")
RECEIPT_WHAT = ("the Receipt this instance deploys (k3infra.receipt.load_receipt() for the "
                "shipped one), or a receipt the project names (a shipped id or a .yaml path, "
                "as k3:receipt)")


@dataclass(frozen=True)
class TopLevelArgs:
    """A top-level component's args, taken apart: either `keys` (the `k3:*` keys, the
    receipt's name among them when one was named) or `config` (validated already)."""

    receipt: Receipt
    offline_render: bool
    keys: Optional[dict[str, Any]] = None
    config: Union[StackConfig, StackInputs, None] = None


def top_level_args(args: Mapping[str, Any], component: str) -> TopLevelArgs:
    """`args` of K3ServingStack / K3HostStack: the receipt (a Receipt, or its name resolved
    in the project as the stack program resolves k3:receipt), `offlineRender` (set by
    `k3infra render` only: gates then warn instead of refusing and builds show
    placeholder digests; `pulumi up` never sets it), and the keys or the config."""
    if not isinstance(args, Mapping):
        raise TypeError(f"{component}: args must be {component}Args (the k3:* keys with the "
                        f"receipt) or StackConfigArgs, not a {type(args).__name__}")
    receipt = required(args, "receipt", component, (Receipt, str), RECEIPT_WHAT)
    offline_render = args.get("offlineRender", False)
    if not isinstance(offline_render, bool):
        raise TypeError(f"{component}: args['offlineRender'] must be a bool "
                        f"(a {type(offline_render).__name__})")
    if "config" in args:
        config = required(args, "config", component, (StackConfig, StackInputs),
                          "a StackConfig (k3infra.config.parse_stack_config)")
        extra = sorted(set(args) - {"config", "receipt", "offlineRender"})
        if extra:
            raise TypeError(f"{component}: args['config'] is the whole validated config; "
                            f"{', '.join(extra)} cannot be given beside it")
        if not isinstance(receipt, Receipt):
            raise TypeError(f"{component}: with args['config'], args['receipt'] must be the "
                            "Receipt the config was validated against")
        return TopLevelArgs(receipt, offline_render, config=config)
    keys = {k: v for k, v in args.items() if k not in PROGRAM_KEYS}
    if isinstance(receipt, Receipt):
        del keys["receipt"]          # the object itself: no name to resolve
    else:
        receipt = stack_receipt(receipt).receipt
    return TopLevelArgs(receipt, offline_render, keys=keys)
