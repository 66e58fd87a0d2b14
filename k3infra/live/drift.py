"""What `k3infra verify` decides: the live deployment against the receipt. Pure: it gets
objects already read from the cluster (plain dicts, camelCase as the API serves them)
and returns rows; k3infra.live.cluster does the reading.

Three areas, one row per check:
- statefulset: image pinned by digest (and the expected one), receipt annotations, the
  receipt's engine args contiguous and in order right after the model directory, no
  engine-path flag or env var outside the receipt and its surface allow-list, the
  receipt's env values, the API key only from a Secret, all replicas ready;
- weights: the verified marker in the served directory names the lock's tree digest,
  the deployed revision and repo, and (profile measured) the receipt's digest;
- benchmark: the latest measured results compared with the receipt (k3infra.bench.compare).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from k3infra.fieldtypes import DIGEST_IMAGE as DIGEST_IMAGE_TYPE
from k3infra.pod_env import PRE_ENGINE_ENV_NAMES
from k3infra.receipt import NOTHING_MEASURED, Receipt, image_repository
from k3infra.serving.manifests import RECEIPT_SHA_ANNOTATION
from k3infra.serve_argv import SERVING_CONTAINER, parse_serve, serve_argv  # noqa: F401
from k3infra import topology
from k3infra.serving.group import multi_node_args

if TYPE_CHECKING:                     # a type only: drift compares, bench computes
    from k3infra.bench.compare import Comparison

DIGEST_IMAGE = DIGEST_IMAGE_TYPE.anchored      # the config's own check (k3infra.fieldtypes)
MARKER_FORMAT_PREFIX = "k3-verified/"


@dataclass(frozen=True)
class DriftRow:
    area: str
    check: str
    expected: str
    actual: str
    ok: bool


def _row(out: list, area: str, check: str, expected, actual, ok: bool) -> None:
    out.append(DriftRow(area, check, str(expected), str(actual), bool(ok)))


def _engine_flags(receipt: Receipt) -> list[tuple[str, Optional[str]]]:
    return [(a.flag, a.value) for a in receipt.serve.engine_args]


def _fmt(flags: Sequence[tuple[str, Optional[str]]]) -> str:
    return " ".join(f if v is None else f"{f} {v}" for f, v in flags) or "(none)"


def statefulset_drift(sts: dict, receipt: Receipt,
                      expected_image: Optional[str] = None) -> list[DriftRow]:
    out: list[DriftRow] = []
    area = "statefulset"
    meta = sts.get("metadata") or {}
    ann = meta.get("annotations") or {}
    _row(out, area, "receipt annotation", receipt.id, ann.get("k3infra.dev/receipt"),
         ann.get("k3infra.dev/receipt") == receipt.id)
    sha = ann.get(RECEIPT_SHA_ANNOTATION)
    _row(out, area, "receipt content (sha256)", receipt.sha256()[:16], (sha or "none")[:16],
         sha == receipt.sha256())
    if receipt.engine.commit is not None:
        _row(out, area, "engine commit annotation", receipt.engine.commit,
             ann.get("k3infra.dev/engine-commit"),
             receipt.engine.is_commit(ann.get("k3infra.dev/engine-commit")))

    _row(out, area, "profile", "measured", ann.get("k3infra.dev/profile"),
         ann.get("k3infra.dev/profile") == "measured")

    containers = ((sts.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "containers") or []
    c = next((x for x in containers if x.get("name") == SERVING_CONTAINER), None)
    if c is None:
        _row(out, area, "serving container", SERVING_CONTAINER,
             ", ".join(x.get("name", "?") for x in containers) or "none", False)
        return out
    image = c.get("image") or ""
    _row(out, area, "image pinned by digest", "<repo>@sha256:<64 hex>", image,
         DIGEST_IMAGE.match(image))
    if expected_image:
        _row(out, area, "image", expected_image, image, image == expected_image)
    if receipt.engine.image is not None:      # a released engine: its repository, by digest
        _row(out, area, "engine image repository", receipt.engine.image_repository,
             image_repository(image), image_repository(image) == receipt.engine.image_repository)

    model, flags = parse_serve(serve_argv(c))
    engine = _engine_flags(receipt)
    _row(out, area, "engine args (receipt order, after the model dir)", _fmt(engine),
         _fmt(flags[:len(engine)]), model is not None and flags[:len(engine)] == engine)
    surface = {a.flag for a in receipt.serve.surface.args}
    engine_names = {f for f, _ in engine}
    extra = [(f, v) for f, v in flags[len(engine):]
             if f in engine_names or f not in surface]
    _row(out, area, "no other engine-path flags", "(none)", _fmt(extra), not extra)

    env = {e["name"]: e for e in c.get("env") or []}
    want_env = receipt.serve.engine_env_map()
    for name, value in want_env.items():
        got = env.get(name, {}).get("value")
        _row(out, area, f"env {name}", value, got if name in env else "(unset)", got == value)
    # The gate's and the start script's variables are read before `exec vllm serve`.

    extra_env = sorted(n for n in env if n not in want_env and n not in receipt.serve.surface.env
                       and n not in PRE_ENGINE_ENV_NAMES)
    _row(out, area, "no other engine-path env", "(none)", ", ".join(extra_env) or "(none)",
         not extra_env)
    key = env.get("VLLM_API_KEY", {})
    from_secret = "secretKeyRef" in (key.get("valueFrom") or {}) and "value" not in key
    _row(out, area, "API key", "from a Secret (secretKeyRef)",
         "secretKeyRef" if from_secret else ("literal value" if "value" in key else "(unset)"),
         from_secret)

    want = (sts.get("spec") or {}).get("replicas", 1)
    ready = (sts.get("status") or {}).get("readyReplicas") or 0
    _row(out, area, "ready replicas", want, ready, ready == want)
    return out


def _group_templates(lws: dict) -> list[tuple[str, int, dict]]:
    lwt = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
    worker = lwt.get("workerTemplate") or {}
    return [("leader", 0, lwt.get("leaderTemplate") or worker), ("worker", 1, worker)]


def group_drift(lws: dict, receipt: Receipt,
                expected_image: Optional[str] = None) -> list[DriftRow]:
    """A multi-node replica (LeaderWorkerSet): its size, then each template's vLLM
    container as statefulset_drift judges a node's, once vLLM's multi-node arguments
    (exactly k3infra.serving.group.multi_node_args) are taken off the end."""
    out: list[DriftRow] = []
    area = "group"
    name = (lws.get("metadata") or {}).get("name", "?")
    ann = (lws.get("metadata") or {}).get("annotations") or {}
    size = ((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size")
    _row(out, area, f"size [{name}]", topology.NODES_PER_REPLICA, size,
         size == topology.NODES_PER_REPLICA)
    _row(out, area, f"labelled not measured [{name}]", "k3infra.dev/measured-configuration=false",
         f"k3infra.dev/measured-configuration={ann.get('k3infra.dev/measured-configuration')}",
         ann.get("k3infra.dev/measured-configuration") == "false")
    ready = (lws.get("status") or {}).get("readyReplicas") or 0
    for role, rank, template in _group_templates(lws):
        spec = template.get("spec") or {}
        containers = spec.get("containers") or []
        tail = multi_node_args(topology.NODES_PER_REPLICA, rank)
        fixed = []
        for c in containers:
            if c.get("name") == SERVING_CONTAINER:
                args = [str(a) for a in c.get("args") or []]
                found = args[-len(tail):]
                _row(out, area, f"multi-node args [{name} {role}]", " ".join(tail),
                     " ".join(found), found == tail)
                c = {**c, "args": args[:-len(tail)] if found == tail else args}
            fixed.append(c)
        as_node = {"metadata": lws.get("metadata") or {},
                   "spec": {"replicas": (lws.get("spec") or {}).get("replicas", 1),
                            "template": {**template, "spec": {**spec, "containers": fixed}}},
                   "status": {"readyReplicas": ready}}
        for r in statefulset_drift(as_node, receipt, expected_image):
            if role == "worker" and r.check in ("ready replicas", "receipt annotation",
                                                "receipt content (sha256)",
                                                "engine commit annotation", "profile"):
                continue        # the group's, shown once with the leader
            out.append(DriftRow(area, f"{r.check} [{name} {role}]", r.expected, r.actual, r.ok))
    return out


def group_pods(lws: dict) -> list[str]:
    """Every pod of the LeaderWorkerSet's groups: `<name>-<g>` and `<name>-<g>-<w>`."""
    name = lws["metadata"]["name"]
    spec = lws.get("spec") or {}
    size = int((spec.get("leaderWorkerTemplate") or {}).get("size") or 1)
    out = []
    for g in range(int(spec.get("replicas", 1))):
        out += [f"{name}-{g}", *(f"{name}-{g}-{w}" for w in range(1, size))]
    return out


def group_model_dir(lws: dict) -> Optional[str]:
    _, _, leader = _group_templates(lws)[0]
    return model_dir({"spec": {"template": leader}})


def model_dir(sts: dict) -> Optional[str]:
    containers = sts.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
    c = next((x for x in containers if x.get("name") == SERVING_CONTAINER), None)
    return parse_serve(serve_argv(c))[0] if c else None


def weights_drift(marker: Optional[dict], lock: Optional[dict], receipt: Receipt, *,
                  revision: Optional[str], profile: str = "measured") -> list[DriftRow]:
    """The served tree's marker against the lock, the deployed revision and the receipt."""
    out: list[DriftRow] = []
    area = "weights"
    if marker is None:
        _row(out, area, "verified marker", "present in the served directory", "absent", False)
        return out
    fmt = str(marker.get("format", ""))
    _row(out, area, "verified marker", "present", fmt or "present (no format)",
         fmt.startswith(MARKER_FORMAT_PREFIX))
    digest = marker.get("tree_digest")
    if lock is not None:
        _row(out, area, "marker digest vs lock", lock.get("tree_digest"), digest,
             digest == lock.get("tree_digest"))
    else:
        _row(out, area, "marker digest vs lock", "a lock file", "no lock available", False)
    if profile == "custom":
        _row(out, area, "digest vs receipt", "(profile custom: not the measured tree)",
             digest, True)
    else:
        _row(out, area, "digest vs receipt", receipt.model.tree_digest, digest,
             digest == receipt.model.tree_digest)
    _row(out, area, "revision", revision or "(unknown)", marker.get("revision"),
         revision is not None and marker.get("revision") == revision)
    _row(out, area, "repo", receipt.model.repo, marker.get("repo"),
         marker.get("repo") == receipt.model.repo)
    return out


def benchmark_drift(cmp: Optional["Comparison"], why_missing: str = "") -> list[DriftRow]:
    out: list[DriftRow] = []
    area = "benchmark"
    if cmp is None:
        _row(out, area, "latest results", "a complete benchmark run", why_missing or "none",
             False)
        return out
    for c in cmp.mismatches:
        _row(out, area, f"{c.what} ({c.source.rsplit('/', 1)[-1]})", c.expected, c.actual, False)
    for r in cmp.rows:
        verdict = r.verdict(cmp.tolerance_pct)
        if verdict == "new evidence":
            continue
        delta = r.delta_pct()
        _row(out, area, f"c={r.concurrency} {r.stat} e2el ({r.source.rsplit('/', 1)[-1]})",
             "-" if r.receipt_ms is None else
             f"{r.receipt_ms:.0f} ms +-{cmp.tolerance_pct:g} %",
             f"{r.measured_ms:.0f} ms" + ("" if delta is None else f" ({delta:+.1f} %)"),
             verdict == "pass")
    if cmp.candidate:
        _row(out, area, "receipt figures", f"receipt {cmp.candidate} measured",
             f"a candidate: {NOTHING_MEASURED}", False)
    elif not cmp.judged and not cmp.mismatches:
        _row(out, area, "compared points", "a concurrency the receipt measured", "none", False)
    return out
