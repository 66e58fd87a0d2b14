"""Weights runtime: the lock file (k3-tree-v1), the parallel verifier and the prefetch.

These files run inside pods from a ConfigMap as the top-level package `k3weights`
(`python3 -m k3weights lock|verify|prefetch ...`), so the runtime modules use the
standard library plus huggingface_hub only (and obstore where a pod reads an
object store: imported by k3weights.store alone), and import each other relatively. This
file must stay import-light: no pulumi, pydantic or rich here.
"""

from pathlib import Path

# The files the ConfigMap ships (k3infra/weights/manifests.py reads this tuple).
RUNTIME_FILES = ("__init__.py", "tree.py", "verify.py", "gate.py", "store.py", "sources.py",
                 "hubapi.py", "prefetch.py", "__main__.py")
# Shipped into the same package from k3infra/ itself (one copy of the shared helpers: the
# bounded reader and writer, and the one HTTP client).
SHARED_FILES = ("podcommon.py", "httpclient.py")


def runtime_paths() -> dict:
    """Every file of the pod runtime package: shipped name -> source path."""
    here = Path(__file__).resolve().parent
    return {**{n: here / n for n in RUNTIME_FILES}, **{n: here.parent / n for n in SHARED_FILES}}
