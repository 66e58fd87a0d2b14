"""Register manifest dicts (from the pure builders) as pulumi-kubernetes resources.

One mapping from apiVersion/kind to the typed resource class; anything not in it (CRDs
such as ServiceMonitor) becomes a CustomResource. A manifest may be an Output (built from
a config with wired Inputs, k3infra.inputs); its apiVersion and kind are then taken from
the plain build, which has the same shape.

Which cluster: the `provider`/`providers` resource option of the enclosing component
reaches every object through `parent` (Pulumi's own inheritance); nothing here picks a
kubeconfig. `child_options` carries the component's `depends_on` to each child, so the
state records the edge on the object that needs it, not only on the component.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import pulumi
import pulumi_kubernetes as k8s

from k3infra.inputs import wired_build

_TYPED = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "PersistentVolumeClaim"): k8s.core.v1.PersistentVolumeClaim,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("apps/v1", "StatefulSet"): k8s.apps.v1.StatefulSet,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
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


def apply_manifest(logical_name: str, manifest: Union[dict[str, Any], pulumi.Output],
                   opts: Optional[pulumi.ResourceOptions] = None,
                   shape: Optional[dict[str, Any]] = None) -> pulumi.CustomResource:
    """Register one Kubernetes object; `logical_name` is its Pulumi name. An Output
    manifest needs `shape`: a plain manifest of the same kind and keys."""
    plain = manifest if isinstance(manifest, dict) else shape
    if plain is None:
        raise TypeError(f"{logical_name}: an Output manifest needs its plain shape")

    def field(key: str) -> Any:
        if isinstance(manifest, dict):
            return manifest.get(key)
        return manifest.apply(lambda m: m.get(key))

    key = (plain["apiVersion"], plain["kind"])
    cls = _TYPED.get(key)
    if cls is None:
        return k8s.apiextensions.CustomResource(
            logical_name, api_version=plain["apiVersion"], kind=plain["kind"],
            metadata=field("metadata"),
            spec=field("spec") if "spec" in plain else None, opts=opts,
            **{k: field(k) for k in plain if k not in ("apiVersion", "kind", "metadata", "spec")})
    kwargs = {_snake(k): field(k) for k in plain if k in _TOP_LEVEL}
    return cls(logical_name, metadata=field("metadata"), opts=opts, **kwargs)


def apply_built(logical_name: str, inputs: Any, build: Callable[[Any], dict[str, Any]],
                opts: Optional[pulumi.ResourceOptions] = None) -> pulumi.CustomResource:
    """Register `build(config)`: from the plain config, or (when an Input was wired) with
    the resolved values at the leaves they reach (`inputs`: a k3infra.inputs.StackInputs;
    k3infra.inputs.wired_build)."""
    return apply_manifest(logical_name, wired_build(inputs, build), opts, build(inputs.plain))


def outer_depends_on(opts: Optional[pulumi.ResourceOptions]) -> list:
    """The `depends_on` a component was given, as a list."""
    deps = opts.depends_on if opts is not None else None
    if deps is None:
        return []
    return list(deps) if isinstance(deps, (list, tuple)) else [deps]


def child_options(parent: pulumi.Resource, opts: Optional[pulumi.ResourceOptions],
                  *depends_on: Any, **extra: Any) -> pulumi.ResourceOptions:
    """Options of a child: parent (so the provider is inherited), the component's own
    depends_on plus `depends_on`, and any other option in `extra`."""
    deps = [*outer_depends_on(opts), *depends_on]
    return pulumi.ResourceOptions(parent=parent, depends_on=deps or None, **extra)


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def mark_every_object(annotations: dict[str, str], labels: dict[str, str]):
    """A transformation (`ResourceOptions.transformations` of a component) that adds these
    annotations and labels to every Kubernetes object registered under the component, at
    any depth, unless the object sets the key itself (a multi-node stack is labelled not
    measured on every object, not only on its workloads)."""

    def add(meta: Any) -> dict:
        meta = dict(meta or {})
        meta["annotations"] = {**annotations, **(meta.get("annotations") or {})}
        meta["labels"] = {**labels, **(meta.get("labels") or {})}
        return meta

    def transform(args: pulumi.ResourceTransformationArgs):
        if not args.type_.startswith("kubernetes:") or args.type_.startswith("kubernetes:helm"):
            return None
        meta = args.props.get("metadata")
        plain = isinstance(meta, dict) and all(
            isinstance(meta.get(k), (dict, type(None))) for k in ("annotations", "labels"))
        new_meta = add(meta) if plain else pulumi.Output.from_input(meta).apply(add)
        return pulumi.ResourceTransformationResult({**args.props, "metadata": new_meta}, args.opts)

    return transform
