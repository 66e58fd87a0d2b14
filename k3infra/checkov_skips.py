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

# The image pre-pull DaemonSet only sleeps (k3infra/serving/prepull.py): a liveness probe
# on `sleep` could only pass, and a copy of its readiness probe is a finding of its own.
PREPULL_NO_LIVENESS = Skip(
    "CKV_K8S_8",
    "the pre-pull container only runs `sleep` so the kubelet pulls the image: a liveness "
    "probe could only pass (an exited container restarts anyway); readiness says the image "
    "is on the node")

# vLLM reads its API key from --api-key or VLLM_API_KEY only; there is no file option. The
# env var is filled from the Secret by secretKeyRef (never a literal: policy
# k3-no-literal-secrets), which keeps the key off the command line (visible in ps).
VLLM_API_KEY_ENV = Skip(
    "CKV_K8S_35",
    "vLLM takes its API key only from --api-key or VLLM_API_KEY (no file option); the env "
    "var comes from the Secret via secretKeyRef, keeping it off the command line")


# `vllm bench serve` reads the API key only from OPENAI_API_KEY (its request functions
# send os.environ["OPENAI_API_KEY"] as the Bearer token); there is no file option.
BENCH_API_KEY_ENV = Skip(
    "CKV_K8S_35",
    "vllm bench serve takes the API key only from OPENAI_API_KEY (no file option); the env "
    "var comes from the serving Secret via secretKeyRef, keeping it off the command line")

ACCURACY_API_KEY_ENV = Skip(
    "CKV_K8S_35",
    "lm-eval's local-chat-completions takes the API key only from OPENAI_API_KEY (no file "
    "option); the env var comes from the serving Secret via secretKeyRef")
ACCURACY_IMAGE_UID = Skip(
    "CKV_K8S_40",
    "the accuracy image runs as uid 1000 like the engine image (docs/accuracy.md); "
    "non-root, no privilege escalation, capabilities dropped, read-only root fs")

# checkov findings on the build Job that rootless BuildKit needs as they are (its
# examples/kubernetes/job.rootless.yaml), put on the Job as checkov skip annotations.
BUILDKIT_SKIPS = (
    Skip("CKV_K8S_20", "rootless BuildKit maps its user namespace with the setuid newuidmap, "
                       "which needs privilege escalation; it never runs as root"),
    Skip("CKV_K8S_37", "capabilities cannot all be dropped: newuidmap/newgidmap need "
                       "CAP_SETUID/CAP_SETGID from their setuid bit"),
    Skip("CKV_K8S_28", "the documented rootless BuildKit pod keeps the default capability set; "
                       "a reduced one is not tested here"),
    Skip("CKV_K8S_40", "the moby/buildkit rootless image's user is uid 1000, with its subuid "
                       "range set up for that uid"),
    Skip("CKV_K8S_22", "BuildKit writes its state, runtime dir and temp files across the "
                       "image's file system; a read-only root is not tested here"),
)


# The inference gateway's endpoint picker (k3infra/gateway/picker.py) is a Kubernetes
# controller: it watches its InferencePool and the pool's pods through the API server.
EPP_SA_TOKEN = Skip(
    "CKV_K8S_38",
    "the endpoint picker watches its InferencePool and the pool's pods through the API "
    "server: it needs its ServiceAccount token (a Role with read verbs on those, in this "
    "namespace only)")

ALL_SKIPS = (ENGINE_IMAGE_UID, PREPULL_NO_LIVENESS, VLLM_API_KEY_ENV, BENCH_API_KEY_ENV,
             ACCURACY_API_KEY_ENV, ACCURACY_IMAGE_UID, EPP_SA_TOKEN, *BUILDKIT_SKIPS)


def annotations(*skips: Skip) -> dict[str, str]:
    return {f"checkov.io/skip{i}": f"{s.check}={s.reason}" for i, s in enumerate(skips, 1)}
