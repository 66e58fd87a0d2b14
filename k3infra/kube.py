"""Register manifest dicts (from the pure builders) as pulumi-kubernetes resources.

One mapping from apiVersion/kind to the typed resource class; anything not in it (CRDs
such as ServiceMonitor) becomes a CustomResource.
"""
from __future__ import annotations

from typing import Any, Optional

import pulumi
import pulumi_kubernetes as k8s

_TYPED = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "PersistentVolumeClaim"): k8s.core.v1.PersistentVolumeClaim,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("apps/v1", "StatefulSet"): k8s.apps.v1.StatefulSet,
    ("batch/v1", "Job"): k8s.batch.v1.Job,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
}
_TOP_LEVEL = ("spec", "data", "stringData", "type", "immutable",
              # RBAC and ServiceAccount fields live at the top level too.
              "rules", "roleRef", "subjects", "automountServiceAccountToken",
              "imagePullSecrets")


def apply_manifest(logical_name: str, manifest: dict[str, Any],
                   opts: Optional[pulumi.ResourceOptions] = None) -> pulumi.CustomResource:
    """Register one Kubernetes object; `logical_name` is its Pulumi name."""
    key = (manifest["apiVersion"], manifest["kind"])
    cls = _TYPED.get(key)
    if cls is None:
        return k8s.apiextensions.CustomResource(
            logical_name, api_version=manifest["apiVersion"], kind=manifest["kind"],
            metadata=manifest["metadata"],
            spec=manifest.get("spec"), opts=opts,
            **{k: v for k, v in manifest.items()
               if k not in ("apiVersion", "kind", "metadata", "spec")})
    kwargs = {_snake(k): v for k, v in manifest.items() if k in _TOP_LEVEL}
    return cls(logical_name, metadata=manifest["metadata"], opts=opts, **kwargs)


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)
