"""`k3infra pins`: every pin a render warns about, resolved from the network the operator
has, shown before anything is written; `--check` re-resolves the recorded ones.

One module per source: oci (image tags, the registry's API), gitref (the PR head, git's
protocol), hub (a branch's commit, huggingface_hub), cluster (the API server's addresses,
the kubernetes client); stackwrite writes the stack file, comments and order kept.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from k3infra.config import StackConfig
from k3infra.receipt import Receipt
from k3infra.engine.component import lock_gates
from k3infra.gates import is_placeholder
from k3infra.pins.cluster import ClusterError, api_server_cidrs
from k3infra.pins.gitref import RefError, pr_ref
from k3infra.pins.hub import HubError
from k3infra.pins.oci import NODE_PLATFORM, ResolveError, parse_ref

# Row states. Only RESOLVED (a placeholder or an unset key, with a value found) is written.
RESOLVED = "resolved"
PINNED = "pinned"        # the recorded value is what the source says today
MOVED = "moved"          # a recorded pin the source no longer names: refused
CHOICE = "choice"        # offered, never taken silently (the Hub revision)
UNRESOLVED = "unresolved"
NOT_DONE = "not done"    # something this command cannot do; `source` says what stops it

TAG_MOVED = "the tag moved; the recorded digest is what was measured"
HEAD_MOVED = "the PR head moved; the recorded commit is what was measured"


@dataclass
class Pin:
    key: str                   # k3:a.b.c, or a file (images/build.lock)
    current: Any
    resolved: Any = None
    source: str = ""
    state: str = UNRESOLVED
    path: tuple[str, ...] = field(default=())   # where in the stack file's config

    @property
    def writable(self) -> bool:
        return self.state == RESOLVED and bool(self.path)


def key_path(key: str) -> tuple[str, ...]:
    """k3:engine.baseImages.cudaDevel -> ('k3:engine', 'baseImages', 'cudaDevel')."""
    return tuple(key.split("."))


def image_pins(cfg: StackConfig) -> list[tuple[str, str]]:
    """Every image key the stack's mode uses, with its value (tag@digest)."""
    eng = cfg.engine
    found = [("k3:serving.proxyImage", cfg.serving.proxy_image)]
    if eng.build == "prebuilt" and cfg.engine_image:
        # A released engine (a receipt's `engine.image`, the upstream profile) by tag@digest.
        found.append(("k3:engineImage", cfg.engine_image))
    if eng.build != "prebuilt":
        found += [("k3:engine.baseImages.cudaDevel", eng.base_images.cuda_devel),
                  ("k3:engine.baseImages.uv", eng.base_images.uv),
                  ("k3:engine.baseImages.rust", eng.base_images.rust)]
    if eng.build == "in-cluster":
        found += [("k3:engine.buildkitImage", eng.buildkit_image),
                  ("k3:engine.reporterImage", eng.reporter_image)]
    if cfg.accuracy.enabled and cfg.accuracy.image:
        found.append(("k3:accuracy.image", cfg.accuracy.image))
    return found


def _digest(image: str) -> Optional[str]:
    return image.rsplit("@", 1)[1] if "@" in image else None


def image_pin(key: str, image: str, resolve: Callable) -> Pin:
    pin = Pin(key, image, path=key_path(key))
    if "@" in image and ":" not in image.split("@", 1)[0].rsplit("/", 1)[-1]:
        pin.state, pin.source = NOT_DONE, "pinned by digest alone: no tag to re-resolve"
        return pin
    try:
        ref = parse_ref(image)
        got = resolve(image)
    except ResolveError as exc:
        pin.source = str(exc)
        return pin
    pin.resolved = f"{ref.name}@{got.digest}"
    kind = f"index, {'/'.join(NODE_PLATFORM)} present" if got.platforms else "manifest"
    asked = got.url or f"{ref.base_url}/v2/{ref.repository}/manifests/{ref.tag}"
    pin.source = f"{asked} ({kind}{', a registries.conf mirror' if got.mirror else ''})"
    if is_placeholder(image):
        pin.state = RESOLVED
    elif _digest(image) == got.digest:
        pin.state = PINNED
    else:
        pin.state = MOVED
        pin.source = f"{TAG_MOVED} ({pin.source})"
    return pin


def engine_commit_pin(cfg: StackConfig, receipt: Receipt, ls_remote: Callable) -> Optional[Pin]:
    e, recorded = receipt.engine, cfg.engine.commit
    if cfg.engine.build == "prebuilt" and recorded is None:
        return None
    pin = Pin("k3:engine.commit", recorded, path=key_path("k3:engine.commit"))
    if not e.pull_request:
        pin.state, pin.source = NOT_DONE, "the receipt names no pull request (a released engine)"
        return pin
    ref = pr_ref(e.pull_request)
    pin.source = f"git ls-remote {e.repo} {ref}"
    try:
        head = ls_remote(e.repo, ref)
    except RefError as exc:
        pin.source = str(exc)
        return pin
    if head is None:
        pin.source = f"{e.repo} has no {ref}"
        return pin
    pin.resolved = head
    if recorded is not None:
        pin.state = PINNED if head == recorded else MOVED
        if pin.state == MOVED:
            pin.source = f"{HEAD_MOVED} ({pin.source})"
    elif head.startswith(e.commit):
        pin.state = RESOLVED
    else:
        pin.source = (f"{pin.source} is {head}, not the receipt's {e.commit}...: refused (the PR "
                      "head moved past the measured engine)")
        pin.resolved = None
    return pin


def revision_pin(cfg: StackConfig, receipt: Receipt, branch_commit: Callable, branch: str,
                 take: bool) -> Optional[Pin]:
    if not is_placeholder(cfg.weights_revision):
        return None          # a commit is a pin already; nothing upstream can move it
    pin = Pin("k3:weightsRevision", cfg.weights_revision, path=key_path("k3:weightsRevision"))
    endpoint = cfg.weights.hub_endpoint
    try:
        pin.resolved = branch_commit(receipt.model.repo, branch, endpoint)
    except HubError as exc:
        pin.source = str(exc)
        return pin
    where = endpoint or "the Hub (HF_ENDPOINT)"
    pin.source = f"{receipt.model.repo}@{branch} today, from {where}"
    if take:
        pin.state = RESOLVED
    else:
        pin.state = CHOICE
        pin.source += ": check it is the bytes you mean, then --take-revision"
    return pin


def cidrs_pin(cfg: StackConfig, api_factory: Callable) -> Optional[Pin]:
    if cfg.engine.build != "in-cluster":
        return None
    recorded = list(cfg.engine.api_server_cidrs)
    pin = Pin("k3:engine.apiServerCidrs", recorded or None, path=key_path("k3:engine.apiServerCidrs"))
    try:
        pin.resolved = api_server_cidrs(api_factory())
    except ClusterError as exc:
        pin.source = str(exc)
        return pin
    pin.source = "EndpointSlices default/kubernetes of the kubeconfig's cluster"
    if not recorded:
        pin.state = RESOLVED
    else:
        # Addresses are not a measurement: a difference is shown, never refused.
        pin.state = PINNED if sorted(recorded) == pin.resolved else UNRESOLVED
        if pin.state == UNRESOLVED:
            pin.source += ": differs from the recorded list; set it by hand if the cluster changed"
    return pin


def lock_pins(cfg: StackConfig, recipe, commit: Optional[str]) -> list[Pin]:
    if cfg.engine.build == "prebuilt":
        return []
    commit = commit or "<k3:engine.commit>"
    return [Pin(g.key, "missing", state=NOT_DONE,
                source=(f"not compiled here: `uv pip compile --generate-hashes` needs the engine "
                        f"source at {commit} (its requirements/*.txt; this command reads refs, "
                        "never fetches source) and PyPI plus the PyTorch index; docs/engine.md, "
                        "\"Supply chain\""))
            for g in lock_gates(recipe)]


def updated_raw(raw: dict[str, Any], pins: list[Pin]) -> dict[str, Any]:
    """The stack's config with each writable pin set (a deep copy; objects merged)."""
    out = copy.deepcopy(raw)
    for pin in pins:
        if not pin.writable:
            continue
        top, *rest = pin.path
        if not rest:
            out[top] = pin.resolved
            continue
        obj = out.get(top)
        obj = json.loads(obj) if isinstance(obj, str) else dict(obj or {})
        out[top] = obj
        for part in rest[:-1]:
            obj = obj.setdefault(part, {})
        obj[rest[-1]] = pin.resolved
    return out


__all__ = ["Pin", "RESOLVED", "PINNED", "MOVED", "CHOICE", "UNRESOLVED", "NOT_DONE", "TAG_MOVED",
           "HEAD_MOVED", "image_pins", "image_pin", "engine_commit_pin", "revision_pin",
           "cidrs_pin", "lock_pins", "updated_raw"]
