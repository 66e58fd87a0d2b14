"""Every file the CLI reads, through one bounded reader and one typed model per format.

A file someone hands the CLI (a benchmark result, a lock, a log, a pod's JSON, a
registries.conf, a receipt...) is read by `read_bytes`: podcommon.read_regular, so a
regular file after a non-blocking open (a FIFO, a device, a socket or a directory is
refused at once, never read or waited on), at most its kind's size (KINDS below: `/dev/zero`
or a 2 GB file is refused unread), links followed only where a user names the path.
Text is strict UTF-8 (the bad byte and line are named); JSON goes through
podcommon.parse_json (nesting, digits, NaN, duplicate keys bounded); YAML through the
stack file's strict loader (no aliases, no tags beyond JSON data, bounded nesting).
The parsed data is then validated by the format's pydantic model (`validate`): strict
types, finite numbers, bounded lengths. Whatever is wrong is one line, `FileFormatError`:
`<file>: <field>: <problem>`.

Low module: imports podcommon and pydantic only (the formats' models live beside the
code that reads them and use `Strict*` and `validate` from here).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field,
                      ValidationError)

from k3infra.podcommon import JsonRefused, parse_json, read_regular

M = TypeVar("M", bound=BaseModel)

MiB = 1 << 20
# The most bytes read of each kind of file: past this it is not one of them.
KINDS = {
    "benchmark result": 512 * MiB,    # --save-detailed of thousands of requests
    "accuracy file": 16 * MiB,        # scores.json, index.json, config.json
    "checksum list": 4 * MiB,         # SHA256SUMS
    "startup budget": 64 * 1024,
    "pod JSON": 16 * MiB,
    "StatefulSet JSON": 16 * MiB,
    "container log": 512 * MiB,
    "registries.conf": 1 * MiB,
    "receipt": 4 * MiB,
    "render plan": 256 * MiB,         # plan.json
    "policy config": 1 * MiB,
    "API key file": 64 * 1024,
}


class FileFormatError(ValueError):
    """A file that cannot be used: one line naming the file, the field and the problem."""

    def __init__(self, source: str, problem: str):
        self.source, self.problem = str(source), problem
        super().__init__(f"{source}: {problem}")


def read_bytes(path, kind: str, *, follow_links: bool = True) -> bytes:
    """The bytes of `path` (a regular file, at most KINDS[kind]); FileFormatError else.
    `follow_links`: True for a path the user typed; False for one found in a directory."""
    try:
        return read_regular(str(path), KINDS[kind], follow_links)
    except FileNotFoundError:
        raise FileFormatError(path, f"cannot read as a {kind} (no such file)") from None
    except OSError as exc:
        raise FileFormatError(path, f"cannot read as a {kind} ({exc.strerror or exc})") from None


def decode_text(raw: bytes, source, kind: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise FileFormatError(source, f"line {line}: byte {raw[exc.start]:#04x} is not UTF-8 "
                              f"(a {kind} is UTF-8 text)") from None


def read_text(path, kind: str, *, follow_links: bool = True, lenient: bool = False) -> str:
    """UTF-8 text of `path`; `lenient` (a log): undecodable bytes become U+FFFD."""
    raw = read_bytes(path, kind, follow_links=follow_links)
    return raw.decode("utf-8", "replace") if lenient else decode_text(raw, path, kind)


def json_value(raw, source, kind: str, max_depth: int = 64) -> Any:
    """Bounded JSON (podcommon.parse_json) of bytes or text from `source`."""
    try:
        return parse_json(raw, max_depth)
    except JsonRefused as exc:
        raise FileFormatError(source, f"not a usable {kind}: {exc}") from None


def load_json(path, kind: str, model: Optional[type[M]] = None, *, follow_links: bool = True,
              max_depth: int = 64):
    """A JSON file of `kind`, validated by `model` when given."""
    data = json_value(read_bytes(path, kind, follow_links=follow_links), path, kind, max_depth)
    return validate(data, model, path) if model is not None else data


def load_yaml(path, kind: str, *, follow_links: bool = True) -> Any:
    """A YAML file of `kind` through the stack file's strict loader (no aliases, no tags
    beyond JSON data, no duplicate keys, bounded nesting)."""
    # yaml here, not at the top: 0.04 s to import (python -X importtime), which `k3infra
    # startup` (it reads JSON and logs through this module) does not pay.
    import yaml

    # Here, not at the top: an import cycle (k3infra.config imports the receipt, which
    # reads through this module).
    from k3infra.config.stackfile import StackFileError, strict_yaml

    text = decode_text(read_bytes(path, kind, follow_links=follow_links), path, kind)
    try:
        return strict_yaml(text, Path(path))
    except StackFileError as exc:
        raise FileFormatError(path, exc.accepted) from None
    except yaml.YAMLError as exc:       # pragma: no cover (strict_yaml names YAML errors)
        raise FileFormatError(path, f"not YAML: {exc}") from None


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_:/@+-]{1,64}")


def where(loc: tuple) -> str:
    """pydantic's error location as a field path: ('files', 3, 'path') -> files[3].path; a
    key from the file that is not a plain name is quoted (a newline in it stays escaped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        name = str(part) if _PLAIN_KEY.fullmatch(str(part)) else _shown(str(part))
        out += f".{name}" if out else name
    return out or "(the top level)"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validation_line(exc: ValidationError) -> str:
    """The first problem of a ValidationError as `field: message (got value)`, and how
    many more there are."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    more = f"; and {len(errors) - 1} more problem(s)" if len(errors) > 1 else ""
    if first["type"] == "missing":
        return f"missing key {where(first['loc'])!r}{more}"
    message = first["msg"].removeprefix("Value error, ")
    return f"{where(first['loc'])}: {message} (got {_shown(first.get('input'))}){more}"


def validate(data: Any, model: type[M], source) -> M:
    """`data` (parsed from `source`) as `model`; FileFormatError naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise FileFormatError(source, validation_line(exc)) from None
    except RecursionError:
        raise FileFormatError(source, "nested too deeply") from None


# ---- field types of file formats: JSON's own types, nothing coerced -------------------

class FileModel(BaseModel):
    """A file format's model: strict (a string is never a number, a number never a
    string), finite numbers, unknown keys kept out of the way (tools add keys)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore", frozen=True)


def _whole(value: Any) -> Any:
    # JSON writers print 5 as 5.0 at times (numpy): a whole float is a count too.
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 63:
        return int(value)
    return value


def Count(le: int = 2 ** 53, ge: int = 0):
    """A JSON integer (or a whole float) within [ge, le]; never a string or a boolean."""
    return Annotated[int, BeforeValidator(_whole), Field(ge=ge, le=le, strict=True)]


def Real(ge: float | None = None, le: float | None = None):
    """A finite JSON number (an integer accepted); never a string or a boolean."""
    def number(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value
    return Annotated[float, BeforeValidator(number),
                     Field(ge=ge, le=le, strict=True, allow_inf_nan=False)]


def Text(max_length: int = 4096):
    return Annotated[str, Field(max_length=max_length, strict=True)]


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _sha256_hex(value: str) -> str:
    if not _HEX64.fullmatch(value):
        raise ValueError("must be 64 lowercase hex characters (a SHA-256)")
    return value


Sha256 = Annotated[str, Field(strict=True), AfterValidator(_sha256_hex)]


# ---- SHA256SUMS (`sha256sum` output): the evidence list of benchmark and accuracy runs --

def relative_name(name: str) -> str:
    """A file name inside a run directory: relative, `/`-separated, no `.`/`..`/empty
    component, no backslash or control character (it never leaves the directory)."""
    parts = name.split("/")
    if (not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts)
            or re.search(r"[\x00-\x1f\x7f\\]", name) or len(name) > 1024):
        raise ValueError(f"{name[:80]!r} is not a relative path inside the run directory")
    return name


def parse_sha256sums(text: str, source) -> dict[str, str]:
    """`<64 hex>  <relative name>` lines -> {name: sha256}; FileFormatError naming the line."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, sep, name = line.partition("  ")
        try:
            if not sep:
                raise ValueError("expected '<sha256>  <file>'")
            _sha256_hex(digest)
            relative_name(name)
        except ValueError as exc:
            raise FileFormatError(source, f"line {number}: {exc}") from None
        if name in out:
            raise FileFormatError(source, f"line {number}: {name} is listed twice")
        out[name] = digest
    return out


def load_sha256sums(path, *, follow_links: bool = False) -> dict[str, str]:
    raw = read_bytes(path, "checksum list", follow_links=follow_links)
    return parse_sha256sums(decode_text(raw, path, "checksum list"), path)
