"""Two receipts side by side: every difference `k3infra receipt diff` prints (pure).

Grouped as a platform engineer reads a move from one receipt to the next: the engine
(where it comes from), its args and env (added, removed, changed, by flag or name), the
weights, residency and KV bound, the workload, the measured figures, what was not
measured. Each difference is one `Change` row; JSON for CI is the same rows.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

from k3infra.receipt import NOTHING_MEASURED, Receipt


@dataclass(frozen=True)
class Change:
    area: str               # engine, engine args, engine env, surface, weights, ...
    item: str               # the field, flag or variable
    kind: str               # added, removed, changed
    a: Optional[str]
    b: Optional[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def _fields(area: str, a: dict[str, Any], b: dict[str, Any]) -> list[Change]:
    """Field by field, in a's order then b's new ones."""
    out = []
    for key in [*a, *(k for k in b if k not in a)]:
        va, vb = _text(a.get(key)), _text(b.get(key))
        if va != vb:
            kind = "added" if va is None else "removed" if vb is None else "changed"
            out.append(Change(area, key, kind, va, vb))
    return out


def _args(r: Receipt) -> dict[str, Any]:
    # A flag with no value is present as itself (`--enable-prefix-caching`).
    return {a.flag: (a.value if a.value is not None else "(set)") for a in r.serve.engine_args}


def _engine(r: Receipt) -> dict[str, Any]:
    e = r.engine
    return {"source": "image" if e.image else "build", "name": e.name, "version": e.version,
            "repo": e.repo, "commit": e.commit, "image": e.image,
            "pull request": e.pull_request or None, "build exclusions": e.build_exclusions or None,
            "cuda arch": e.cuda_arch}


def _weights(r: Receipt) -> dict[str, Any]:
    m = r.model
    return {"repo": m.repo, "revision": m.revision or "(deployer pins)", "tree digest": m.tree_digest,
            "shards": m.shards, "size GB": m.size_gb, "quantization": m.quantization}


def _measured(r: Receipt) -> dict[str, Any]:
    if r.is_candidate:
        return {"figures": NOTHING_MEASURED}
    return {f"c={m.concurrency} {m.metric}": f"p50 {m.p50_ms:g} ms / p99 {m.p99_ms:g} ms"
            for m in r.measured}


def _workload(r: Receipt) -> dict[str, Any]:
    w = r.workload_a
    return {"prompt tokens": f"{w.prompt_tokens_min}-{w.prompt_tokens_max}",
            "output tokens max": w.output_tokens_max, "concurrencies": w.concurrencies,
            "warm-up + measured": f"{w.warmup_requests} + {w.measured_requests}"}


def _kv(r: Receipt) -> dict[str, Any]:
    k = r.kv_cache
    return {} if k is None else {"dtype": k.dtype, "bytes per token (max)": k.bytes_per_token_max}


def diff_receipts(a: Receipt, b: Receipt) -> list[Change]:
    """Every difference from `a` to `b`, in the order the table prints them."""
    out = [*_fields("receipt", {"id": a.id, "status": a.status, "measured on": a.measured_on,
                                "source": a.source},
                    {"id": b.id, "status": b.status, "measured on": b.measured_on,
                     "source": b.source}),
           *_fields("engine", _engine(a), _engine(b)),
           *_fields("engine args", _args(a), _args(b)),
           *_fields("engine env", a.serve.engine_env_map(), b.serve.engine_env_map()),
           *_fields("surface args", {s.flag: "takes a value" if s.takes_value else "a switch"
                                     for s in a.serve.surface.args},
                    {s.flag: "takes a value" if s.takes_value else "a switch"
                     for s in b.serve.surface.args}),
           *_fields("surface env", {n: "allowed" for n in a.serve.surface.env},
                    {n: "allowed" for n in b.serve.surface.env}),
           *_fields("weights", _weights(a), _weights(b)),
           *_fields("residency", {"weights GiB per GPU": a.residency.weights_gib_per_gpu},
                    {"weights GiB per GPU": b.residency.weights_gib_per_gpu}),
           *_fields("kv cache", _kv(a), _kv(b)),
           *_fields("hardware", {"gpu": a.hardware.gpu_product_label, "node": a.hardware.node},
                    {"gpu": b.hardware.gpu_product_label, "node": b.hardware.node}),
           *_fields("workload A", _workload(a), _workload(b)),
           *_fields("measured", _measured(a), _measured(b))]
    gone = [x for x in a.not_measured if x not in b.not_measured]
    new = [x for x in b.not_measured if x not in a.not_measured]
    out += [Change("not measured", x, "removed", x, None) for x in gone]
    out += [Change("not measured", x, "added", None, x) for x in new]
    return out
