"""The `vllm serve` command line of a serving StatefulSet, rendered or running: one reader
and one parser for the render summary, `k3infra verify` (k3infra.live.drift), the
benchmark receipt writer and the policy pack (k3infra.policies.serve_args); and of a
Docker host's server container, whose command runs the weights gate first (k3infra/host:
render, `verify --docker-host`, host policies)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import AbstractSet, Optional, Sequence

SERVING_CONTAINER = "vllm"


def serve_argv(container: dict) -> list[str]:
    return [*(container.get("command") or []), *(container.get("args") or [])]


def serve_args_of(argv: Sequence[str]) -> Optional[list[str]]:
    """The arguments of `vllm serve` in a container command line: after `vllm serve`
    itself, or after `$0` of `sh -c '... exec vllm serve "$@"' $0 ARGS...` (the gate
    runs first). None when the command runs no `vllm serve`."""
    argv = [str(t) for t in argv]
    for i in range(len(argv) - 1):
        if argv[i] == "vllm" and argv[i + 1] == "serve":
            return argv[i + 2:]
    if len(argv) >= 4 and argv[1] == "-c" and "vllm" in argv[2]:
        script = shlex.split(argv[2], posix=True)
        if any(script[j:j + 3] == ["vllm", "serve", "$@"] for j in range(len(script))):
            return argv[4:]
    return None


@dataclass(frozen=True)
class Arg:
    flag: str
    value: Optional[str]

    def __str__(self) -> str:
        return self.flag if self.value is None else f"{self.flag} {self.value}"


@dataclass
class ServeLine:
    model: Optional[str]
    args: list[Arg]
    stray: list[str]        # positionals after the model directory


def parse_serve_args(tokens: Sequence[str], switches: AbstractSet[str] = frozenset()) -> ServeLine:
    """Tokens after `vllm serve` -> model directory, flags with values, stray words. A
    flag not in `switches` (flags known to take no value) takes the next word as its value
    unless that word is itself a flag (how argparse would most likely read it)."""
    tokens = [str(t) for t in tokens]
    model: Optional[str] = None
    args: list[Arg] = []
    stray: list[str] = []
    i = 0
    while i < len(tokens):
        word = tokens[i]
        if word.startswith("--"):
            flag, eq, inline = word.partition("=")
            if eq:
                args.append(Arg(flag, inline))
            elif flag in switches or i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                args.append(Arg(flag, None))
            else:
                args.append(Arg(flag, tokens[i + 1]))
                i += 1
        elif model is None and not args:
            model = word
        else:
            stray.append(word)
        i += 1
    return ServeLine(model, args, stray)


def parse_serve(argv: Sequence[str]) -> tuple[Optional[str], list[tuple[str, Optional[str]]]]:
    """(model directory, [(flag, value or None)]) of a `vllm serve` command line; a stray
    positional is kept as a flag without a value, so a comparison reports it as drift."""
    argv = list(argv)
    if "serve" not in argv:
        return None, []
    line = parse_serve_args(argv[argv.index("serve") + 1:])
    return line.model, [(a.flag, a.value) for a in line.args] + [(w, None) for w in line.stray]
