"""The engine image: which vLLM a stack runs and how its image is obtained.

`resolve_engine(receipt, cfg) -> EnginePlan` is pure; `EngineBuild` (component.py) is the
Pulumi component whose `image` output (repo@sha256:...) the serving StatefulSet uses.
"""
from k3infra.engine.plan import (NOT_MEASURED, RECIPE_CUDA_VERSION, UPSTREAM_MIN_VERSION,
                                 EnginePlan, arch_list, build_args, build_parallelism,
                                 engine_gates, resolve_engine)

__all__ = ["EnginePlan", "resolve_engine", "engine_gates", "build_args", "build_parallelism", "arch_list",
           "UPSTREAM_MIN_VERSION", "RECIPE_CUDA_VERSION", "NOT_MEASURED", "EngineBuild",
           "EngineBuildArgs"]


def __getattr__(name: str):
    # The component imports pulumi-kubernetes (0.19 s with the Pulumi SDK, python -X
    # importtime), which the pure users (render summary, `k3infra engine`) need not.
    if name in ("EngineBuild", "EngineBuildArgs"):
        from k3infra.engine import component
        return getattr(component, name)
    raise AttributeError(name)
