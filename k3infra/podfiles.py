"""Pod code: files of this package shipped to pods in a ConfigMap and mounted read-only.

The one mechanism for every piece of code k3infra runs in a pod: the weights runtime (the
prefetch, the gate before every start, the audit), the benchmark and accuracy runners and
the engine build's scripts. The images those pods run are not the project's own (the
receipt's vLLM image or the user's, an lm-eval image, BuildKit's), so the code travels
with the manifests, and any image with python3 (or sh) runs it. What may import what
inside such a package is policed by tests/test_packaging.py. The weights runtime adds a
digest check of its own files before it runs (weights/pod/bootstrap.py). The serving
container's start script is read here too but carried in the pod spec itself, not in a
ConfigMap (k3infra/serving/start.py says why).
"""
from __future__ import annotations

from importlib import resources
from typing import Iterable, Mapping, Optional


def package_files(package: str, names: Iterable[str], *folder: str) -> dict[str, str]:
    """The text of files of a k3infra package (in `folder` under it), by name."""
    root = resources.files(package).joinpath(*folder)
    return {name: root.joinpath(name).read_text() for name in names}


def configmap(metadata: dict, files: Mapping[str, str], *, immutable: bool = False) -> dict:
    """The ConfigMap that carries `files` (key -> text). Immutable where pods pin its
    content: a changed file is a new ConfigMap (named by its content), never an edit."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": dict(files)}
    if immutable:
        cm["immutable"] = True
    return cm


def volume(name: str, configmap_name: str, paths: Optional[Mapping[str, str]] = None,
           mode: int = 0o444) -> dict:
    """A volume of those files: key -> path under the mount (None: every key at its own
    name); read-only files, executable with mode 0o555."""
    source: dict = {"name": configmap_name, "defaultMode": mode}
    if paths is not None:
        source["items"] = [{"key": k, "path": p} for k, p in paths.items()]
    return {"name": name, "configMap": source}
