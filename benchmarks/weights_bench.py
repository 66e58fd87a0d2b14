#!/usr/bin/env python3
"""Weights verifier and prefetch, measured side by side with their baselines and the
machine's limit, all in one run (on demand; not part of `make test`).

    .venv/bin/python benchmarks/weights_bench.py [--shards 96] [--shard-mib 22] [--link-gbps 0.25]

On a generated tree of 96 shards plus 4 small files (100 files, >= 2 GiB by default) in
a temporary directory (removed at the end), it prints:
1. single-core hashlib SHA-256 speed and the machine limit (hashing threads x that);
2. our full verify (GB/s and fraction of the limit) vs `sha256sum` over the same files,
   one process and one per core (`xargs -P`);
3. the whole `k3infra weights verify` command, full and warm (stamps present, 100
   files), process start included;
4. prefetch of the tree from the loopback Hub (tests/hub_loopback.py) through the real
   huggingface_hub client, with and without overlapped verification, on unthrottled
   loopback (here bound by the client's CPU and the disk's ~0.4 GB/s fsync'd writes) and
   on a link paced at --link-gbps (below the disk: the network-bound case of a real Hub
   download, where hashing can hide behind the transfer).
The files sit in the page cache (24 GiB RAM here), so the verify figures measure hashing,
not the disk; --cold drops the page cache before each timed verify (root only).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))     # the loopback Hub lives with the tests

from hub_loopback import LoopbackHub, environment  # noqa: E402

from k3infra.weights import tree, verify  # noqa: E402

MIB = 1 << 20
PY = sys.executable
K3INFRA = [PY, "-c", "import sys; from k3infra.cli import main; sys.exit(main(sys.argv[1:]))"]


def single_core_sha256(seconds: float = 2.0) -> float:
    buf = os.urandom(64 * MIB)
    h = hashlib.sha256()
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        h.update(buf)
        n += len(buf)
    return n / (time.perf_counter() - start) / 1e9


def generate(root: Path, shards: int, shard_bytes: int) -> list[Path]:
    root.mkdir(parents=True)
    seed = os.urandom(MIB)
    paths = []
    for i in range(1, shards + 1):
        path = root / f"model-{i:05d}-of-{shards:05d}.safetensors"
        with open(path, "wb") as fh:
            left = shard_bytes
            block = hashlib.sha256(seed + i.to_bytes(4, "big")).digest() * (MIB // 32)
            while left > 0:
                # Distinct content per shard and per MiB, cheap to generate.
                block = bytes(b ^ (left & 0xFF) for b in block[:64]) + block[64:]
                fh.write(block[:min(left, MIB)])
                left -= MIB
        paths.append(path)
    for name, text in (("config.json", '{"architectures": ["KimiK3ForCausalLM"]}\n'),
                       ("model.safetensors.index.json", '{"weight_map": {}}\n'),
                       ("tokenizer_config.json", "{}\n"), ("README.md", "# bench\n")):
        (root / name).write_text(text)
        paths.append(root / name)
    return paths


def drop_caches(cold: bool) -> None:
    if cold:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def warm_cache(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as fh:
            while fh.read(16 * MIB):
                pass


def timed(cmd: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    elapsed = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return elapsed, res


def row(label: str, value: str, note: str = "") -> None:
    print(f"  {label:<58} {value:>16}  {note}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=96)
    ap.add_argument("--shard-mib", type=int, default=22)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per verify measurement")
    ap.add_argument("--link-gbps", type=float, default=0.25,
                    help="paced link for the second prefetch comparison (GB/s; 0 skips it)")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each timed verify")
    ap.add_argument("--dir", help="parent of the temporary tree (default: the system temp dir)")
    ap.add_argument("--skip-prefetch", action="store_true")
    args = ap.parse_args()

    cores = os.cpu_count() or 1
    workers = tree.default_workers()
    print(f"weights benchmark: {cores} CPUs, {workers} hashing threads, python {sys.version.split()[0]}, "
          f"{subprocess.run(['sha256sum', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          "(other work on this machine slows every figure; each is the best of interleaved rounds)")

    tmp = Path(tempfile.mkdtemp(prefix="k3-weights-bench-", dir=args.dir))
    try:
        src = tmp / "tree"
        t0 = time.perf_counter()
        paths = generate(src, args.shards, args.shard_mib * MIB)
        total = sum(p.stat().st_size for p in paths)
        print(f"\n    generated {len(paths)} files, {total / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s "
              f"under {tmp}")
        lock = verify.lock_from_dir(str(src), "bench/k3", "b" * 40, workers=workers)
        lock_file = tmp / "lock.json"
        lock_file.write_text(tree.lock_to_json(lock))
        warm_cache(paths)

        # Rounds interleave every measurement so a busy moment hits all of them alike;
        # each figure is the best of its rounds.
        rel = [str(p.relative_to(src)) for p in paths]
        per_proc = max(1, len(rel) // cores // 4)
        singles, ours, base, basep = [], [], [], []
        for _ in range(args.repeat):
            singles.append(single_core_sha256(1.0))
            drop_caches(args.cold)
            report = verify.verify_tree(str(src), lock, full=True, workers=workers, write_state=False,
                                        emit=None)
            assert report.ok, report.problems
            ours.append(report.seconds)
            drop_caches(args.cold)
            base.append(timed(["sha256sum", *rel], cwd=src)[0])
            drop_caches(args.cold)
            basep.append(timed(["sh", "-c", f"ls | xargs -P {cores} -n {per_proc} sha256sum > /dev/null"],
                               cwd=src)[0])
        single = max(singles)
        limit = single * workers
        print("\n[1] SHA-256 speed and the machine limit")
        row(f"single-core hashlib SHA-256 (best of {args.repeat})", f"{single:.2f} GB/s",
            "rounds: " + ", ".join(f"{x:.2f}" for x in singles))
        row(f"machine limit ({workers} threads x single-core)", f"{limit:.2f} GB/s")

        print("\n[2] full verify vs sha256sum, same files" + (" (cold cache)" if args.cold else
                                                              " (page cache warm)"))
        best = min(ours)
        ours_gbps = total / best / 1e9
        sha_gbps = total / min(base) / 1e9
        shap_gbps = total / min(basep) / 1e9
        row(f"our full verify, {workers} threads (in-process, best of {args.repeat})",
            f"{ours_gbps:.2f} GB/s", f"{best:.2f} s; {ours_gbps / limit:.0%} of the machine limit")
        row(f"sha256sum, one process (best of {args.repeat})", f"{sha_gbps:.2f} GB/s", f"{min(base):.2f} s")
        row(f"sha256sum, {cores} processes via xargs -P (best of {args.repeat})", f"{shap_gbps:.2f} GB/s",
            f"{min(basep):.2f} s")
        row("ratio: ours / sha256sum", f"{ours_gbps / sha_gbps:.2f}x", "target >= 1.6x")
        row(f"ratio: ours / sha256sum x{cores}", f"{ours_gbps / shap_gbps:.2f}x")

        print("\n[3] the whole `k3infra weights verify` command, process start included")
        fulls = []
        for _ in range(args.repeat):
            drop_caches(args.cold)
            fulls.append(timed([*K3INFRA, "weights", "verify", str(src), "--lock", str(lock_file), "--full"])[0])
        full_s = min(fulls)
        row(f"full --full ({len(paths)} files, {total / 1e9:.2f} GB, best of {args.repeat})", f"{full_s:.2f} s",
            f"{total / full_s / 1e9:.2f} GB/s incl. start")
        warm = [timed([*K3INFRA, "weights", "verify", str(src), "--lock", str(lock_file)])[0]
                for _ in range(10)]
        row(f"warm re-verify, stamps present ({len(paths)} files), median of 10",
            f"{statistics.median(warm) * 1000:.0f} ms", f"max {max(warm) * 1000:.0f} ms")
        start_only = [timed([PY, "-c", "pass"])[0] for _ in range(10)]
        row("  baseline: bare `python -c pass`, median of 10",
            f"{statistics.median(start_only) * 1000:.0f} ms")

        if not args.skip_prefetch:
            prefetch_section(src, paths, lock, lock_file, tmp, total, workers, args.link_gbps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def prefetch_section(src, paths, lock, lock_file, tmp, total, workers, link_gbps) -> None:
    # The Hub is a subprocess's peer here: the server runs in this process, the prefetch
    # in its own (`python -m k3infra.weights prefetch`), as in the Job.
    files = {str(p.relative_to(src)): p.read_bytes() for p in paths}
    links = [("loopback, unthrottled", None)]
    if link_gbps:
        links.append((f"link paced at {link_gbps:g} GB/s", link_gbps * 1e9))
    print("\n[4] prefetch from the loopback Hub (real huggingface_hub client, 8 download workers)")
    for label, rate in links:
        with LoopbackHub(lock.repo, files, commit=lock.revision, link_bytes_per_s=rate) as hub:
            env = environment(hub, str(tmp / "hf-home"))
            results = {}
            for mode in ("overlap", "no-overlap", "overlap", "no-overlap"):
                dest = tmp / "dest"
                shutil.rmtree(dest, ignore_errors=True)
                cmd = [PY, "-m", "k3infra.weights", "prefetch", "--lock", str(lock_file), "--dest", str(dest),
                       "--workers", str(workers)] + (["--no-overlap"] if mode == "no-overlap" else [])
                elapsed, _res = timed(cmd, env=env, cwd=ROOT)
                results.setdefault(mode, []).append(elapsed)
            shutil.rmtree(tmp / "dest", ignore_errors=True)
        o, n = min(results["overlap"]), min(results["no-overlap"])
        row(f"{label}: overlapped verify (best of 2)", f"{o:.2f} s", f"{total / o / 1e9:.2f} GB/s")
        row(f"{label}: verify after download (best of 2)", f"{n:.2f} s", f"{total / n / 1e9:.2f} GB/s")
        row(f"{label}: overlap saves", f"{n - o:.2f} s", f"{(n - o) / n:.0%} of the sequential time")
        if rate:
            row(f"{label}: link-time floor (bytes / link rate)", f"{total / rate:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
