"""Where to ask for an image's tag: the registry mirrors of containers-registries.conf(5),
the file skopeo, podman, buildah and CRI-O already read, so an operator behind a pull-through
cache or in an air gap resolves pins through the mirror they pull through.

The file: $CONTAINERS_REGISTRIES_CONF, else ~/.config/containers/registries.conf, else
/etc/containers/registries.conf; none is fine (the image's own registry is asked). Read:
the v2 `[[registry]]` tables (`prefix`, `location`, `insecure`, `blocked`,
`mirror-by-digest-only`) and their `[[registry.mirror]]` (`location`, `insecure`,
`pull-from-mirror`), matched on whole path components, the longest prefix winning, mirrors
in order and the registry itself last, as containers/image does. Not read: drop-ins
(registries.conf.d), `*.` wildcard prefixes, short-name aliases (the stack names fully
qualified images). A mirror answers for the tag; the pin recorded is still the image's own
name with the digest, which is content-addressed and the same wherever it is pulled from.
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, Field

from k3infra.fileformats import FileFormatError, FileModel, read_text, validate

ENV = "CONTAINERS_REGISTRIES_CONF"
SYSTEM_FILE = Path("/etc/containers/registries.conf")
DOCKER_HUB = "docker.io"
# host[:port][/path]: no scheme, no user:password@ (credentials live in auth.json), no
# space or control character.
_LOCATION = re.compile(r"(\*\.)?[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?(/[A-Za-z0-9._/-]*)?"
                       r"|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?(/[A-Za-z0-9._/-]*)?")


class MirrorConfigError(RuntimeError):
    """The registries.conf cannot be used; the message names the file, the key and why."""


@dataclass(frozen=True)
class Endpoint:
    location: str     # host[:port][/path]: the image's repository is appended to it
    insecure: bool
    mirror: bool      # False: the registry the image names


@dataclass(frozen=True)
class _Registry:
    prefix: str
    location: str
    insecure: bool
    blocked: bool
    mirrors: tuple[Endpoint, ...]


def _location(value: str) -> str:
    if len(value) > 512 or not _LOCATION.fullmatch(value):
        raise ValueError("expected host[:port][/path] (no scheme, no user:password@, no spaces)")
    return value.rstrip("/")


Location = Annotated[str, Field(strict=True), AfterValidator(_location)]


class _MirrorTable(FileModel):
    location: Location
    insecure: bool = False
    pull_from_mirror: Literal["all", "digest-only", "tag-only"] = Field(
        default="all", alias="pull-from-mirror")


class _RegistryTable(FileModel):
    prefix: Optional[Location] = None
    location: Optional[Location] = None
    insecure: bool = False
    blocked: bool = False
    mirror_by_digest_only: bool = Field(default=False, alias="mirror-by-digest-only")
    mirror: list[_MirrorTable] = Field(default_factory=list, max_length=256)


class RegistriesConf(FileModel):
    """containers-registries.conf(5), v2: the `[[registry]]` tables read here (other
    keys, such as unqualified-search-registries, are left alone)."""

    registry: list[_RegistryTable] = Field(default_factory=list, max_length=4096)


def config_path() -> Path | None:
    """The registries.conf in effect, or None when there is none."""
    named = os.environ.get(ENV)
    if named:
        return Path(named)
    user = Path.home() / ".config" / "containers" / "registries.conf"
    for path in (user, SYSTEM_FILE):
        if path.is_file():
            return path
    return None


def load(path: Path) -> list[_Registry]:
    """The `[[registry]]` tables of `path` (the bounded reader, then the typed model);
    one line naming the file and key when unusable."""
    try:
        doc = tomllib.loads(read_text(path, "registries.conf"))
        conf = validate(doc, RegistriesConf, path)
    except FileFormatError as exc:
        raise MirrorConfigError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise MirrorConfigError(f"{path}: not readable as TOML: {exc}") from None
    except RecursionError:
        raise MirrorConfigError(f"{path}: not readable as TOML: nested too deeply") from None
    out = []
    for i, table in enumerate(conf.registry):
        where = f"registry[{i}]"
        location = table.location or table.prefix
        prefix = table.prefix or location
        if location is None:
            raise MirrorConfigError(f"{path}: {where}: neither location nor prefix is set")
        if prefix.startswith("*."):
            raise MirrorConfigError(f"{path}: {where}.prefix = {prefix!r}: wildcard prefixes are "
                                    "not read by k3infra pins; name the registry")
        if location.startswith("*."):
            raise MirrorConfigError(f"{path}: {where}.location = {location!r}: a location is a "
                                    "registry, not a wildcard")
        mirrors = tuple(Endpoint(m.location, m.insecure, True) for m in table.mirror
                        # a tag is what pins asks for
                        if not table.mirror_by_digest_only and m.pull_from_mirror != "digest-only")
        if any(m.location.startswith("*.") for m in table.mirror):
            raise MirrorConfigError(f"{path}: {where}.mirror: a mirror location is a registry, "
                                    "not a wildcard")
        out.append(_Registry(prefix, location, table.insecure, table.blocked, mirrors))
    return out


def _matches(prefix: str, name: str) -> bool:
    return name == prefix or name.startswith(prefix + "/")


def endpoints(name: str, path: Path | None = None) -> tuple[list[Endpoint], str]:
    """`name` (registry/repository, Docker Hub as docker.io) -> where to ask, in order, and
    the remainder to append to each location; the image's own registry comes last."""
    path = path if path is not None else config_path()
    registry, _, repository = name.partition("/")
    own = [Endpoint(registry, False, False)]
    if path is None:
        return own, repository
    found = [r for r in load(path) if _matches(r.prefix, name)]
    if not found:
        return own, repository
    best = max(found, key=lambda r: len(r.prefix))
    if best.blocked:
        raise MirrorConfigError(f"{name}: blocked by {path} (prefix {best.prefix!r})")
    rest = name[len(best.prefix):].lstrip("/")
    return [*best.mirrors, Endpoint(best.location, best.insecure, False)], rest
