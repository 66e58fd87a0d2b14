"""What a build hands back to Pulumi, checked before it reaches the StatefulSet.

Pure: the result ConfigMap's data (in-cluster) or the exported wheel record (local) ->
BuildResult. A missing or inconsistent value is an error, never a fallback: the image a
stack serves must be the one this build pushed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from k3infra.engine.plan import EnginePlan
from k3infra.fieldtypes import COMMIT, SHA256_DIGEST, SHA256_HEX
from k3infra.podcommon import JsonRefused, parse_json

# The config's own types (k3infra.fieldtypes), anchored \A..\Z: the result ConfigMap is
# written by the build pod, and a value with a trailing newline is not a digest.
DIGEST = SHA256_DIGEST.anchored
SHA256 = SHA256_HEX.anchored
FULL_SHA = COMMIT.anchored


class EngineBuildError(RuntimeError):
    """The build's result is missing or does not match the plan."""


@dataclass(frozen=True)
class BuildResult:
    image: str              # repository@sha256:...
    digest: str
    wheel_sha256: Optional[str]
    engine_commit: str      # full 40-hex SHA
    vllm_version: str


def _commit(commit: str, plan: EnginePlan, where: str) -> str:
    """The build's commit is the pinned one (k3:engine.commit), exactly."""
    pinned = plan.engine_commit or "\0"
    if not isinstance(commit, str) or not FULL_SHA.match(commit) or not (
            commit == pinned if FULL_SHA.match(pinned) else commit.startswith(pinned)):
        raise EngineBuildError(f"{where}: engine commit {commit!r} is not the pinned "
                               f"{plan.engine_commit}")
    return commit


def _version(version: str, plan: EnginePlan, where: str) -> str:
    if version != plan.engine_version:
        raise EngineBuildError(f"{where}: vLLM version {version!r} is not the receipt's "
                               f"{plan.engine_version}")
    return version


def check_result_object(immutable: Optional[bool], uid: Optional[str], created_uid: Optional[str],
                        where: str = "engine build result") -> None:
    """The result ConfigMap Pulumi reads must be the one it created (same uid), made
    immutable by the Job's single write: anything else could carry another digest."""
    if immutable is not True:
        raise EngineBuildError(f"{where} is not immutable: the build Job writes it once and "
                               "makes it immutable; a mutable one may have been edited since")
    if not uid or uid != created_uid:
        raise EngineBuildError(f"{where} is not the ConfigMap this stack created (uid {uid!r}, "
                               f"created {created_uid!r}): it was deleted and re-created")


def parse_build_result(data: Optional[Mapping[str, str]], plan: EnginePlan,
                       where: str = "engine build result") -> BuildResult:
    """The in-cluster Job's ConfigMap data (written by pod/report.py)."""
    data = dict(data or {})
    digest = data.get("digest", "")
    if not DIGEST.match(digest):
        raise EngineBuildError(f"{where}: no image digest (did the build Job finish? "
                               f"data keys: {sorted(data)})")
    image = data.get("image", "")
    if image != f"{plan.repository}@{digest}":
        raise EngineBuildError(f"{where}: image {image!r} is not {plan.repository}@{digest}")
    sha = data.get("wheelSha256", "")
    if not SHA256.match(sha):
        raise EngineBuildError(f"{where}: no wheel sha256 ({sha!r})")
    return BuildResult(image=image, digest=digest, wheel_sha256=sha,
                       engine_commit=_commit(data.get("engineCommit", ""), plan, where),
                       vllm_version=_version(data.get("vllmVersion", ""), plan, where))


def parse_wheel_record(text: str, plan: EnginePlan, where: str = "engine-wheel.json") -> dict:
    """Pass 1's record (images/k3_engine_build.py wheel-record), for the local mode's
    second pass: {sha256, engine_commit, version, ...}."""
    try:
        record = parse_json(text)             # bounded: what the build wrote is data
    except JsonRefused as exc:
        raise EngineBuildError(f"{where}: not a record ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str) \
            or not SHA256.match(record["sha256"]):
        raise EngineBuildError(f"{where}: no wheel sha256")
    _commit(record.get("engine_commit", ""), plan, where)
    _version(record.get("version", ""), plan, where)
    return record


def image_from_digest(repository: str, digest: str, plan: EnginePlan) -> str:
    """repository@digest for the local mode (pulumi-docker-build's `digest` output)."""
    if not DIGEST.match(digest or ""):
        raise EngineBuildError(f"the local build returned no digest ({digest!r}) for {repository}")
    return f"{repository}@{digest}"
