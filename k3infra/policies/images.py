"""Every container image pinned by digest: a tag moves, a digest does not."""
from __future__ import annotations

import re

from pulumi_policy import (EnforcementLevel, ReportViolation, ResourceValidationArgs,
                           ResourceValidationPolicy)

from k3infra.fieldtypes import HEX64
from k3infra.policies.workloads import get, workloads

from k3infra.policies import stack_config
_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs
# Any repository (a policy judges foreign images too), matched whole: \A..\Z, not `$`.
DIGEST_REF = re.compile(r"\A(?P<name>[^@\s]+)@sha256:" + HEX64 + r"\Z")


def image_problem(image: object) -> str | None:
    """Why an image reference is not acceptable (None when it is pinned)."""
    if not isinstance(image, str) or not image:
        return "has no image"
    match = DIGEST_REF.match(image)
    last = (match.group("name") if match else image).rsplit("/", 1)[-1]
    if ":" in last and last.rsplit(":", 1)[1] == "latest":
        return f"image {image!r} names the tag `latest`"
    if not match:
        return f"image {image!r} is not pinned by digest (<repository>@sha256:<64 hex>)"
    return None


def _validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for wl in workloads(args.resource_type, args.props):
        for c in wl.containers():
            problem = image_problem(get(c.spec, "image"))
            if problem:
                report(f"{wl.kind} {wl.name} {c.list_name[:-1]} {c.name}: {problem}", None)


image_digest = ResourceValidationPolicy(
    name="k3-image-digest",
    description=(f"Every container image is pinned by digest (no tag-only reference, no "
                 f"`latest`): the receipt's engine is one build ({_receipt().engine.name} "
                 f"{_receipt().engine.version} @ {_receipt().engine.commit}) and only a digest names the same "
                 "bytes on every node and every restart."),
    validate=_validate,
    enforcement_level=EnforcementLevel.MANDATORY,
)

POLICIES = [image_digest]
