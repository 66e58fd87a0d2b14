"""What a render prints: pins, the full `vllm serve` line, placement, HBM headroom,
startup budget. Pure: (config, render, plan) -> rows (k3infra.plan: the fit and the
budget, resolved once). The `vllm serve` line is read from the rendered StatefulSet, so
it shows what the pods run, not a recomputation."""
from __future__ import annotations

from typing import Optional

from k3infra.config import StackConfig
from k3infra.display import styled
from k3infra.plan import ServingPlan
from k3infra.topology import not_measured_text
from k3infra.serve_argv import SERVING_CONTAINER, serve_argv
from k3infra.serving import rollout
from k3infra.weights import fanout
from k3infra.weights import manifests as w


def rendered_serve_line(render, template: str = "leaderTemplate") -> str:
    """`vllm serve ...` exactly as the rendered StatefulSet's vllm container runs it; in a
    multi-node render, the first LeaderWorkerSet's `template` (leader or worker)."""
    workloads = [o for o in render.manifests() if o["kind"] in ("StatefulSet", "LeaderWorkerSet")]
    if workloads[0]["kind"] == "StatefulSet":
        (sts,) = workloads
        pod = sts["spec"]["template"]
    else:
        pod = workloads[0]["spec"]["leaderWorkerTemplate"][template]
    (vllm,) = [c for c in pod["spec"]["containers"] if c["name"] == SERVING_CONTAINER]
    argv = serve_argv(vllm)
    # From `vllm serve` on: the weights gate that runs first has its own row.
    start = next((i for i in range(len(argv) - 1) if argv[i] == "vllm" and argv[i + 1] == "serve"), 0)
    return " ".join(argv[start:])


def summary_rows(cfg: StackConfig, render, plan: ServingPlan,
                 serve_line: Optional[str] = None) -> list[tuple[str, object]]:
    """`serve_line`: the rendered `vllm serve` line when it is not a StatefulSet's (a
    Docker host's server container, k3infra/host/report.py)."""
    r = plan.receipt
    image = render.outputs.get("image", cfg.engine_image)
    if plan.multi_node:
        mn = cfg.multi_node
        topology_rows = [
            ("topology", styled((not_measured_text(r), "bold red"))),
            ("vllm serve (worker)", rendered_serve_line(render, "workerTemplate")),
        ]
        placement = (f"{cfg.replicas} replica(s) x {mn.nodes_per_replica} pods x "
                     f"{mn.gpus_per_node} GPUs (one LeaderWorkerSet and one ComputeDomain per "
                     f"replica) on nvidia.com/gpu.product={cfg.gpu_product}, both pods of a "
                     f"replica in one NVLink domain ({mn.domain_label}); one pod per node; "
                     f"pool: {cfg.node_pool.provider}")
    else:
        topology_rows = []
        placement = (f"{cfg.replicas} replica(s) x {r.measured_gpu.gpus_per_node} GPUs on "
                     f"nvidia.com/gpu.product={cfg.gpu_product}; one replica per node; "
                     f"pool: {cfg.node_pool.provider}")
    return [
        ("receipt", r.id if not r.is_candidate else
         styled((f"{r.id}: {r.standing()}", "bold yellow"))),
        ("profile", cfg.profile if cfg.profile == "measured" else
         styled((f"{cfg.profile}: NOT the measured configuration", "bold red"))),
        # EngineBuild's label: the receipt's engine and how it is obtained, or the
        # upstream release marked "not the measured engine".
        ("engine", str(render.outputs.get("engineProfile")
                       or r.engine.describe())),
        ("image", str(image)),
        ("weights", f"{r.model.repo} @ {cfg.weights_revision}, tree {r.model.tree_digest}"),
        ("weights storage", f"{cfg.weights.mode}; prefetch Job timeout "
         f"{w.prefetch_timeout_seconds(r, cfg)} s"),
        ("weights fill", f"k3:weights.source {cfg.weights.source}: "
         f"{fanout.fill_plan(r, cfg).summary()}"),
        ("weights gate", w.gate_summary(r, cfg)),
        ("vllm serve", serve_line or rendered_serve_line(render)),
        *topology_rows,
        ("env", " ".join(f"{k}={v}" for k, v in r.serve.engine_env_map().items())),
        ("placement", placement),
        ("rollout", rollout.what_happens(r, cfg)),
        ("HBM", plan.fit.summary()),
        *plan.budget.rows(),
    ]
