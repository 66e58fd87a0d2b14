"""Run a Pulumi program (a callable) under the SDK's mocks and record every registration
with what the engine would store: type, name, URN, parent, provider reference,
dependencies (URNs) and inputs."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pulumi
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor


@dataclass
class Registered:
    type: str
    name: str
    urn: str
    parent: Optional[str]
    provider: Optional[str]
    dependencies: list[str]
    inputs: dict


@dataclass
class Recording:
    resources: list[Registered] = field(default_factory=list)

    def of_type(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.type == typ]

    def named(self, name: str) -> Registered:
        (found,) = [r for r in self.resources if r.name == name]
        return found

    def kubernetes(self) -> list[Registered]:
        """Kubernetes objects (not the provider, not Helm chart components)."""
        return [r for r in self.resources if r.type.startswith("kubernetes:")
                and not r.type.startswith("kubernetes:helm")]

    def urns_under(self, parent_urn: str) -> set[str]:
        """URNs of every resource below `parent_urn` (children, grandchildren, ...)."""
        found, frontier = set(), {parent_urn}
        while frontier:
            kids = {r.urn for r in self.resources if r.parent in frontier}
            frontier = kids - found
            found |= kids
        return found


class _Outputs(pulumi.runtime.Mocks):
    def __init__(self, outputs: Optional[Callable[[Any], dict]] = None):
        self.outputs = outputs

    def new_resource(self, args):
        extra = self.outputs(args) if self.outputs else {}
        return f"{args.name}-id", {**dict(args.inputs), **extra}

    def call(self, args):
        return {}


def record(program: Callable[[], Any], *, preview: bool = False,
           outputs: Optional[Callable[[Any], dict]] = None) -> Recording:
    """Run `program` to completion; raise what it (or any apply) raises."""
    recording = Recording()
    mocks = _Outputs(outputs)

    class Monitor(MockMonitor):
        def RegisterResource(self, request):  # noqa: N802 (gRPC name)
            response = super().RegisterResource(request)
            recording.resources.append(Registered(
                request.type, request.name, response.urn, request.parent or None,
                request.provider or None, list(request.dependencies),
                rpc.deserialize_properties(request.object)))
            return response

    asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi.runtime.set_mocks(mocks, project="consumer", stack="test", preview=preview,
                             monitor=Monitor(mocks))

    @pulumi.runtime.test
    def run():
        built = program()
        if isinstance(built, pulumi.Output):
            return built
        return pulumi.Output.from_input(None)

    run()
    return recording
