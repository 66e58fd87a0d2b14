"""`k3infra bench receipt`: a new receipt, same schema as the shipped one (validated by
k3infra.receipt's model), for the user's own deployment and measurements.

What comes from where:
- engine version/commit/PR, hardware: the options given, else the base receipt;
- serve flags and env: the deployed StatefulSet when given (engine path = every flag
  and env var outside the base receipt's surface allow-list), else the base receipt;
- weights: the lock file's tree digest and revision when given, else the base receipt;
- measured: per concurrency, p50/p99 of e2el, ttft, tpot and itl pooled over the
  measured requests of every run (per-request arrays, numpy's linear percentile as
  vLLM uses), never the warm-ups;
- runs_agreement_pct: the largest spread of output throughput between runs of the same
  concurrency, in % of their mean (the receipt's "two runs agreed within 0.4 %");
- not measured: the base list, minus concurrency items these results now cover, plus
  what these results leave out. Residency is carried over and said to be so.
The raw files are referenced by sha256 in the receipt's `evidence` list, and in a
sidecar `<receipt>.sha256` (sha256sum -c format) for checking them with one command.
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml
from pydantic import Field, ValidationError

from k3infra.bench.compare import workload_checks
from k3infra.fileformats import FileFormatError, FileModel, Text, validate
from k3infra.serve_argv import SERVING_CONTAINER, parse_serve, serve_argv
from k3infra.bench.results import BenchResult, percentile
from k3infra.pod_env import PRE_ENGINE_ENV_NAMES
from k3infra.receipt import Receipt, parse_receipt, problems
from k3infra.podcommon import atomic_write_text, output_target


class ReceiptWriteError(ValueError):
    pass


# ---- the deployed StatefulSet (`kubectl get sts -o json`): the fields read here -------

class _EnvVar(FileModel):
    name: Text(256)
    value: Optional[Text(1 << 16)] = None     # valueFrom entries have none


class _Container(FileModel):
    name: Text(253)
    image: Optional[Text(1024)] = None
    command: list[Text(1 << 16)] = Field(default_factory=list, max_length=4096)
    args: list[Text(1 << 16)] = Field(default_factory=list, max_length=4096)
    env: list[_EnvVar] = Field(default_factory=list, max_length=4096)


class _PodSpec(FileModel):
    containers: list[_Container] = Field(max_length=256)


class _Template(FileModel):
    spec: _PodSpec


class _StsSpec(FileModel):
    template: _Template


class StatefulSetFile(FileModel):
    """`kubectl get statefulset -o json`: the serving container's command, args and env."""

    spec: _StsSpec


@dataclass(frozen=True)
class ReceiptInputs:
    id: str
    measured_on: Optional[str] = None
    engine_version: Optional[str] = None
    engine_commit: Optional[str] = None
    engine_pull_request: Optional[int] = None
    gpu_product: Optional[str] = None
    gpu_memory_bytes: Optional[int] = None
    node: Optional[str] = None
    single_run: bool = False
    serve_flags: Optional[tuple[tuple[str, Optional[str]], ...]] = None
    serve_env: Optional[tuple[tuple[str, str], ...]] = None
    tree_digest: Optional[str] = None
    revision: Optional[str] = None
    engine_image: Optional[str] = None     # the image the serving container ran

    def with_statefulset(self, sts: Any) -> "ReceiptInputs":
        """The serving container's flags and env of a StatefulSet (StatefulSetFile, or
        its JSON as a dict, which is typed here first)."""
        if not isinstance(sts, StatefulSetFile):
            try:
                sts = validate(sts, StatefulSetFile, "the StatefulSet")
            except FileFormatError as exc:
                raise ReceiptWriteError(str(exc)) from None
        c = next((x for x in sts.spec.template.spec.containers if x.name == SERVING_CONTAINER),
                 None)
        if c is None:
            raise ReceiptWriteError(f"the StatefulSet has no {SERVING_CONTAINER!r} container")
        try:
            model, flags = parse_serve(serve_argv({"command": list(c.command), "args": list(c.args)}))
        except ValueError as exc:      # a shell line shlex cannot split
            raise ReceiptWriteError(f"the serving container's command is not a `vllm serve` "
                                    f"line ({exc})") from None
        if model is None:
            raise ReceiptWriteError("the serving container does not run `vllm serve <model>`")

        # The gate's and the start script's variables are read before `exec vllm serve`.
        env = tuple((e.name, e.value) for e in c.env
                    if e.value is not None and e.name not in PRE_ENGINE_ENV_NAMES)
        return replace(self, serve_flags=tuple(flags), serve_env=env, engine_image=c.image)

    def with_lock(self, lock) -> "ReceiptInputs":
        """The tree digest and revision of a parsed lock (k3infra.weights.tree.Lock)."""
        return replace(self, tree_digest=lock.tree_digest, revision=lock.revision)


def _date(results: Sequence[BenchResult]) -> Optional[str]:
    dates = sorted(r.date for r in results if r.date and re.match(r"^\d{8}-", r.date))
    return f"{dates[0][:4]}-{dates[0][4:6]}-{dates[0][6:8]}" if dates else None


def _pooled(results: Sequence[BenchResult]) -> dict[str, list[float]]:
    """Per-metric samples in ms over the successful requests of the given files."""
    out: dict[str, list[float]] = {"e2el": [], "ttft": [], "tpot": [], "itl": []}
    for r in results:
        lat = r.successful_latencies_ms or []
        out["e2el"] += lat
        if r.ttfts_s is None or r.output_lens is None:
            continue
        ok = [i for i in range(r.num_prompts) if not (r.errors and r.errors[i])]
        for i in ok:
            ttft = r.ttfts_s[i] * 1000.0
            out["ttft"].append(ttft)
            if r.output_lens[i] > 1:
                out["tpot"].append((r.latencies_s[i] * 1000.0 - ttft) / (r.output_lens[i] - 1))
            if r.itls_s is not None:
                out["itl"] += [x * 1000.0 for x in r.itls_s[i]]
    return out


def _agreement_pct(groups: dict[int, list[BenchResult]]) -> Optional[float]:
    spreads = []
    for rs in groups.values():
        tput = [r.output_throughput for r in rs if r.output_throughput]
        if len(tput) >= 2:
            spreads.append((max(tput) - min(tput)) / (sum(tput) / len(tput)) * 100.0)
    return round(max(spreads), 2) if spreads else None


def _not_measured(base: Receipt, measured_c: set[int], single_run: bool,
                  gpu_changed: bool) -> list[str]:
    out = []
    for item in base.not_measured:
        head = item.split(":", 1)[0]
        if head.startswith("concurrency"):
            listed = {int(x) for x in re.findall(r"\d+", head)}
            if listed and listed <= measured_c:
                continue
        out.append(item)
    for c in base.workload_a.concurrencies:
        if c not in measured_c:
            out.append(f"concurrency {c}: in the base receipt's grid, not in these results")
    out.append(f"weight residency per GPU: carried over from receipt {base.id}, not re-measured")
    if single_run:
        out.append("run-to-run agreement: one run per concurrency only")
    if gpu_changed:
        out.append(f"the base receipt's hardware ({base.hardware.gpu_product_label}): "
                   "these results come from other GPUs")
    return out


def build_receipt(base: Receipt, results: Sequence[BenchResult], inputs: ReceiptInputs) -> Receipt:
    """The new receipt (validated); refuses results that are not Workload A."""
    measured = [r for r in results if r.role in (None, "measured")]
    if not measured:
        raise ReceiptWriteError("no measured result among the files (warm-ups are not published)")
    bad = [c for r in measured for c in workload_checks(r, base)
           if not c.ok and c.what != "concurrency" and c.what != "measured requests"]
    if bad:
        raise ReceiptWriteError("not Workload A: " + "; ".join(
            f"{Path(c.source).name}: {c.what}: expected {c.expected}, got {c.actual}"
            for c in bad))
    groups: dict[int, list[BenchResult]] = {}
    for r in measured:
        if r.max_concurrency is None:
            raise ReceiptWriteError(f"{r.source}: no max_concurrency; the receipt's grid "
                                    "is by concurrency")
        groups.setdefault(r.max_concurrency, []).append(r)
    agreement = _agreement_pct(groups)
    if agreement is None and not inputs.single_run:
        raise ReceiptWriteError("one run per concurrency: the receipt states run-to-run "
                                "agreement; pass results of two runs or --single-run")
    counts = {len(r.successful_latencies_ms or []) for r in measured}
    if len(counts) != 1:
        raise ReceiptWriteError(f"measured request counts differ between files: {sorted(counts)}")

    data = base.model_dump(by_alias=True, mode="json")
    data = copy.deepcopy(data)
    data["id"] = inputs.id
    data["status"] = "measured"
    if base.is_candidate:
        data["source"] = f"measured from candidate {base.id} ({base.source})"
    data["measured_on"] = inputs.measured_on or _date(measured) or base.measured_on
    eng = data["engine"]
    eng["version"] = inputs.engine_version or eng["version"]
    if base.engine.image is not None:
        # A released engine: the measured receipt pins the image it measured, by digest.
        if inputs.engine_image and "@" in inputs.engine_image:
            eng["image"] = inputs.engine_image
        if inputs.engine_commit:
            raise ReceiptWriteError(f"--engine-commit: receipt {base.id}'s engine is the "
                                    f"released image {base.engine.image}, not a build")
    else:
        eng["commit"] = inputs.engine_commit or eng["commit"]
    if inputs.engine_pull_request is not None:
        eng["pull_request"] = inputs.engine_pull_request
    hw = data["hardware"]
    if inputs.gpu_product:
        hw["gpu_product_label"] = inputs.gpu_product
        if inputs.gpu_product not in data["gpus"]:
            if not inputs.gpu_memory_bytes:
                raise ReceiptWriteError(f"GPU {inputs.gpu_product} is not in the base "
                                        "receipt: give --gpu-memory-bytes")
            data["gpus"][inputs.gpu_product] = {
                "memory_gib": round(inputs.gpu_memory_bytes / 2**30, 2), "free_gib": None,
                "gpus_per_node": base.measured_gpu.gpus_per_node}
    if inputs.gpu_memory_bytes:
        hw["gpu_memory_bytes"] = inputs.gpu_memory_bytes
    if inputs.node:
        hw["node"] = inputs.node
    if inputs.tree_digest:
        data["model"]["tree_digest"] = inputs.tree_digest
    if inputs.revision:
        data["model"]["revision"] = inputs.revision

    surface_flags = {a.flag for a in base.serve.surface.args}
    if inputs.serve_flags is not None:
        why = {(a.flag, a.value): a.why for a in base.serve.engine_args}
        data["serve"]["engine_args"] = [
            {"flag": f, "value": v, "why": why.get((f, v), "as deployed (not in the base receipt)")}
            for f, v in inputs.serve_flags if f not in surface_flags]
    if inputs.serve_env is not None:
        why_env = {(e.name, e.value): e.why for e in base.serve.engine_env}
        data["serve"]["engine_env"] = [
            {"name": n, "value": v, "why": why_env.get((n, v), "as deployed (not in the base receipt)")}
            for n, v in inputs.serve_env if n not in base.serve.surface.env]

    wa = data["workload_a"]
    wa["concurrencies"] = sorted(groups)
    wa["measured_requests"] = counts.pop()
    wa["runs_agreement_pct"] = agreement if agreement is not None else math.nan
    data["measured"] = []
    for c in sorted(groups):
        pooled = _pooled(groups[c])
        for metric in ("e2el", "ttft", "tpot", "itl"):
            values = pooled[metric]
            if values:
                data["measured"].append({"concurrency": c, "metric": metric,
                                         "p50_ms": round(percentile(values, 50), 2),
                                         "p99_ms": round(percentile(values, 99), 2)})
    data["evidence"] = [{"file": Path(r.source).name, "sha256": r.sha256,
                         "concurrency": r.max_concurrency, "role": r.role or "measured"}
                        for r in results]
    data["not_measured"] = _not_measured(
        base, set(groups), agreement is None,
        hw["gpu_product_label"] != base.hardware.gpu_product_label)
    try:
        return parse_receipt(data)
    except ValidationError as exc:
        raise ReceiptWriteError(f"the new receipt does not validate: {problems(exc)}") from None


def receipt_yaml(receipt: Receipt, base: Receipt, results: Sequence[BenchResult]) -> str:
    header = [f"# Receipt {receipt.id}: written by `k3infra bench receipt` from "
              f"{len(results)} vllm bench serve result file(s),",
              f"# starting from receipt {base.id}. Raw files: `evidence` (and the .sha256 "
              "sidecar)."]
    body = yaml.safe_dump(receipt.model_dump(by_alias=True, mode="json"), sort_keys=False,
                          allow_unicode=True, width=100)
    return "\n".join(header) + "\n" + body


def write_receipt(base: Receipt, results: Sequence[BenchResult], inputs: ReceiptInputs,
                  out: Path) -> list[Path]:
    receipt = build_receipt(base, results, inputs)
    text = receipt_yaml(receipt, base, results)
    # What is written must read back to the same receipt (JSON form: NaN-safe).
    if parse_receipt(yaml.safe_load(text)).model_dump_json() != receipt.model_dump_json():
        raise ReceiptWriteError("the written receipt does not read back identically")

    sums = out.with_name(out.name + ".sha256")
    output_target(sums)                 # both outputs refused before either is written
    atomic_write_text(out, text)        # the one output writer
    atomic_write_text(sums, "".join(f"{r.sha256}  {Path(r.source).name}\n" for r in results))
    return [out, sums]
