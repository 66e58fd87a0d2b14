"""Command-line numbers bounded exactly like the stack keys they mirror: a flag's
argparse `type=` is the key's own field, validated by the key's own model, so
`bench compare --tolerance-pct inf` is refused as `k3:benchmark.tolerancePct = inf`
would be (a finite number from 0 to 100). Flags that mirror no key take `seconds` or
`count`, bounded the same way (finite, positive, a ceiling).
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Callable

# Ceilings for flags that mirror no key: a day, a thousand of anything.
MAX_SECONDS = 86400
MAX_COUNT = 1024


def _number(text: str) -> Any:
    """`8` -> 8, `1.5` / `inf` / `nan` -> float (refused by the field if not finite)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text              # the field says what it accepts


def mirrors(model: type, field: str, key: str) -> Callable[[str], Any]:
    """The argparse type of a flag that sets what `key` (`model.field`) sets."""
    from pydantic import ValidationError

    def parse(text: str) -> Any:
        value = _number(text)
        try:
            checked = model.__pydantic_validator__.validate_assignment(
                model.model_construct(), field, value)
        except ValidationError as exc:
            message = exc.errors(include_url=False)[0]["msg"]
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: {message} (as the stack key "
                                             f"{key})") from None
        return getattr(checked, field)

    parse.__name__ = key           # argparse names the type in its messages
    return parse


def seconds(text: str) -> float:
    """A number of seconds: finite, more than 0, at most a day."""
    value = _number(text)
    if isinstance(value, str) or not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be a number of seconds, more "
                                         f"than 0 and at most {MAX_SECONDS}")
    return float(value)


def count(text: str, least: int = 1) -> int:
    """An integer from `least` to MAX_COUNT."""
    value = _number(text)
    if not isinstance(value, int) or not least <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be an integer from {least} to "
                                         f"{MAX_COUNT}")
    return value


def count_from(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        return count(text, least)

    parse.__name__ = "count"
    return parse
