"""Image tag -> manifest digest through the registry's own API (OCI distribution spec):
HEAD /v2/<repo>/manifests/<tag> with the manifest and index media types accepted, the
digest from Docker-Content-Digest; on 401, the Bearer token flow its WWW-Authenticate
names (realm, service, scope), anonymous. An index must list the nodes' platform.

Standard library only: the operator's machine needs no docker CLI and no credentials for
public base images. Loopback registries, and mirrors registries.conf marks `insecure`, are
spoken to over plain HTTP (as dockerd treats 127.0.0.0/8 as insecure); every other registry
over HTTPS. The mirrors of containers-registries.conf are asked first (mirrors.py).
"""
from __future__ import annotations

import ipaddress
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

DOCKER_HUB = "registry-1.docker.io"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
ACCEPT = ", ".join(INDEX_TYPES + MANIFEST_TYPES)
NODE_PLATFORM = ("linux", "amd64")  # the platform the nodes pull
TIMEOUT_S = 20.0
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


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
        scheme = "http" if self.insecure or _is_loopback(host) else "https"
        return f"{scheme}://{self.registry}"

    @property
    def qualified(self) -> str:
        """registry/repository as registries.conf names it (Docker Hub as docker.io)."""
        registry = "docker.io" if self.registry == DOCKER_HUB else self.registry
        return f"{registry}/{self.repository}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if not challenge.lower().startswith("bearer ") or "realm" not in params:
        raise ResolveError(f"unsupported auth challenge {challenge!r} (only anonymous Bearer)")
    return params


def _token(ref: ImageRef, challenge: str) -> str:
    params = _bearer(challenge)
    query = {k: v for k, v in params.items() if k in ("service", "scope")}
    query.setdefault("scope", f"repository:{ref.repository}:pull")
    url = params["realm"] + "?" + urllib.parse.urlencode(query)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            body = json.load(resp)
    except (OSError, ValueError) as exc:
        raise ResolveError(f"{ref.name}: token from {params['realm']} failed: {exc}") from None
    token = body.get("token") or body.get("access_token")
    if not token:
        raise ResolveError(f"{ref.name}: {params['realm']} returned no token")
    return token


def _request(ref: ImageRef, method: str, reference: str, token: str | None):
    headers = {"Accept": ACCEPT}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{ref.base_url}/v2/{ref.repository}/manifests/{reference}"
    return urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers),
                                  timeout=TIMEOUT_S)


def _open(ref: ImageRef, method: str, reference: str, token: str | None):
    """(response, token): the token flow once on a 401."""
    try:
        return _request(ref, method, reference, token), token
    except urllib.error.HTTPError as exc:
        if exc.code == 401 and token is None:
            token = _token(ref, exc.headers.get("WWW-Authenticate", ""))
            return _open(ref, method, reference, token)
        raise ResolveError(f"{ref.name}: {method} {ref.base_url}/v2/{ref.repository}/manifests/"
                           f"{reference} answered {exc.code} {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise ResolveError(f"{ref.name}: {ref.base_url} unreachable: {exc}") from None


@dataclass(frozen=True)
class Resolved:
    digest: str
    media_type: str
    platforms: tuple[str, ...]   # an index's os/arch list; () for a single manifest
    url: str = ""                # the manifest URL that answered
    mirror: bool = False         # answered by a registries.conf mirror


def targets(image: str) -> list[ImageRef]:
    """Where to ask for the image's tag: its registries.conf mirrors, then its registry."""
    from k3infra.pins.mirrors import DOCKER_HUB as HUB_NAME, MirrorConfigError, endpoints

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


def resolve(image: str, platform: tuple[str, str] = NODE_PLATFORM) -> Resolved:
    """The digest the registry (or the first mirror that answers) serves for the image's
    tag; an index must list `platform`, a single manifest must be built for it."""
    *mirrors, own = targets(image)
    failed = []
    for ref in mirrors:
        try:
            got = _resolve_at(ref, platform)
        except ResolveError as exc:
            failed.append(f"mirror {ref.base_url}: {exc}")
            continue
        return Resolved(got.digest, got.media_type, got.platforms, got.url, mirror=True)
    try:
        return _resolve_at(own, platform)
    except ResolveError as exc:
        if failed:
            raise ResolveError("; ".join([*failed, str(exc)])) from None
        raise


def _resolve_at(ref: ImageRef, platform: tuple[str, str]) -> Resolved:
    url = f"{ref.base_url}/v2/{ref.repository}/manifests/{ref.tag}"
    resp, token = _open(ref, "HEAD", ref.tag, None)
    with resp:
        digest = resp.headers.get("Docker-Content-Digest", "")
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
    if not _DIGEST_RE.match(digest):
        raise ResolveError(f"{ref.name}: the registry sent no sha256 digest "
                           f"(Docker-Content-Digest: {digest!r})")
    # The body by digest, to see the platforms (the HEAD pinned what we read).
    resp, _ = _open(ref, "GET", digest, token)
    with resp:
        body = json.loads(resp.read())
    want = "/".join(platform)
    if media_type in INDEX_TYPES or body.get("manifests") is not None:
        platforms = tuple(f"{m.get('platform', {}).get('os')}/{m.get('platform', {}).get('architecture')}"
                          for m in body.get("manifests", []))
        if want not in platforms:
            raise ResolveError(f"{ref.name}: the index {digest} lists {', '.join(platforms) or 'no platform'}"
                               f", not {want} (the nodes' platform)")
        return Resolved(digest, media_type, platforms, url)
    config = body.get("config", {}).get("digest")
    if config:
        resp, _ = _open_blob(ref, config, token)
        with resp:
            cfg = json.loads(resp.read())
        got = f"{cfg.get('os')}/{cfg.get('architecture')}"
        if got != want:
            raise ResolveError(f"{ref.name}: {digest} is a {got} image, not {want} (the nodes' platform)")
    return Resolved(digest, media_type, (), url)


class _NoAuthElsewhere(urllib.request.HTTPRedirectHandler):
    """Blobs redirect to a CDN with a signed URL: the registry's token stays behind."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def _open_blob(ref: ImageRef, digest: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{ref.base_url}/v2/{ref.repository}/blobs/{digest}"
    try:
        opener = urllib.request.build_opener(_NoAuthElsewhere)
        return opener.open(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S), token
    except (OSError, ValueError) as exc:
        raise ResolveError(f"{ref.name}: GET {url} failed: {exc}") from None
