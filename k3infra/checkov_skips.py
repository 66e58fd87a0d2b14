"""checkov findings k3infra does not fix, each with the reason, put on the object as the
`checkov.io/skip<N>: <CHECK>=<reason>` annotations checkov reads (docs/policy.md lists
them). Pure data; the builders merge `annotations(...)` into an object's metadata."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Skip:
    check: str
    reason: str


# The engine image (images/Dockerfile) runs as its own non-root user `vllm`, uid/gid 1000,
# which owns its home and has a passwd entry; the weights pods share that uid so files the
# prefetch writes are the server's to read. A uid unknown to the image breaks libraries that
# look the user up (getpass.getuser() in torch's compile cache path). Mitigated: non-root,
# no privilege escalation, all capabilities dropped, read-only root file system.
ENGINE_IMAGE_UID = Skip(
    "CKV_K8S_40",
    "runs as the engine image's own non-root user (uid 1000, images/Dockerfile); a uid the "
    "image does not know breaks user lookups in torch; non-root, no privilege escalation, "
    "capabilities dropped, read-only root fs")

# vLLM reads its API key from --api-key or VLLM_API_KEY only; there is no file option. The
# env var is filled from the Secret by secretKeyRef (never a literal: policy
# k3-no-literal-secrets), which keeps the key off the command line (visible in ps).
VLLM_API_KEY_ENV = Skip(
    "CKV_K8S_35",
    "vLLM takes its API key only from --api-key or VLLM_API_KEY (no file option); the env "
    "var comes from the Secret via secretKeyRef, keeping it off the command line")


def annotations(*skips: Skip) -> dict[str, str]:
    return {f"checkov.io/skip{i}": f"{s.check}={s.reason}" for i, s in enumerate(skips, 1)}
