"""Image tag -> manifest digest through the registry's own API (OCI distribution spec):
HEAD /v2/<repo>/manifests/<tag> with the manifest and index media types accepted, the
digest from Docker-Content-Digest; on 401, the Bearer token flow its WWW-Authenticate
names (realm, service, scope), anonymous. An index must list the nodes' platform.

Every call goes through the one HTTP client (k3infra/httpclient.py): the command's
deadline, bounded answers, the realm and redirects held to https (plain HTTP only for a
registry the user named that way), the token sent to the registry alone. Nothing the
registry says is taken on its word: the manifest read by the digest it announced must
hash to that digest (or it is refused, never offered for --write), and the manifest,
index, image config and token answers are typed (pydantic, below).

The operator's machine needs no docker CLI and no credentials for public base images.
Loopback registries, and mirrors registries.conf marks `insecure`, are spoken to over
plain HTTP (as dockerd treats 127.0.0.0/8 as insecure); every other registry over
HTTPS. The mirrors of containers-registries.conf are asked first (mirrors.py).
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Annotated, Optional

from pydantic import Field

from k3infra.fileformats import FileFormatError, FileModel, Text, validate, json_value
from k3infra.httpclient import (Credential, Deadline, HttpClient, HttpError, credential_for,
                                is_loopback)
from k3infra.pins.mirrors import DOCKER_HUB as HUB_NAME, MirrorConfigError, endpoints

DOCKER_HUB = "registry-1.docker.io"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
ACCEPT = ", ".join(INDEX_TYPES + MANIFEST_TYPES)
NODE_PLATFORM = ("linux", "amd64")  # the platform the nodes pull
TIMEOUT_S = 20.0                    # one call
DEADLINE_S = 300.0                  # every call of one `k3infra pins`
# What is read of each answer (the OCI spec holds a manifest to 4 MiB).
MANIFEST_MAX_BYTES = 4 << 20
CONFIG_MAX_BYTES = 8 << 20
TOKEN_MAX_BYTES = 64 << 10
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")

Digest = Annotated[str, Field(strict=True, pattern=r"^sha256:[0-9a-f]{64}$")]


class _Platform(FileModel):
    os: Text(128) = ""
    architecture: Text(128) = ""


class _Descriptor(FileModel):
    digest: Digest
    platform: Optional[_Platform] = None


class _Manifest(FileModel):
    """An image manifest or an index, the fields read here."""

    mediaType: Optional[Text(256)] = None
    manifests: Optional[list[_Descriptor]] = Field(default=None, max_length=4096)
    config: Optional[_Descriptor] = None


class _ImageConfig(FileModel):
    os: Text(128) = ""
    architecture: Text(128) = ""


class _Token(FileModel):
    token: Optional[Annotated[str, Field(strict=True, max_length=16384,
                                         pattern=r"^[A-Za-z0-9._~+/=-]+$")]] = None
    access_token: Optional[Annotated[str, Field(strict=True, max_length=16384,
                                                pattern=r"^[A-Za-z0-9._~+/=-]+$")]] = None


def client(deadline_s: float = DEADLINE_S) -> HttpClient:
    """The client of one `k3infra pins` run: one deadline for every registry call."""
    return HttpClient(deadline=Deadline(deadline_s, "k3infra pins"),
                      call_seconds=min(TIMEOUT_S, deadline_s), user_agent="k3infra-pins")


class ResolveError(RuntimeError):
    """A pin could not be resolved; the message names the reference and why."""


@dataclass(frozen=True)
class ImageRef:
    registry: str     # host[:port] spoken to
    repository: str   # path on that registry (library/ added for Docker Hub)
    tag: str
    name: str         # the reference as written, without the digest: repo:tag
    insecure: bool = False   # a registries.conf mirror marked insecure: plain HTTP

    @property
    def base_url(self) -> str:
        host = self.registry.rsplit(":", 1)[0].strip("[]")
        scheme = "http" if self.insecure or is_loopback(host) else "https"
        return f"{scheme}://{self.registry}"

    @property
    def qualified(self) -> str:
        """registry/repository as registries.conf names it (Docker Hub as docker.io)."""
        registry = "docker.io" if self.registry == DOCKER_HUB else self.registry
        return f"{registry}/{self.repository}"


def parse_ref(image: str) -> ImageRef:
    """`[host[:port]/]repo:tag[@sha256:...]` -> where to ask. Docker's rule for the host:
    the first path part is a registry when it has a dot or a colon or is localhost."""
    name = image.split("@", 1)[0]
    path, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        raise ResolveError(f"{image}: no tag to resolve (expected <repository>:<tag>)")
    first, slash, rest = path.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = DOCKER_HUB, path if slash else f"library/{path}"
    if registry == "docker.io":
        registry = DOCKER_HUB
    return ImageRef(registry=registry, repository=repository, tag=tag, name=name)


def _bearer(challenge: str) -> dict[str, str]:
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge[:8192]))
    if not challenge.lower().startswith("bearer ") or "realm" not in params:
        raise ResolveError(f"unsupported auth challenge {challenge[:200]!r} (only anonymous Bearer)")
    return params


def _token(http: HttpClient, ref: ImageRef, challenge: str) -> Credential:
    """The anonymous Bearer token the challenge's realm gives, bound to the registry: the
    realm is held to the client's rules (https, or plain HTTP only for a host the user
    named so: a `file://` or another scheme's realm is refused, never read)."""
    params = _bearer(challenge)
    realm = params["realm"]
    query = {k: v for k, v in params.items() if k in ("service", "scope")}
    query.setdefault("scope", f"repository:{ref.repository}:pull")
    try:
        http.check_url(realm, "auth realm")
        url = realm + ("&" if urllib.parse.urlsplit(realm).query else "?") + urllib.parse.urlencode(query)
        body, resp = http.json(url, body_max=TOKEN_MAX_BYTES, kind="token answer")
        answer = validate(body, _Token, resp.url)
    except (HttpError, FileFormatError) as exc:
        raise ResolveError(f"{ref.name}: token from the registry's auth realm failed: {exc}") from None
    token = answer.token or answer.access_token
    if not token:
        raise ResolveError(f"{ref.name}: {realm[:200]} returned no token")
    return credential_for(ref.base_url, "Authorization", f"Bearer {token}")


def _open(http: HttpClient, ref: ImageRef, method: str, path: str,
          credential: Optional[Credential], body_max: int = 0, expect_sha256=None):
    """(response, credential): the token flow once on a 401."""
    url = f"{http.allow_http(ref.base_url)}/v2/{ref.repository}/{path}"
    try:
        return http.request(method, url, body_max=body_max, kind="manifest",
                            headers={"Accept": ACCEPT}, credential=credential,
                            expect_sha256=expect_sha256), credential
    except HttpError as exc:
        if exc.status == 401 and credential is None:
            credential = _token(http, ref, exc.headers.get("www-authenticate", ""))
            return _open(http, ref, method, path, credential, body_max, expect_sha256)
        raise ResolveError(f"{ref.name}: {method} {exc}") from None


@dataclass(frozen=True)
class Resolved:
    digest: str
    media_type: str
    platforms: tuple[str, ...]   # an index's os/arch list; () for a single manifest
    url: str = ""                # the manifest URL that answered
    mirror: bool = False         # answered by a registries.conf mirror


def targets(image: str) -> list[ImageRef]:
    """Where to ask for the image's tag: its registries.conf mirrors, then its registry."""
    ref = parse_ref(image)
    try:
        found, rest = endpoints(ref.qualified)
    except MirrorConfigError as exc:
        raise ResolveError(str(exc)) from None
    out = []
    for e in found:
        host, _, path = e.location.partition("/")
        host = DOCKER_HUB if host == HUB_NAME else host
        repository = "/".join(p for p in (path, rest) if p)
        out.append(ImageRef(host, repository, ref.tag, ref.name, e.insecure))
    return out


def resolve(image: str, platform: tuple[str, str] = NODE_PLATFORM,
            http: Optional[HttpClient] = None) -> Resolved:
    """The digest the registry (or the first mirror that answers) serves for the image's
    tag; an index must list `platform`, a single manifest must be built for it. `http`:
    the command's client (its deadline covers every registry asked)."""
    http = http or client()
    *mirrors, own = targets(image)
    failed = []
    for ref in mirrors:
        try:
            got = _resolve_at(http, ref, platform)
        except ResolveError as exc:
            failed.append(f"mirror {ref.base_url}: {exc}")
            continue
        return Resolved(got.digest, got.media_type, got.platforms, got.url, mirror=True)
    try:
        return _resolve_at(http, own, platform)
    except ResolveError as exc:
        if failed:
            raise ResolveError("; ".join([*failed, str(exc)])) from None
        raise


def _resolve_at(http: HttpClient, ref: ImageRef, platform: tuple[str, str]) -> Resolved:
    url = f"{ref.base_url}/v2/{ref.repository}/manifests/{ref.tag}"
    resp, credential = _open(http, ref, "HEAD", f"manifests/{ref.tag}", None)
    digest = resp.headers.get("docker-content-digest", "")
    media_type = resp.headers.get("content-type", "").split(";")[0].strip()
    if not _DIGEST_RE.match(digest):
        raise ResolveError(f"{ref.name}: the registry sent no sha256 digest "
                           f"(Docker-Content-Digest: {digest[:100]!r})")
    # The body by digest, to see the platforms: its bytes must hash to that digest.
    resp, _ = _open(http, ref, "GET", f"manifests/{digest}", credential, MANIFEST_MAX_BYTES,
                    digest.split(":", 1)[1])
    body = _manifest(ref, resp)
    want = "/".join(platform)
    if media_type in INDEX_TYPES or body.manifests is not None:
        platforms = tuple(f"{m.platform.os}/{m.platform.architecture}" if m.platform else "?/?"
                          for m in body.manifests or [])
        if want not in platforms:
            raise ResolveError(f"{ref.name}: the index {digest} lists {', '.join(platforms) or 'no platform'}"
                               f", not {want} (the nodes' platform)")
        return Resolved(digest, media_type, platforms, url)
    if body.config is not None:
        config = body.config.digest
        resp, _ = _open(http, ref, "GET", f"blobs/{config}", credential, CONFIG_MAX_BYTES,
                        config.split(":", 1)[1])
        cfg = _parsed(ref, resp, _ImageConfig)
        got = f"{cfg.os}/{cfg.architecture}"
        if got != want:
            raise ResolveError(f"{ref.name}: {digest} is a {got} image, not {want} (the nodes' platform)")
    return Resolved(digest, media_type, (), url)


def _parsed(ref: ImageRef, resp, model):
    try:
        return validate(json_value(resp.body, resp.url, "registry answer"), model, resp.url)
    except FileFormatError as exc:
        raise ResolveError(f"{ref.name}: {exc}") from None


def _manifest(ref: ImageRef, resp) -> _Manifest:
    return _parsed(ref, resp, _Manifest)
