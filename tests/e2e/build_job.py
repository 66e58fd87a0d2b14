"""The in-cluster engine build as the stack renders it, for the e2e tier's recipe
(tests/e2e/recipes/tiny-engine) and a registry of the test: the objects for
test_engine_build_scripts.py (the Job's scripts beside the test), the broken recipe for
it and for test_node_stack.py (the Job itself on the node, through `pulumi up`)."""
from __future__ import annotations

from pathlib import Path

from k3infra.config import parse_stack_config
from k3infra.engine import component as ec
from k3infra.engine import manifests as em
from k3infra.engine.plan import EnginePlan, build_namespace, resolve_engine
from k3infra.receipt import load_receipt

RECIPE = Path(__file__).resolve().parent / "recipes" / "tiny-engine"
REVISION = "1" * 40
REPO_PATH = "k3e2e/vllm"
LABELS = {"app.kubernetes.io/name": "kimi-k3", "app.kubernetes.io/component": "engine-build"}


def recipe() -> dict[str, str]:
    """The recipe's files, as the stack reads them (k3infra.engine.component.recipe_files)."""
    return ec.recipe_files(RECIPE)


def build_objects(registry: str, base: str, context: dict[str, str],
                  **engine) -> tuple[EnginePlan, em.BuildNames, dict[str, dict]]:
    """(plan, names, objects) of an in-cluster build of the recipe files `context`,
    pushing to registry/k3e2e/vllm, with `base` as both of the recipe's base images
    (k3:engine.baseImages.uv and .cudaDevel), `engine` more k3:engine keys."""
    receipt = load_receipt()
    cfg = parse_stack_config({"weightsRevision": REVISION, "apiKey": "k", "namespace": "k3",
                              "profile": "custom", "engine": {
        "build": "in-cluster", "registry": f"{registry}/{REPO_PATH}", "registrySecret": "push",
        # The full commit a user resolves once; here the receipt's prefix, padded.
        "commit": receipt.engine.commit.ljust(40, "0"), "recipeDir": str(RECIPE),
        "baseImages": {"cudaDevel": base, "uv": base}, **engine}}, receipt=receipt)
    plan = resolve_engine(receipt, cfg)
    scripts = ec.job_files()
    names = em.BuildNames("kimi-k3", build_namespace(cfg),
                          em.build_hash(plan, cfg, context, scripts))
    return plan, names, em.build_manifests(plan, cfg, names, LABELS, context, scripts)


def broken_recipe() -> dict[str, str]:
    """The recipe with a failing first RUN (a broken build step, exit code 3)."""
    files = recipe()
    files["Dockerfile"] = files["Dockerfile"].replace(
        "RUN set -eu; mkdir -p /dist;",
        "RUN echo 'k3 e2e: a broken step' >&2; exit 3; mkdir -p /dist;")
    assert files["Dockerfile"] != recipe()["Dockerfile"]
    return files


def pushed_repo_tag(plan: EnginePlan) -> tuple[str, str]:
    """(repository path, tag) of the build's target inside its registry."""
    repo, tag = plan.tagged_ref.split("/", 1)[1].rsplit(":", 1)
    return repo, tag
