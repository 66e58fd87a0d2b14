"""HBM fit: does one replica's weight residency fit the GPUs it is placed on?

Pure: receipt residency (GiB per GPU at TP8+EP) against a table of known GPUs (receipt
`gpus:`), or a per-GPU memory the stack gives for an unknown product.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from k3infra.receipt import Receipt


# Below this much per-GPU memory after the weights there is no room for the KV cache of
# one 40960-token sequence, activations and CUDA graphs. A floor chosen by k3infra, not a
# receipt figure; the receipt's B200 failure had 0.35 GiB.
MIN_HEADROOM_GIB = 4.0


class HbmError(ValueError):
    """The model does not fit (or cannot be placed on) the configured GPUs."""

    key = "k3:gpuProduct"


@dataclass(frozen=True)
class HbmFit:
    gpu_product: str
    gpu_memory_gib: float
    weights_gib_per_gpu: float
    headroom_gib: float          # per GPU, left for KV cache, activations, graphs

    def summary(self) -> str:
        return (f"{self.gpu_product}: {self.weights_gib_per_gpu:.2f} GiB weights per GPU of "
                f"{self.gpu_memory_gib:.2f} GiB -> {self.headroom_gib:.2f} GiB headroom per GPU")


def hbm_fit(receipt: Receipt, gpu_product: str,
            gpu_memory_gib: Optional[float] = None) -> HbmFit:
    weights = receipt.residency.weights_gib_per_gpu
    tp = receipt.measured_gpu.gpus_per_node
    spec = receipt.gpus.get(gpu_product)
    if spec is not None and spec.gpus_per_node < tp:
        raise HbmError(
            f"k3:gpuProduct = {gpu_product!r}: nodes of {spec.gpus_per_node} GPUs cannot hold "
            f"one TP{tp}+EP replica; it would have to span "
            f"{-(-tp // spec.gpus_per_node)} nodes over NVLink (not measured). Accepted: a "
            f"product with {tp} GPUs per node, such as {receipt.hardware.gpu_product_label}, "
            "or k3:topology = multi-node for one replica across two 4-GPU trays of one NVLink "
            "domain (docs/multinode.md)")
    memory = gpu_memory_gib if gpu_memory_gib is not None else (spec.memory_gib if spec else None)
    if memory is None:
        raise HbmError(
            f"k3:gpuProduct = {gpu_product!r}: unknown GPU; set k3:gpuMemoryGib to its per-GPU "
            f"memory as CUDA reports it. Known: {', '.join(sorted(receipt.gpus))}")
    free = spec.free_gib if (spec is not None and gpu_memory_gib is None) else None
    usable = free if free is not None else memory
    headroom = usable - weights
    if headroom < MIN_HEADROOM_GIB:
        shown = (f"{weights:.2f} GiB of weights per GPU vs {free:.2f} GiB free of {memory:.2f} GiB"
                 if free is not None else f"{weights:.2f} GiB of weights per GPU vs {memory:.2f} GiB")
        raise HbmError(
            f"k3:gpuProduct = {gpu_product!r}: the model does not fit: {shown} at TP{tp}+EP, "
            f"before any KV cache (k3infra needs at least {MIN_HEADROOM_GIB:g} GiB headroom per "
            f"GPU). Accepted: GPUs with more memory per GPU, such as "
            f"{receipt.hardware.gpu_product_label} ({receipt.measured_gpu.memory_gib} GiB)")
    return HbmFit(gpu_product, memory, weights, round(headroom, 2))


# vLLM's --gpu-memory-utilization when a receipt does not set it (vLLM's own default).
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
GIB = 1 << 30


@dataclass(frozen=True)
class ContextFit:
    max_model_len: int
    kv_gib_per_sequence: float   # one full-length sequence at the receipt's bound
    kv_room_gib: float           # per GPU: memory x utilization - weights - headroom
    dtype: str

    def summary(self) -> str:
        return (f"one {self.max_model_len}-token sequence needs at most "
                f"{self.kv_gib_per_sequence:.2f} GiB of {self.dtype} KV cache per GPU, of "
                f"{self.kv_room_gib:.2f} GiB left")


def _last(tokens: list[str], flag: str) -> Optional[str]:
    """The value of the last `flag VALUE` or `flag=VALUE` in `tokens` (vLLM takes the last)."""
    found = None
    for i, t in enumerate(tokens):
        if t == flag and i + 1 < len(tokens):
            found = tokens[i + 1]
        elif t.startswith(flag + "="):
            found = t.split("=", 1)[1]
    return found


def context_fit(receipt: Receipt, fit: HbmFit, extra_args: Sequence[str] = ()) -> Optional[ContextFit]:
    """Does one sequence of `--max-model-len` fit the KV room a GPU has left, at the
    receipt's upper bound of KV bytes per token (receipt.kv_cache)? None when the receipt
    states no bound or no window; HbmError naming --max-model-len when it does not fit."""
    kv = receipt.kv_cache
    tokens = [*receipt.serve.engine_arg_tokens(), *extra_args]
    length = _last(tokens, "--max-model-len")
    if kv is None or length is None or not length.isdigit():
        return None
    util = float(_last(tokens, "--gpu-memory-utilization") or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
    room = fit.gpu_memory_gib * util - fit.weights_gib_per_gpu - MIN_HEADROOM_GIB
    need = int(length) * kv.bytes_per_token_max / GIB
    if need > room:
        raise HbmError(
            f"--max-model-len {length}: one full-length sequence needs up to {need:.2f} GiB of "
            f"{kv.dtype} KV cache per GPU (receipt {receipt.id}: {kv.bytes_per_token_max} B per "
            f"token at most), but {fit.gpu_product} leaves {room:.2f} GiB ({fit.gpu_memory_gib:.2f} "
            f"GiB x {util:g} - {fit.weights_gib_per_gpu:.2f} GiB weights - {MIN_HEADROOM_GIB:g} GiB "
            f"headroom). Accepted: --max-model-len {int(room * GIB // kv.bytes_per_token_max)} or less")
    return ContextFit(int(length), round(need, 2), round(room, 2), kv.dtype)
