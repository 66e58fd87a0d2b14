"""Run the policy pack offline over a render's plan.json, the way CrossGuard runs it.

For each recorded resource the runner builds exactly what pulumi-policy's analyzer
server builds from the engine's gRPC request: the inputs go through a protobuf Struct
(numbers become floats), `deserialize_properties` and `unknown_checking_proxy`, into a
`ResourceValidationArgs`; every resource becomes a `PolicyResource` with its parent and
dependencies for the stack policies' `StackValidationArgs`. Policy config is reconciled
as the CLI does for `--policy-pack-config` (schema defaults, then the given values), and
the stack's `k3:*` config is loaded into `pulumi.runtime` as the analyzer process has it.
"""
from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from inspect import isawaitable
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from pydantic import Field, RootModel

from k3infra.fileformats import FileModel, Text, load_json, validate
from k3infra.config import to_pulumi_config
from k3infra.policies import POLICIES

from pulumi_policy import (EnforcementLevel, Policy, PolicyCustomTimeouts, PolicyResource,
                           PolicyResourceOptions, ResourceValidationArgs,
                           ResourceValidationPolicy, StackValidationArgs, StackValidationPolicy)
from google.protobuf import json_format, struct_pb2
from pulumi.runtime import config as runtime_config
from pulumi_policy.deserialize import deserialize_properties
from pulumi_policy.policy import _NotApplicableError
from pulumi_policy.proxy import unknown_checking_proxy, UnknownValueError

STACK_WIDE = "(stack)"


class PolicyRunError(RuntimeError):
    """A policy raised instead of reporting: a bug to fix, never a pass."""


@dataclass(frozen=True)
class Finding:
    policy: str
    level: str              # "mandatory" | "advisory"
    urn: str                # "" for a stack-wide finding
    resource: str           # "<Kind> <pulumi name>" or "(stack)"
    message: str
    could_not_run: bool = False   # a value unknown during preview (CrossGuard: advisory)


@dataclass
class Report:
    stack: str
    findings: list[Finding] = field(default_factory=list)
    not_applicable: list[tuple[str, str, str]] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)
    resources: int = 0

    @property
    def mandatory(self) -> list[Finding]:
        return [f for f in self.findings if f.level == EnforcementLevel.MANDATORY.value]

    @property
    def advisory(self) -> list[Finding]:
        return [f for f in self.findings if f.level == EnforcementLevel.ADVISORY.value]

    def by_policy(self, name: str) -> list[Finding]:
        return [f for f in self.findings if f.policy == name]


# --- plan and config --------------------------------------------------------------------

class _PlanResource(FileModel):
    type: Text(512)
    name: Text(1024)
    urn: Text(4096)
    parent: Optional[Text(4096)] = None
    inputs: Optional[dict[Text(1024), Any]] = None
    dependsOn: Optional[list[Text(4096)]] = Field(default=None, max_length=100_000)
    customTimeouts: Optional[dict[Text(64), Optional[Text(64)]]] = None


class PlanFile(FileModel):
    """plan.json of `k3infra render --out` (docs/policy.md): the keys the runner reads."""

    stack: Text(256) = ""
    config: dict[Text(1024), Any] = Field(default_factory=dict, max_length=10_000)
    resources: list[_PlanResource] = Field(max_length=100_000)


class PolicyConfigFile(RootModel):
    """`--policy-config`: `{"<policy>"|"all": "<level>" | {"enforcementLevel": ..., ...}}`."""

    root: dict[Text(256), Union[Text(64), dict[Text(256), Any]]] = Field(max_length=1024)


def load_plan(path: Path) -> dict:
    """plan.json of a render directory (or the file itself): the one bounded reader and
    the PlanFile model (k3infra.fileformats); FileFormatError (a ValueError) in one line."""
    path = Path(path)
    file = path / "plan.json" if path.is_dir() else path
    if not os.path.lexists(file):
        raise FileNotFoundError(f"{path}: no plan.json (write one with `k3infra render "
                                "--stack NAME --out DIR`)")
    plan = load_json(file, "render plan")
    validate(plan, PlanFile, file)
    return plan


def load_policy_config(path: Path) -> dict:
    return dict(load_json(path, "policy config", PolicyConfigFile).root)


@dataclass(frozen=True)
class PolicySettings:
    level: EnforcementLevel
    config: dict[str, Any]


def reconcile_config(policies: list[Policy],
                     pack_config: Optional[Mapping[str, Any]] = None) -> dict[str, PolicySettings]:
    """Per policy: its enforcement level and config, as `--policy-pack-config` would set
    them: `{"<policy>" | "all": "<level>" | {"enforcementLevel": ..., "<property>": ...}}`."""
    pack_config = dict(pack_config or {})
    names = {p.name for p in policies}
    for key in pack_config:
        if key != "all" and key not in names:
            raise ValueError(f"policy config names {key!r}, which is not a policy of this "
                             f"pack ({', '.join(sorted(names))})")
    out = {}
    for p in policies:
        level = p.enforcement_level or EnforcementLevel.ADVISORY
        props = {k: v["default"] for k, v in (p.config_schema.properties.items()
                                              if p.config_schema else []) if "default" in v}
        for key in ("all", p.name):
            given = pack_config.get(key)
            if given is None:
                continue
            if isinstance(given, str):
                given = {"enforcementLevel": given}
            if not isinstance(given, Mapping):
                raise ValueError(f"policy config {key!r}: expected a level or an object")
            for k, v in given.items():
                if k == "enforcementLevel":
                    try:
                        level = EnforcementLevel(v)
                    except ValueError:
                        raise ValueError(f"policy config {key!r}: enforcementLevel {v!r} is "
                                         f"not one of {[e.value for e in EnforcementLevel]}")
                elif key == p.name:
                    known = p.config_schema.properties if p.config_schema else {}
                    if k not in known:
                        raise ValueError(f"policy config {key!r}: unknown property {k!r} "
                                         f"(known: {', '.join(known) or 'none'})")
                    props[k] = v
        out[p.name] = PolicySettings(level, props)
    return out


# --- what pulumi-policy's analyzer builds from a gRPC request ---------------------------

def wire_props(inputs: Mapping[str, Any]) -> Any:
    """Inputs as the analyzer sees them: through a protobuf Struct, deserialized and
    wrapped in the proxy that raises on values unknown during a preview."""
    struct = struct_pb2.Struct()
    struct.update(dict(inputs))
    return unknown_checking_proxy(deserialize_properties(json_format.MessageToDict(struct)))


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")


def _seconds(duration: Optional[str]) -> float:
    if not duration:
        return 0.0
    scale = {"h": 3600, "m": 60, "s": 1}
    return sum(float(n) * scale[u] for n, u in _DURATION.findall(duration))


def resource_options(resource: Mapping[str, Any]) -> PolicyResourceOptions:
    timeouts = resource.get("customTimeouts") or {}
    return PolicyResourceOptions(
        protect=False, ignore_changes=[], delete_before_replace=None, aliases=[],
        custom_timeouts=PolicyCustomTimeouts(_seconds(timeouts.get("create")),
                                             _seconds(timeouts.get("update")),
                                             _seconds(timeouts.get("delete"))),
        additional_secret_outputs=[], parent=resource.get("parent"))


def policy_resources(plan: Mapping[str, Any]) -> list[PolicyResource]:
    """Every recorded resource as a PolicyResource, parents and dependencies linked."""
    out: dict[str, PolicyResource] = {}
    raw = plan["resources"]
    for r in raw:
        out[r["urn"]] = PolicyResource(r["type"], wire_props(r.get("inputs") or {}), r["urn"],
                                       r["name"], resource_options(r), None, None, [], {})
    for r in raw:
        res = out[r["urn"]]
        res.parent = out.get(r.get("parent") or "")
        res.dependencies = [out[d] for d in r.get("dependsOn") or [] if d in out]
    return list(out.values())


def _display(resource_type: str, name: str) -> str:
    return f"{resource_type.rsplit(':', 1)[-1]} {name}"


# --- running ----------------------------------------------------------------------------

@contextmanager
def loaded_stack_config(config: Mapping[str, Any]) -> Iterator[None]:
    """The plan's `k3:*` config in pulumi.runtime (as PULUMI_CONFIG puts it there in the
    analyzer process) for the duration, the previous config restored after."""
    saved = dict(runtime_config.CONFIG.get())
    runtime_config.set_all_config(to_pulumi_config(dict(config)))
    try:
        yield
    finally:
        runtime_config.set_all_config(saved)


def _call(policy: Policy, args: Any, report: Any) -> None:
    result = policy.validate(args, report)
    if isawaitable(result):
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(result)
        finally:
            loop.close()


def check_plan(plan: Mapping[str, Any], policies: Optional[Iterable[Policy]] = None,
               pack_config: Optional[Mapping[str, Any]] = None) -> Report:
    """Every policy over every resource (resource policies) and over the whole plan
    (stack policies); findings carry the policy name, level, resource and message."""
    # The one private name of the SDK here: `args.not_applicable()` raises it and
    # pulumi-policy exports no public type for it; the analyzer server catches the same
    # class. `make e2e` runs the pack through the real analyzer (`pulumi preview
    # --policy-pack`), so a change in the SDK shows there first.

    if policies is None:
        policies = POLICIES
    policies = list(policies)
    settings = reconcile_config(policies, pack_config)
    report = Report(str(plan.get("stack", "")), policies=[p.name for p in policies],
                    resources=len(plan["resources"]))
    shown_by_urn = {r["urn"]: _display(r["type"], r["name"]) for r in plan["resources"]}

    def run(policy: Policy, args: Any, urn: str, shown: str) -> None:
        level = settings[policy.name].level
        if level == EnforcementLevel.REMEDIATE:
            level = EnforcementLevel.MANDATORY   # as the analyzer reports it

        def violation(message: str, at: Optional[str] = None) -> None:
            resource = shown_by_urn.get(at, at) if at else shown
            report.findings.append(Finding(policy.name, level.value, at or urn, resource,
                                           message))

        try:
            _call(policy, args, violation)
        except UnknownValueError as exc:
            report.findings.append(Finding(policy.name, EnforcementLevel.ADVISORY.value, urn,
                                           shown, f"can't run during preview: {exc.message}",
                                           could_not_run=True))
        except _NotApplicableError as exc:
            report.not_applicable.append((policy.name, urn, exc.reason or ""))
        except Exception as exc:
            raise PolicyRunError(f"policy {policy.name} failed on {shown}: "
                                 f"{type(exc).__name__}: {exc}") from exc

    with loaded_stack_config(plan.get("config") or {}):
        stack_resources = policy_resources(plan)
        for policy in policies:
            s = settings[policy.name]
            if s.level == EnforcementLevel.DISABLED:
                continue
            if isinstance(policy, ResourceValidationPolicy):
                for r in plan["resources"]:
                    args = ResourceValidationArgs(r["type"], wire_props(r.get("inputs") or {}),
                                                  r["urn"], r["name"], resource_options(r),
                                                  None, dict(s.config), {})
                    run(policy, args, r["urn"], _display(r["type"], r["name"]))
            elif isinstance(policy, StackValidationPolicy):
                run(policy, StackValidationArgs(stack_resources, dict(s.config), {}), "",
                    STACK_WIDE)
    return report


def check_dir(path: Path, pack_config: Optional[Mapping[str, Any]] = None) -> Report:
    return check_plan(load_plan(path), pack_config=pack_config)
