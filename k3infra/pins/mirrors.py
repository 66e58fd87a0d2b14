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
import tomllib
from dataclasses import dataclass
from pathlib import Path

ENV = "CONTAINERS_REGISTRIES_CONF"
SYSTEM_FILE = Path("/etc/containers/registries.conf")
DOCKER_HUB = "docker.io"


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


def _text(path: Path, where: str, table: dict, key: str, default: str | None = None) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or not value or any(c.isspace() for c in value) or "://" in value:
        raise MirrorConfigError(f"{path}: {where}.{key} = {value!r}: expected host[:port][/path] "
                                "(no scheme, no spaces)")
    return value.rstrip("/")


def _flag(path: Path, where: str, table: dict, key: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise MirrorConfigError(f"{path}: {where}.{key} = {value!r}: expected true or false")
    return value


def load(path: Path) -> list[_Registry]:
    """The `[[registry]]` tables of `path`; one line naming the file and key when unusable."""
    if not path.is_file():
        raise MirrorConfigError(f"{path}: not a regular file ({ENV} or the default path names it)")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise MirrorConfigError(f"{path}: not readable as TOML: {exc}") from None
    tables = doc.get("registry", [])
    if not isinstance(tables, list):
        raise MirrorConfigError(f"{path}: registry: expected [[registry]] tables")
    out = []
    for i, table in enumerate(tables):
        where = f"registry[{i}]"
        if not isinstance(table, dict):
            raise MirrorConfigError(f"{path}: {where}: expected a table")
        location = _text(path, where, table, "location", table.get("prefix"))
        prefix = _text(path, where, table, "prefix", location)
        if prefix.startswith("*."):
            raise MirrorConfigError(f"{path}: {where}.prefix = {prefix!r}: wildcard prefixes are "
                                    "not read by k3infra pins; name the registry")
        by_digest_only = _flag(path, where, table, "mirror-by-digest-only")
        mirrors = []
        entries = table.get("mirror", [])
        if not isinstance(entries, list):
            raise MirrorConfigError(f"{path}: {where}.mirror: expected [[registry.mirror]] tables")
        for j, m in enumerate(entries):
            mwhere = f"{where}.mirror[{j}]"
            if not isinstance(m, dict):
                raise MirrorConfigError(f"{path}: {mwhere}: expected a table")
            pull = m.get("pull-from-mirror", "all")
            if pull not in ("all", "digest-only", "tag-only"):
                raise MirrorConfigError(f"{path}: {mwhere}.pull-from-mirror = {pull!r}: expected "
                                        "all, digest-only or tag-only")
            endpoint = Endpoint(_text(path, mwhere, m, "location"), _flag(path, mwhere, m, "insecure"), True)
            if not by_digest_only and pull != "digest-only":   # a tag is what pins asks for
                mirrors.append(endpoint)
        out.append(_Registry(prefix, location, _flag(path, where, table, "insecure"),
                             _flag(path, where, table, "blocked"), tuple(mirrors)))
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
