"""HBM fit: does one replica's weight residency fit the GPUs it is placed on?

Pure: receipt residency (GiB per GPU at TP8+EP) against a table of known GPUs (receipt
`gpus:`), or a per-GPU memory the stack gives for an unknown product.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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
