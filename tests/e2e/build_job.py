"""The in-cluster engine build as the stack renders it, for the e2e tier's recipe
(tests/e2e/recipes/tiny-engine) and a registry of the test: shared by
test_engine_build_scripts.py (the Job's scripts beside the test) and
test_node_engine_build.py (the Job itself on the node)."""
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


def recipe() -> str:
    return (RECIPE / "Dockerfile").read_text()


def build_objects(registry: str, base: str, dockerfile: str,
                  **engine) -> tuple[EnginePlan, em.BuildNames, dict[str, dict]]:
    """(plan, names, objects) of an in-cluster build pushing to registry/k3e2e/vllm, the
    recipe's base image `base` (as k3:engine.baseImages.cudaDevel), `engine` more
    k3:engine keys."""
    receipt = load_receipt()
    cfg = parse_stack_config({"weightsRevision": REVISION, "apiKey": "k", "namespace": "k3", "engine": {
        "build": "in-cluster", "registry": f"{registry}/{REPO_PATH}", "registrySecret": "push",
        # The full commit a user resolves once; here the receipt's prefix, padded.
        "commit": receipt.engine.commit.ljust(40, "0"),
        "baseImages": {"cudaDevel": base}, **engine}}, receipt=receipt)
    plan = resolve_engine(receipt, cfg)
    context = {"Dockerfile": dockerfile}
    scripts = ec.job_files()
    names = em.BuildNames("kimi-k3", build_namespace(cfg),
                          em.build_hash(plan, cfg, context, scripts))
    return plan, names, em.build_manifests(plan, cfg, names, LABELS, context, scripts)


def pushed_repo_tag(plan: EnginePlan) -> tuple[str, str]:
    """(repository path, tag) of the build's target inside its registry."""
    repo, tag = plan.tagged_ref.split("/", 1)[1].rsplit(":", 1)
    return repo, tag
