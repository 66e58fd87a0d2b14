"""The `vllm serve` command line of a serving StatefulSet, rendered or running: one reader
and one parser for the render summary, `k3infra verify` (k3infra.live.drift) and the
benchmark receipt writer; and of a Docker host's server container, whose command runs
the weights gate first (k3infra/host: render, `verify --docker-host`, host policies)."""
from __future__ import annotations

import shlex
from typing import Optional, Sequence

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


def parse_serve(argv: Sequence[str]) -> tuple[Optional[str], list[tuple[str, Optional[str]]]]:
    """(model directory, [(flag, value or None)]) of a `vllm serve` command line."""
    argv = list(argv)
    if "serve" not in argv:
        return None, []
    rest = argv[argv.index("serve") + 1:]
    model = rest.pop(0) if rest and not rest[0].startswith("--") else None
    flags: list[tuple[str, Optional[str]]] = []
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok.startswith("--") and "=" in tok:
            flag, value = tok.split("=", 1)
            flags.append((flag, value))
        elif tok.startswith("--"):
            nxt = rest[i + 1] if i + 1 < len(rest) else None
            if nxt is not None and not nxt.startswith("--"):
                flags.append((tok, nxt))
                i += 1
            else:
                flags.append((tok, None))
        else:
            flags.append((tok, None))          # a stray positional: reported as drift
        i += 1
    return model, flags
