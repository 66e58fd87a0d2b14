"""The stack's `k3:*` config as a policy sees it.

Under `pulumi preview --policy-pack`, the CLI hands the analyzer the stack's config
(PULUMI_CONFIG) and pulumi-policy loads it into `pulumi.runtime` before each analysis;
`k3infra policy check` loads plan.json's `config` the same way (see runner.py). Values
are in Pulumi's wire form: strings, objects JSON-encoded, booleans "true"/"false".

A program that embeds `K3ServingStack` under another project name has no `k3:*` keys:
every reader here then falls back to the component's defaults, and the policies that
can read the same fact from a resource (the profile annotation) prefer the resource.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ValidationError
from pulumi.runtime import config as runtime_config

from k3infra.config import (CONFIG_NAMESPACE, ColdStartConfig, ConfigError, GatewayConfig,
                            ServingConfig, WeightsConfig, decode_value, MultiNodeConfig,
                            parse_stack_config, SECRET_KEYS)
from k3infra.receipt import stack_receipt


def value(key: str) -> Any:
    """`k3:<key>` decoded (JSON objects, booleans, numbers), or None when unset."""
    full_key = f"{CONFIG_NAMESPACE}:{key}"
    raw = runtime_config.get_config(full_key)
    try:
        return decode_value(full_key, raw.strip() if isinstance(raw, str) else raw)
    except ConfigError:
        return raw       # the program refuses it; a policy judges what was created


def _section(key: str, model: type[BaseModel]) -> Any:
    data = value(key)
    try:
        return model.model_validate(data if isinstance(data, dict) else {})
    except ValidationError:
        # The program refuses a malformed section before anything is created; a policy
        # judging what was created falls back to the defaults the builders would use.
        return model.model_validate({})


def serving() -> ServingConfig:
    return _section("serving", ServingConfig)


def cold_start() -> ColdStartConfig:
    return _section("coldStart", ColdStartConfig)


def weights() -> WeightsConfig:
    return _section("weights", WeightsConfig)


def gateway() -> GatewayConfig:
    return _section("gateway", GatewayConfig)


def profile() -> Optional[str]:
    found = value("profile")
    return str(found) if found is not None else None


def gpu_memory_gib() -> Optional[float]:
    found = value("gpuMemoryGib")
    try:
        return float(found) if found is not None else None
    except (TypeError, ValueError):
        return None


def license_accepted() -> bool:
    return value("acceptModelLicense") is True


def effective_profile(annotation: Optional[str]) -> str:
    """The profile a resource was rendered for: its `k3infra.dev/profile` annotation and
    the stack's `k3:profile`. Only when every source present says `custom` is it custom
    (a relabelled annotation alone cannot turn mandatory checks advisory)."""
    sources = [s for s in (annotation, profile()) if s]
    if not sources:
        return "measured"
    if all(s == "custom" for s in sources):
        return "custom"
    return next(s for s in sources if s != "custom")


def multi_node_domain_label() -> str:
    """k3:multiNode.domainLabel, or the default the builders use."""
    return _section("multiNode", MultiNodeConfig).domain_label


def project_root() -> Path:
    """The Pulumi project the pack judges: the nearest directory at or above the working
    directory with a Pulumi.yaml (the CLI starts the pack in its own directory, which a
    project keeps inside it, as this repository's policy/ is), else the working directory."""
    here = Path.cwd()
    return next((d for d in (here, *here.parents) if (d / "Pulumi.yaml").is_file()), here)


def receipt():
    """The receipt the stack names (k3:receipt), resolved as the program resolves it; read
    each time a policy runs. A bad name or file raises ReceiptError (one line)."""
    name = value("receipt")
    return stack_receipt(name if isinstance(name, str) else None, project_root()).receipt


def stack():
    """The whole `k3:*` config parsed as the program parses it (StackConfig), or None when
    there is none or the program would refuse it. Secrets are stood in for: no policy
    reads them, and `k3infra policy check` has only their placeholder."""
    keys = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw = {k: runtime_config.get_config(k) for k in keys if k.startswith(f"{CONFIG_NAMESPACE}:")}
    if not raw:
        return None
    for name in SECRET_KEYS:
        if f"{CONFIG_NAMESPACE}:{name}" in raw:
            raw[f"{CONFIG_NAMESPACE}:{name}"] = "policy-stand-in"
    try:
        return parse_stack_config(raw, receipt=receipt())
    except (ConfigError, ValueError, OSError):
        return None
