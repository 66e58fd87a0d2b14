"""Reading Kubernetes workloads out of the properties CrossGuard hands a policy.

Properties arrive as pulumi-policy's read-only proxies (Mapping / Sequence, numbers as
floats, unknown values raising `UnknownValueError` in a preview), or as plain dicts in
unit tests: everything here goes through the abstract collection types only.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from k3infra.placement import GPU_PRODUCT_LABEL

# Where each workload kind keeps its pod template (Pod itself: metadata + spec).
_TEMPLATE_PATH = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "PodTemplate": ("template",),
}
# A multi-node replica (k3infra/serving/group.py): one LeaderWorkerSet, two pod templates.
LEADER_WORKER_SET = "LeaderWorkerSet"
PROFILE_ANNOTATION = "k3infra.dev/profile"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def kind_of(resource_type: str) -> Optional[str]:
    """`kubernetes:apps/v1:StatefulSet` -> `StatefulSet`; None for non-Kubernetes types."""
    if not resource_type.startswith("kubernetes:"):
        return None
    return resource_type.rsplit(":", 1)[-1]


def get(obj: Any, *path: Any, default: Any = None) -> Any:
    """`obj[path[0]][path[1]]...`, or `default` where a step is missing."""
    for key in path:
        if isinstance(obj, Mapping):
            if key not in obj:
                return default
            obj = obj[key]
        elif isinstance(obj, Sequence) and not isinstance(obj, str) and isinstance(key, int):
            if not -len(obj) <= key < len(obj):
                return default
            obj = obj[key]
        else:
            return default
    return obj


def items(obj: Any) -> list:
    """A list property as a Python list ([] when absent or not a list)."""
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        return [obj[i] for i in range(len(obj))]
    return []


def mapping(obj: Any) -> dict:
    """A map property as a dict ({} when absent or not a map)."""
    if isinstance(obj, Mapping):
        return {k: obj[k] for k in obj}
    return {}


def as_int(value: Any) -> Optional[int]:
    """Wire numbers are floats and quantities strings: 8, 8.0 and "8" are all 8."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(str(value))
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


@dataclass
class Container:
    name: str
    list_name: str        # initContainers | containers | ephemeralContainers
    spec: Mapping

    @property
    def is_init(self) -> bool:
        return self.list_name == "initContainers"

    def env(self) -> list[Mapping]:
        return [e for e in items(get(self.spec, "env")) if isinstance(e, Mapping)]

    def env_value(self, name: str) -> Optional[str]:
        for e in self.env():
            if get(e, "name") == name:
                value = get(e, "value")
                return None if value is None else str(value)
        return None

    def env_names(self) -> list[str]:
        return [str(get(e, "name")) for e in self.env()]

    def tokens(self) -> list[str]:
        """command + args, with `sh -c "..."` strings split into words."""
        out: list[str] = []
        for word in [*items(get(self.spec, "command")), *items(get(self.spec, "args"))]:
            word = str(word)
            if " " in word.strip():
                try:
                    out += shlex.split(word)
                except ValueError:
                    out += word.split()
            else:
                out.append(word)
        return out

    def serve_tokens(self) -> Optional[list[str]]:
        """The `vllm serve` arguments (after `serve`), or None if this is not a vLLM server."""
        words = self.tokens()
        for i, word in enumerate(words):
            if os.path.basename(word) == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
                return words[i + 2:]
            if word == "vllm.entrypoints.openai.api_server":
                return words[i + 1:]
        return None

    @property
    def is_vllm_server(self) -> bool:
        return self.serve_tokens() is not None

    def mounts(self) -> list[Mapping]:
        return [m for m in items(get(self.spec, "volumeMounts")) if isinstance(m, Mapping)]


@dataclass
class Workload:
    """One pod template inside a Kubernetes resource."""

    kind: str
    name: str              # metadata.name of the object (not the Pulumi name)
    namespace: str
    metadata: Mapping      # the object's metadata
    pod_metadata: Mapping  # the pod template's metadata
    pod_spec: Mapping
    role: str = ""         # a LeaderWorkerSet's template: "leader" or "worker"

    def containers(self) -> list[Container]:
        out = []
        for list_name in CONTAINER_LISTS:
            for c in items(get(self.pod_spec, list_name)):
                if isinstance(c, Mapping):
                    out.append(Container(str(get(c, "name", default="")), list_name, c))
        return out

    def vllm_servers(self) -> list[Container]:
        return [c for c in self.containers() if c.is_vllm_server]

    @property
    def is_serving(self) -> bool:
        return bool(self.vllm_servers())

    def labels(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in mapping(get(self.pod_metadata, "labels")).items()}

    def annotation(self, key: str) -> Optional[str]:
        """A pod-template annotation, else the object's own."""
        for meta in (self.pod_metadata, self.metadata):
            value = get(meta, "annotations", key)
            if value is not None:
                return str(value)
        return None

    def volumes(self) -> dict[str, Mapping]:
        return {str(get(v, "name")): v for v in items(get(self.pod_spec, "volumes"))
                if isinstance(v, Mapping)}

    def gpu_products(self) -> Optional[list[Optional[list[str]]]]:
        """The GPU products each required node-selector term admits (terms are ORed; a
        term without a product constraint admits any GPU: None inside the list), or None
        when nothing constrains the product at all."""
        selector = get(self.pod_spec, "nodeSelector", GPU_PRODUCT_LABEL)
        pinned = [str(selector)] if selector is not None else None
        terms = items(get(self.pod_spec, "affinity", "nodeAffinity",
                          "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"))
        per_term: list[Optional[list[str]]] = []
        for term in terms:
            allowed = pinned
            for expr in items(get(term, "matchExpressions")):
                if get(expr, "key") == GPU_PRODUCT_LABEL and get(expr, "operator") == "In":
                    values = [str(v) for v in items(get(expr, "values"))]
                    allowed = values if allowed is None else [v for v in allowed if v in values]
            per_term.append(allowed)
        if not terms:
            return None if pinned is None else [pinned]
        if all(t is None for t in per_term):
            return None
        return per_term


def workloads(resource_type: str, props: Mapping) -> Iterator[Workload]:
    """The pod template(s) of a Kubernetes resource (none for other resources)."""
    kind = kind_of(resource_type) or get(props, "kind")
    if kind == LEADER_WORKER_SET or get(props, "kind") == LEADER_WORKER_SET:
        yield from _group_workloads(props)
        return
    if kind == "Pod":
        pod_meta, spec = get(props, "metadata"), get(props, "spec")
    elif kind in _TEMPLATE_PATH:
        template = get(props, *_TEMPLATE_PATH[kind])
        pod_meta, spec = get(template, "metadata"), get(template, "spec")
    else:
        return
    if not isinstance(spec, Mapping):
        return
    meta = get(props, "metadata") or {}
    yield Workload(str(kind), str(get(meta, "name", default="")),
                   str(get(meta, "namespace", default="default")), meta,
                   pod_meta if isinstance(pod_meta, Mapping) else {}, spec)


def _group_workloads(props: Mapping) -> Iterator[Workload]:
    """A LeaderWorkerSet's leader template (the worker's when it has none, as the
    controller does) and its worker template."""
    meta = get(props, "metadata") or {}
    lwt = get(props, "spec", "leaderWorkerTemplate")
    worker = get(lwt, "workerTemplate")
    for role, template in (("leader", get(lwt, "leaderTemplate") or worker), ("worker", worker)):
        spec = get(template, "spec")
        if not isinstance(spec, Mapping):
            continue
        pod_meta = get(template, "metadata")
        yield Workload(LEADER_WORKER_SET, str(get(meta, "name", default="")),
                       str(get(meta, "namespace", default="default")), meta,
                       pod_meta if isinstance(pod_meta, Mapping) else {}, spec, role)


def label_selector_matches(selector: Any, labels: dict[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (an empty selector selects everything)."""
    for key, value in mapping(get(selector, "matchLabels")).items():
        if labels.get(str(key)) != str(value):
            return False
    for expr in items(get(selector, "matchExpressions")):
        key, op = str(get(expr, "key")), get(expr, "operator")
        values = [str(v) for v in items(get(expr, "values"))]
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True
