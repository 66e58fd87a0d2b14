"""The stack program (`__main__.py`): Pulumi config -> K3ServingStack -> stack outputs."""
from __future__ import annotations

import pulumi
from pulumi.runtime import config as runtime_config

from k3infra.config import NAMESPACE


def read_k3_config() -> tuple[dict[str, str], list[str]]:
    """All `k3:*` keys Pulumi passed to this program, and which of them are secrets."""
    keys = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw = {k: runtime_config.get_config(k) for k in keys if k.startswith(f"{NAMESPACE}:")}
    secret = [k for k in raw if runtime_config.is_config_secret(k)]
    return raw, secret


def run() -> None:
    from k3infra.config import ConfigError, parse_stack_config
    from k3infra.engine.result import EngineBuildError
    from k3infra.gates import GateError
    from k3infra.hbm import HbmError
    from k3infra.stack import K3ServingStack

    try:
        raw, secret = read_k3_config()
        cfg = parse_stack_config(raw, tuple(secret))
        if cfg.host is not None:      # one Docker host, no cluster (k3infra/host)
            from k3infra.host.component import K3HostStack

            stack = K3HostStack(NAMESPACE, cfg)
        else:
            stack = K3ServingStack(NAMESPACE, cfg)
    except (ConfigError, GateError, HbmError, EngineBuildError) as exc:
        # The CLI prints a RunError's message alone: a refusal is not a crash, and a
        # Python traceback would bury the key, the value and what is accepted.
        raise pulumi.RunError(f"k3infra: {exc}") from exc
    for key, value in stack.outputs().items():
        pulumi.export(key, value)
