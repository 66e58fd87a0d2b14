"""The provider entry point `provider/__main__.py` runs: Pulumi's component provider for
`K3ServingStack`, with the schema the SDK infers completed by `schema.complete`.

This is what `pulumi.provider.experimental.component_provider_host` does (analyse the
components, serve them), with one step between: the inferred schema gains descriptions,
defaults and secret markings, and its version is k3infra's own (pyproject.toml), so an
SDK generated from it carries the package version it was generated from.
"""
from __future__ import annotations

import json
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version as dist_version
from pathlib import Path
from typing import Any, Optional

import pulumi
from pulumi.provider import main as serve
from pulumi.provider.experimental.component import ComponentProvider

from k3infra.config import ConfigError
from k3infra.inputs import WIREABLE
from k3infra.plugin.component import K3ServingStack
from k3infra.plugin.schema import PACKAGE, complete

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
DESCRIPTION = ("Kimi K3 on 8x NVIDIA B300 with vLLM, deployed exactly as measured "
               "(k3infra's K3ServingStack for every Pulumi language)")


def package_version() -> str:
    """k3infra's version: the source tree's pyproject.toml (a source-based package runs
    the files beside it), else the installed distribution's."""
    if PYPROJECT.exists():
        return tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    try:
        return dist_version("k3infra")
    except PackageNotFoundError:
        raise RuntimeError("k3infra's version: no pyproject.toml beside the sources and no "
                           "installed distribution") from None


class K3Provider(ComponentProvider):
    """Serves `K3ServingStack` (type `k3infra:index:K3ServingStack`)."""

    def __init__(self) -> None:
        super().__init__([K3ServingStack], PACKAGE, None, package_version())
        self.schema = json.dumps(complete(json.loads(self.schema), DESCRIPTION), indent=2)

    def map_input_properties(self, inputs: Any, properties: dict, mapping: dict,
                             component_name: str, property_path: str) -> Any:
        # The SDK's mapping reads an object that arrives as an Output as `{}`: refuse it,
        # naming the key, as K3ServingStack refuses an Output where a plain value decides
        # which resources exist.
        for name, prop in properties.items():
            value = inputs.get(name) if isinstance(inputs, dict) else None
            path = re.sub(r"\[\d+\]", "[]", f"{property_path}.{name}" if property_path else name)
            if isinstance(value, pulumi.Output) and (prop.ref or prop.items or
                                                     prop.additional_properties):
                if path not in WIREABLE:
                    raise ConfigError(f"k3:{path}", "<Output>",
                                      "must be a plain object: it decides which resources "
                                      "exist; keys that accept an Output: "
                                      + ", ".join(sorted(WIREABLE)))
        return super().map_input_properties(inputs, properties, mapping, component_name,
                                            property_path)


def main(args: Optional[list[str]] = None) -> None:
    serve(K3Provider(), sys.argv[1:] if args is None else args)
