"""Pure comparison of a `vllm serve` command line and env with the receipt.

The receipt splits the serve configuration into the engine path (flags and env that were
measured; order and values fixed) and the serving surface (an allow-list a stack may set
freely). Anything else changes what runs on the GPUs and is drift.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Optional

from k3infra.policies.workloads import get
from k3infra.receipt import Receipt
from k3infra.serve_argv import ServeLine, parse_serve_args
from k3infra.pod_env import PRE_ENGINE_ENV_NAMES


def _switches(receipt: Receipt) -> set[str]:
    """Flags that take no value, as far as the receipt knows them."""
    return ({a.flag for a in receipt.serve.engine_args if a.value is None}
            | {a.flag for a in receipt.serve.surface.args if not a.takes_value})


def parse_serve_line(receipt: Receipt, tokens: list[str]) -> ServeLine:
    """The one serve-line parser (k3infra.serve_argv), with the receipt's switches."""
    return parse_serve_args(tokens, _switches(receipt))


def _sequence_problems(what: str, expected: list[tuple[str, Optional[str]]],
                       found: list[tuple[str, Optional[str]]], rid: str) -> list[str]:
    if found == expected:
        return []
    problems = []
    want = dict(expected)
    counts = Counter(name for name, _ in found)
    for name, _ in expected:
        if counts[name] == 0:
            problems.append(f"{what} {name} of receipt {rid} is missing")
        elif counts[name] > 1:
            problems.append(f"{what} {name} is given {counts[name]} times")
    for name, value in found:
        if counts[name] == 1 and value != want[name]:
            shown = "(no value)" if value is None else repr(value)
            expected_shown = "(a switch, no value)" if want[name] is None else repr(want[name])
            problems.append(f"{what} {name} is {shown}; receipt {rid} measured {expected_shown}")
    if not problems:
        problems.append(f"{what}s are out of the receipt's order: found "
                        f"{[n for n, _ in found]}, receipt {rid} has {[n for n, _ in expected]}")
    return problems


def serve_drift(receipt: Receipt, tokens: list[str], env: list[Mapping],
                env_from: bool = False) -> list[str]:
    """Every way `vllm serve <tokens>` with `env` departs from the receipt's engine path
    or its surface allow-list ([] when it is the measured configuration)."""
    rid = receipt.id
    line = parse_serve_line(receipt, tokens)
    problems: list[str] = []
    if line.model is None:
        problems.append("no model directory as the first `vllm serve` argument")
    for word in line.stray:
        problems.append(f"unexpected positional argument {word!r} (the model directory "
                        "is the only one)")

    engine_flags = {a.flag for a in receipt.serve.engine_args}
    problems += _sequence_problems(
        "engine flag", [(a.flag, a.value) for a in receipt.serve.engine_args],
        [(a.flag, a.value) for a in line.args if a.flag in engine_flags], rid)
    allowed = ", ".join(a.flag for a in receipt.serve.surface.args)
    for arg in line.args:
        if arg.flag in engine_flags:
            continue
        surface = receipt.serve.surface_flag(arg.flag)
        if surface is None:
            problems.append(f"`{arg}` is not an allow-listed surface flag of receipt {rid} "
                            f"({allowed}); engine-path changes need profile custom")
        elif surface.takes_value and arg.value is None:
            problems.append(f"surface flag {arg.flag} takes a value and has none")
        elif not surface.takes_value and arg.value is not None:
            problems.append(f"surface flag {arg.flag} is a switch; found a value {arg.value!r}")

    engine_env = [(e.name, e.value) for e in receipt.serve.engine_env]
    engine_names = {name for name, _ in engine_env}
    found_env: list[tuple[str, Optional[str]]] = []
    for entry in env:
        name = str(get(entry, "name"))
        if name in engine_names:
            literal = get(entry, "value")
            found_env.append((name, None if literal is None else str(literal)))
        elif name in PRE_ENGINE_ENV_NAMES:
            continue            # the gate's and start script's, read before `exec vllm serve`
        elif name not in receipt.serve.surface.env:
            problems.append(f"env {name} is not an allow-listed surface variable of receipt "
                            f"{rid} ({', '.join(receipt.serve.surface.env)}); engine-path "
                            "env needs profile custom")
    problems += _sequence_problems("engine env", engine_env, found_env, rid)
    if env_from:
        problems.append("envFrom injects variables the allow-list cannot see; set each "
                        "variable by name")
    return problems
