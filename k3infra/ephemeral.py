"""Ephemeral storage for every container k3infra writes: the node's disk a container uses
outside its volumes' claims (its writable layer, its logs, the disk-backed emptyDirs it
mounts). The kubelet schedules by the requests and evicts a pod whose use goes beyond its
containers' limits (emptyDirs without a sizeLimit count against the sum), so a pod that
fills the node's disk with logs or scratch is stopped by its own limit, said in advance,
not by the node running out under the serving pod.

Each builder states what its container writes and calls `with_storage`; the figures are
GiB, written as Kubernetes quantities like memory.
"""
from __future__ import annotations

from k3infra.config.models import memory_quantity

# Logs: the kubelet keeps at most containerLogMaxFiles x containerLogMaxSize of a
# container's output (5 x 10 MiB by default); a quarter GiB leaves room for a node that
# keeps more.
LOGS_GI = 0.25
# A container that writes nothing but its logs (read-only root file system, no emptyDir).
LOGS_ONLY = (1 / 64, LOGS_GI)


def with_storage(resources: dict, request_gi: float, limit_gi: float) -> dict:
    """`resources` (requests and limits) with an ephemeral-storage request and limit."""
    return {**resources,
            "requests": {**resources.get("requests", {}),
                         "ephemeral-storage": memory_quantity(request_gi)},
            "limits": {**resources.get("limits", {}),
                       "ephemeral-storage": memory_quantity(limit_gi)}}
