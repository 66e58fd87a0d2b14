"""Preflight for one Docker host: what k3infra checks before creating anything, and
what must hold on the box with the command that shows it (run them there; k3infra
reaches the box only through the Docker API, which answers none of these).

Checked here (raise `PreflightError`, naming the key, the value and what is accepted):
- HBM fit for the configured GPU product (k3infra.preflight);
- free space on k3:host.weightsRoot vs the lock total (or the receipt's size).
The prefetch container checks free space again on the box itself, before any download
(k3weights prefetch: the bytes still to fetch vs the filesystem's free bytes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from k3infra.config import StackConfig
from k3infra.plan import Fit
from k3infra.preflight import Check, PreflightError, check_hbm
from k3infra.receipt import Receipt

# Open files: vLLM workers, NCCL and 96 shard files at once; memlock: pinned host buffers.
MIN_NOFILE = 1048576


@dataclass(frozen=True)
class BoxCheck:
    what: str
    command: str

    def line(self) -> str:
        return f"on the host: {self.what}\n    $ {self.command}"


def check_weights_space(cfg: StackConfig, receipt: Receipt,
                        lock_total_bytes: Optional[int] = None) -> Check:
    h = cfg.host
    if lock_total_bytes is not None:
        need, source = lock_total_bytes, "lock total"
    else:
        need, source = int(receipt.model.size_gb * 1e9), "receipt size (no lock file)"
    if h.free_gb is None:
        return Check("weights space", f"{h.weights_root}: free space not stated "
                                      f"(k3:host.freeGB); needs {need / 1e9:.1f} GB ({source}); "
                                      "the prefetch checks it on the box")
    if h.free_gb * 1e9 < need:
        raise PreflightError(
            "k3:host.freeGB", h.free_gb,
            f"{h.free_gb:.1f} GB free on {h.weights_root} cannot hold the weights: "
            f"{need} bytes ({need / 1e9:.1f} GB, {source}); accepted: a weightsRoot on a "
            f"filesystem with at least {need / 1e9:.1f} GB free")
    return Check("weights space", f"{h.free_gb:.1f} GB free on {h.weights_root} >= "
                                  f"{need / 1e9:.1f} GB ({source})")


def run_host_preflight(cfg: StackConfig, receipt: Receipt, lock_total_bytes: Optional[int] = None,
                       fit: Optional[Fit] = None) -> list[Check]:
    """`fit`: the plan's (k3infra.plan), else resolved by check_hbm."""
    return [check_hbm(cfg, receipt, fit), check_weights_space(cfg, receipt, lock_total_bytes)]


def box_checks(cfg: StackConfig, receipt: Receipt) -> list[BoxCheck]:
    """What must hold on the host, each with the command that shows it."""
    gpu = receipt.gpus.get(cfg.gpu_product)
    count = gpu.gpus_per_node if gpu else receipt.measured_gpu.gpus_per_node
    product = cfg.gpu_product.replace("-", " ")
    memory = (f", each about {receipt.hardware.gpu_memory_bytes // 2**20} MiB (the receipt's "
              "CUDA figure)" if cfg.gpu_product == receipt.hardware.gpu_product_label else "")
    h = cfg.host
    # The engine image itself (it has the CUDA user space): nothing else to pull.
    image = cfg.engine_image or "<k3:engineImage>"
    return [
        BoxCheck(f"{count} GPUs named like '{product}'{memory}",
                 "nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader"),
        BoxCheck(f"driver branch >= {receipt.hardware.driver_branch_min}",
                 "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u"),
        BoxCheck("the NVIDIA Container Toolkit runtime is registered with Docker and sees "
                 f"all {count} GPUs",
                 "docker info --format '{{json .Runtimes}}' | grep -o nvidia && "
                 f"docker run --rm --gpus all {image} nvidia-smi -L"),
        BoxCheck(f"free space on {h.weights_root} (local NVMe) for the tree",
                 f"df -B1000000000 --output=target,avail {h.weights_root}"),
        BoxCheck(f"{h.weights_root} is owned by uid 1000 (the engine image's user)",
                 f"stat -c '%u:%g %a' {h.weights_root}"),
        BoxCheck(f"open files >= {MIN_NOFILE} and memlock unlimited in containers "
                 "(the containers set both as ulimits; the daemon must allow them)",
                 "docker run --rm --ulimit nofile=1048576:1048576 --ulimit memlock=-1:-1 "
                 f"{image} sh -c 'ulimit -n; ulimit -l'"),
    ]


def host_preflight_report(cfg: StackConfig, receipt: Receipt,
                          lock_total_bytes: Optional[int] = None,
                          fit: Optional[Fit] = None) -> list[str]:
    return ([c.line() for c in run_host_preflight(cfg, receipt, lock_total_bytes, fit)]
            + [b.line() for b in box_checks(cfg, receipt)])
