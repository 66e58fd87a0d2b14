"""The security context of every pod that runs the engine image (serving, weights
prefetch and gate, benchmark): the engine image's own non-root user, no privilege
escalation, no capabilities, RuntimeDefault seccomp, read-only root file system.

One place, because the uid is shared state: files the prefetch writes must be readable
by the server, and a node-local weights root must be owned by it (k3infra/nodepool).
"""
from __future__ import annotations

# The engine image's user (images/Dockerfile: `vllm`, uid/gid 1000).
ENGINE_UID = 1000
ENGINE_GID = 1000


def pod_security_context() -> dict:
    return {"runAsNonRoot": True, "runAsUser": ENGINE_UID, "runAsGroup": ENGINE_GID,
            "fsGroup": ENGINE_GID, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> dict:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "runAsUser": ENGINE_UID, "runAsGroup": ENGINE_GID,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
