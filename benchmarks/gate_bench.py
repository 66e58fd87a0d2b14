#!/usr/bin/env python3
"""The serving gate's full read-and-hash (k3weights gate, warm mode) against the machine's
two limits, measured in the same run: the disk's sequential read and cores x single-core
SHA-256. Cold page cache vs warm. On demand; not part of `make test`.

    .venv/bin/python benchmarks/gate_bench.py [--files 24] [--file-mib 256] [--rounds 5]
                                              [--dir DIR] [--drop-caches]

Each round, in this order:
1. evict the tree from the page cache, then `dd bs=8M` reads every file to /dev/null:
   one stream, and one stream per hashing thread (`xargs -P`): the disk's read limit
   is the faster of the two;
2. evict again, then the gate (`k3infra.weights.gate.run_gate`, warm mode, the pinned
   lock) reads and hashes the tree: the cold figure;
3. the gate again at once: the warm figure (the tree is in the page cache).
Before the rounds: single-core hashlib SHA-256 over a 64 MiB buffer, and the page-cache
residency check (`fincore`) that eviction worked. Eviction is posix_fadvise(DONTNEED)
per file after fsync (touches only these files); --drop-caches writes 3 to
/proc/sys/vm/drop_caches instead (root; the whole machine's cache). On a VM the host
may still cache the virtual disk: the dd figure then includes that too, and it is the
limit the gate is compared with. Medians, min-max spread and the load average of each
round are printed; the files are removed at the end.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import single_core_sha256

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from k3infra.weights import gate, tree, verify  # noqa: E402

MIB = 1 << 20
REPO, REV = "moonshotai/Kimi-K3", "0" * 40


def loadavg() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def generate(root: Path, files: int, file_bytes: int) -> list[Path]:
    root.mkdir(parents=True)
    paths = []
    for i in range(files):
        path = root / f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        block = bytearray(os.urandom(MIB))
        with open(path, "wb") as fh:
            for j in range(file_bytes // MIB):
                block[:8] = (i * 1_000_003 + j).to_bytes(8, "big")   # distinct per MiB
                fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())
        paths.append(path)
    (root / "config.json").write_text('{"architectures": ["KimiK3ForCausalLM"]}\n')
    paths.append(root / "config.json")
    return paths


def evict(paths: list[Path], drop_caches: bool) -> None:
    if drop_caches:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_bytes(paths: list[Path]) -> int:
    """Bytes of these files in the page cache (util-linux fincore), -1 if unavailable."""
    if not shutil.which("fincore"):
        return -1
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES",
                          *map(str, paths)], capture_output=True, text=True)
    if out.returncode != 0:
        return -1
    return sum(int(x) for x in out.stdout.split())


def dd_read(paths: list[Path], streams: int) -> float:
    """Seconds for dd to read every file once (bs=8M), `streams` at a time."""
    start = time.perf_counter()
    if streams == 1:
        for p in paths:
            subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=8M", "status=none"], check=True)
    else:
        subprocess.run(["xargs", "-0", "-P", str(streams), "-I{}", "dd", "if={}", "of=/dev/null",
                        "bs=8M", "status=none"],
                       input=b"\0".join(str(p).encode() for p in paths), check=True)
    return time.perf_counter() - start


def row(label: str, value: str) -> None:
    print(f"  {label:<40} {value}")


def spread(values: list[float], unit: str = "GB/s", digits: int = 2) -> str:
    med = statistics.median(values)
    return (f"{med:.{digits}f} {unit} (median of {len(values)}; min {min(values):.{digits}f}, "
            f"max {max(values):.{digits}f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=24)
    ap.add_argument("--file-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=tree.default_workers())
    ap.add_argument("--dir", help="where to generate the tree (default: a temporary directory)")
    ap.add_argument("--drop-caches", action="store_true",
                    help="evict with /proc/sys/vm/drop_caches (root) instead of fadvise")
    args = ap.parse_args()

    cpus = tree.default_workers()
    print(f"gate benchmark: {cpus} CPUs, {args.workers} hashing threads, python "
          f"{sys.version.split()[0]}, eviction: "
          f"{'/proc/sys/vm/drop_caches' if args.drop_caches else 'posix_fadvise(DONTNEED) per file'}")
    print(f"load average at start: {loadavg()}")
    base = Path(tempfile.mkdtemp(prefix="k3-gate-bench-", dir=args.dir))
    try:
        root = base / "tree"
        t0 = time.perf_counter()
        paths = generate(root, args.files, args.file_mib * MIB)
        total = sum(p.stat().st_size for p in paths)
        print(f"    generated {len(paths)} files, {total / 2**30:.2f} GiB in "
              f"{time.perf_counter() - t0:.1f} s under {base}")
        lock = verify.lock_from_dir(str(root), REPO, REV, workers=args.workers)
        lock_file = base / "lock.json"
        lock_file.write_text(tree.lock_to_json(lock))

        sha1 = [single_core_sha256() for _ in range(3)]
        hash_limit = statistics.median(sha1) * args.workers
        print("\n[1] limits measured in this run")
        row("single-core hashlib SHA-256", spread(sha1))
        row(f"hashing limit ({args.workers} threads x median)", f"{hash_limit:.2f} GB/s")
        evict(paths, args.drop_caches)
        res = resident_bytes(paths)
        row("page cache after eviction (fincore)",
            "unknown (no fincore)" if res < 0 else f"{res / MIB:.1f} MiB of {total / MIB:.0f} MiB resident")

        disk1, diskp, cold, warm, loads = [], [], [], [], []
        for _ in range(args.rounds):
            loads.append(loadavg().split()[0])
            evict(paths, args.drop_caches)
            disk1.append(total / dd_read(paths, 1) / 1e9)
            evict(paths, args.drop_caches)
            diskp.append(total / dd_read(paths, args.workers) / 1e9)
            for out in (cold, warm):
                if out is cold:
                    evict(paths, args.drop_caches)
                report = gate.run_gate(str(root), str(lock_file), expect_digest=lock.tree_digest,
                                       repo=REPO, revision=REV, workers=args.workers, emit=None)
                assert report.ok and report.hashed_bytes == total, report.problems
                out.append(total / report.seconds / 1e9)
        disk_limit = max(statistics.median(disk1), statistics.median(diskp))
        print("\n[2] the disk's sequential read (page cache evicted before each pass)")
        row("dd bs=8M, one stream", spread(disk1))
        row(f"dd bs=8M, {args.workers} streams (xargs -P)", spread(diskp))
        row("disk read limit (faster median)", f"{disk_limit:.2f} GB/s")
        print(f"\n[3] the gate: lock read once, every file read and hashed ({args.workers} threads)")
        row("cold page cache", spread(cold))
        row("warm page cache", spread(warm))
        c, w = statistics.median(cold), statistics.median(warm)
        row("cold / disk read limit", f"{c / disk_limit:.0%}")
        row("cold / min(disk, hashing limit)", f"{c / min(disk_limit, hash_limit):.0%}")
        row("warm / hashing limit", f"{w / hash_limit:.0%}")
        print(f"  1-min load average at each round start: {', '.join(loads)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"load average at end: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
