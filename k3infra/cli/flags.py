"""Command-line numbers bounded exactly like the stack keys they mirror: a flag's
argparse `type=` is the key's own field, validated by the key's own model, so
`bench compare --tolerance-pct inf` is refused as `k3:benchmark.tolerancePct = inf`
would be (a finite number from 0 to 100). Flags that mirror no key take `seconds` or
`count`, bounded the same way (finite, positive, a ceiling).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from k3infra.podcommon import (CREDENTIALS_IN_FLAG, output_directory, output_target,
                               url_credentials)
# No `typing` import: the annotations are strings (the __future__ import above), and
# `weights verify` (which builds this module's flags) must not pay for it (issue 18).

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


def mirrors(model: str, field: str, key: str, comma_list: bool = False) -> Callable[[str], Any]:
    """The argparse type of a flag that sets what `key` sets: field `field` of the config
    section `model` (a class name in k3infra.config, imported when a value is parsed).
    `comma_list`: the flag is `8,16,32` for a list key (returned as that text, checked)."""
    def check(section, value: Any) -> tuple[Any, Any]:
        # pydantic and the config models (k3infra.config with pydantic: 0.24 s, python -X
        # importtime) load when a value is parsed, not when the parser is built: every
        # command builds its flags, `weights verify` among them.
        from pydantic import ValidationError

        checked = section.model_construct()
        try:
            section.__pydantic_validator__.validate_assignment(checked, field, value)
        except ValidationError as exc:
            # The section's own cross-key rules (no location: one identity of a store, a
            # request within its limit) judge keys this flag does not set; they run once
            # the field passed and has been assigned.
            errors = [e for e in exc.errors(include_url=False) if e["loc"]]
            if errors:
                return None, errors[0]
        return getattr(checked, field), None

    def parse(text: str) -> Any:
        import k3infra.config as config      # when a value is parsed: see check()

        section = getattr(config, model)
        value = ([_number(v.strip()) for v in text.split(",") if v.strip()] if comma_list
                 else _number(text))
        got, error = check(section, value)
        if error is not None and error["type"] == "string_type" and not comma_list:
            got, error = check(section, text)     # a text key (a region `1`): as typed
        if error is not None:
            message = error["msg"].removeprefix("Value error, ")
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: {message} (as the stack key "
                                             f"{key})") from None
        return ",".join(map(str, got)) if comma_list else got

    parse.__name__ = key           # argparse names the type in its messages
    return parse


def url(text: str) -> str:
    """A URL flag (`weights mirror --to`, `--endpoint`): refused, its credentials masked,
    by the stack keys' own rule (podcommon.url_credentials), before anything can print it."""
    masked = url_credentials(text)
    if masked is not None:
        raise argparse.ArgumentTypeError(f"{masked[:200]!r} {CREDENTIALS_IN_FLAG}")
    return text


def seconds(text: str) -> float:
    """A number of seconds: finite, more than 0, at most a day."""
    value = _number(text)
    if isinstance(value, str) or not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be a number of seconds, more "
                                         f"than 0 and at most {MAX_SECONDS}")
    return float(value)


def count(text: str) -> int:
    """An integer from 1 to MAX_COUNT."""
    return count_from(1)(text)


def count_from(least: int, most: int = MAX_COUNT) -> Callable[[str], int]:
    """An integer from `least` to `most`."""
    def parse(text: str) -> int:
        value = _number(text)
        if not isinstance(value, int) or not least <= value <= most:
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be an integer from {least} "
                                             f"to {most}")
        return value

    parse.__name__ = "count"
    return parse


# ---- output paths: refused at parse time, before any work (podcommon.output_target) ----

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")


def output_file(text: str):
    """A file the command writes: a regular file or a new one in an existing directory."""
    try:
        output_target(text)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror}") from None
    return Path(text)


def figure_file(text: str):
    """A --plot file: an output_file whose suffix names a format matplotlib writes."""
    path = output_file(text)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text}: a figure is written as "
                                         f"{', '.join(FIGURE_SUFFIXES)} (name the file so)")
    return path


def output_dir(text: str):
    """A directory the command writes into (podcommon.output_directory: an existing
    directory or a new one made with its parents, never a file, a device or a link); the
    files in it are written by the one output writer."""
    try:
        output_directory(text, create=False)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror}") from None
    return Path(text)
