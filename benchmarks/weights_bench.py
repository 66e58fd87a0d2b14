#!/usr/bin/env python3
"""Weights verifier and prefetch, measured side by side with their baselines and the
machine's limit, all in one run (on demand; not part of `make test`).

    .venv/bin/python benchmarks/weights_bench.py [--shards 96] [--shard-mib 22] [--repeat 5]
                                                 [--link-gbps 0.25] [--prefetch-rounds 3]

On a generated tree of 96 shards plus 4 small files (100 files, >= 2 GiB by default) in
a temporary directory (removed at the end), it prints:
1. single-core hashlib SHA-256 speed and the machine limit (hashing threads x that),
   probed in every round: each fraction of the limit below is paired by round (a figure
   over the limit measured just before it) and given as the median over rounds with its
   spread, next to the fraction of the best-case limit (the run's fastest probe);
2. our full verify in-process (GB/s and fraction of the limit) vs `sha256sum` over the
   same files, one process and one per core (`xargs -P`);
3. the whole `k3infra weights verify --full` command, process start included: the
   `k3infra` console script of a copy installed in a fresh venv (see install()), and
   what it spends outside hashing (start-up, imports, exit), next to a bare interpreter
   start; then the re-verify of the same tree (since issue 21 no stamp on the volume is
   trusted, so this re-hashes from the page cache);
4. prefetch of the tree from the loopback Hub (tests/hub_loopback.py) through the real
   huggingface_hub client, overlapped verification vs verify-after-download, on
   unthrottled loopback and on a link paced at --link-gbps. Each run reports where the
   two cores went: the stand-in Hub (this process), the prefetch process (HTTP client
   and, separately, its hashing threads) and everything else on the machine.
Sections 1-3 run in interleaved rounds, and so do the prefetch runs (links and modes
alternate), so a busy moment on this shared machine hits every figure alike; each figure
is the median of its rounds with the spread (min-max), and the load average is printed
per round. The files sit in the page cache (24 GiB RAM here): the verify figures measure
hashing, not the disk. --cold evicts the tree's pages before each timed verify (with
posix_fadvise DONTNEED on its own files: other work keeps its cache).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchlib import single_core_sha256

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))     # the loopback Hub lives with the tests

from hub_loopback import LoopbackHub, environment  # noqa: E402

from k3infra.weights import tree, verify  # noqa: E402

MIB = 1 << 20
PY = sys.executable
# The `k3infra` console script of an installed package: set by install().
K3INFRA: list[str] = []
VENV_PY = PY
CHILD_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
# What pip writes for a [project.scripts] entry point (pip's vendored distlib template).
CONSOLE_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from k3infra.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""
CLK_TCK = os.sysconf("SC_CLK_TCK")


def install(venv: Path) -> list[str]:
    """k3infra as a user's `pip install` leaves it, timed as they run it: a fresh venv
    (no dev .pth hooks such as the editable finder, which costs ~10 ms per start), the
    package in its site-packages with bytecode compiled (pip compiles at install; this
    checkout runs with PYTHONDONTWRITEBYTECODE=1 and would time the compiler) and the
    console script pip writes. The verify command needs only the standard library."""
    global VENV_PY
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True)
    VENV_PY = str(venv / "bin" / "python")
    site = Path(subprocess.run([VENV_PY, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    shutil.copytree(ROOT / "k3infra", site / "k3infra", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([VENV_PY, "-m", "compileall", "-q", str(site / "k3infra")], check=True,
                   stdout=subprocess.DEVNULL)
    script = venv / "bin" / "k3infra"
    script.write_text(CONSOLE_SCRIPT.format(python=VENV_PY))
    script.chmod(0o755)
    return [str(script)]


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


def evict(paths: list[Path], cold: bool) -> None:
    """Drop the tree's pages from the page cache (clean pages only: sync first)."""
    if not cold:
        return
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_cache(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as fh:
            while fh.read(16 * MIB):
                pass


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent not idle (all cores, /proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)      # idle + iowait
    return (sum(fields[:8]) - idle) / CLK_TCK


def own_cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


@dataclass
class Cpu:
    """CPU seconds spent during one measurement, by whom."""
    wall: float = 0.0
    here: float = 0.0        # this process (the stand-in Hub's threads, or in-process verify)
    child: float = 0.0       # the command under test (a child process)
    machine: float = 0.0     # every core of the machine, any process

    @property
    def other(self) -> float:
        """Everything else on the machine: other sessions, builds, kernel writeback."""
        return max(self.machine - self.here - self.child, 0.0)


class measure:
    """`with measure() as cpu:` fills `cpu` (a Cpu) when the block ends."""

    def __enter__(self) -> Cpu:
        self.cpu = Cpu()
        self.t = (time.perf_counter(), own_cpu(resource.RUSAGE_SELF),
                  own_cpu(resource.RUSAGE_CHILDREN), machine_busy_seconds())
        return self.cpu

    def __exit__(self, *exc) -> None:
        wall, here, child, machine = self.t
        self.cpu.wall = time.perf_counter() - wall
        self.cpu.here = own_cpu(resource.RUSAGE_SELF) - here
        self.cpu.child = own_cpu(resource.RUSAGE_CHILDREN) - child
        self.cpu.machine = machine_busy_seconds() - machine


def run(cmd: list[str], **kw) -> tuple[Cpu, subprocess.CompletedProcess]:
    with measure() as cpu:
        res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return cpu, res


def load1() -> float:
    return os.getloadavg()[0]


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    """'median (min-max)' of a list of figures."""
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def row(label: str, value: str, note: str = "") -> None:
    print(f"  {label:<54} {value:>22}  {note}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=96)
    ap.add_argument("--shard-mib", type=int, default=22)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds of sections 1-3")
    ap.add_argument("--link-gbps", type=float, default=0.25,
                    help="paced link for the second prefetch comparison (GB/s; 0 skips it)")
    ap.add_argument("--prefetch-rounds", type=int, default=3,
                    help="interleaved rounds of the prefetch runs (each: every link, both modes)")
    ap.add_argument("--cold", action="store_true", help="evict the tree from the page cache before "
                    "each timed verify")
    ap.add_argument("--dir", help="parent of the temporary tree (default: the system temp dir)")
    ap.add_argument("--skip-prefetch", action="store_true")
    args = ap.parse_args()
    if args.prefetch_rounds < 1:
        args.skip_prefetch = True

    cores = os.cpu_count() or 1
    workers = tree.default_workers()
    print(f"weights benchmark: {cores} CPUs, {workers} hashing threads, python {sys.version.split()[0]}, "
          f"{subprocess.run(['sha256sum', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          "(other work on this machine slows every figure: see the per-round load and CPU columns)")

    tmp = Path(tempfile.mkdtemp(prefix="k3-weights-bench-", dir=args.dir))
    try:
        src = tmp / "tree"
        t0 = time.perf_counter()
        paths = generate(src, args.shards, args.shard_mib * MIB)
        total = sum(p.stat().st_size for p in paths)
        lock = verify.lock_from_dir(str(src), "bench/k3", "b" * 40, workers=workers)
        lock_file = tmp / "lock.json"
        lock_file.write_text(tree.lock_to_json(lock))
        K3INFRA[:] = install(tmp / "venv")
        # Written back now, not by the kernel's 30 s timer in the middle of a timed run.
        os.sync()
        print(f"\n    generated {len(paths)} files, {total / 2**30:.2f} GiB ({total / 1e9:.2f} GB) in "
              f"{time.perf_counter() - t0:.1f} s under {tmp} (synced)")
        warm_cache(paths)
        verify_sections(args, src, paths, lock, lock_file, total, cores, workers)
        if not args.skip_prefetch:
            prefetch_section(src, paths, lock_file, tmp, total, workers, args.link_gbps,
                             args.prefetch_rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


SUMMARY_SECONDS = re.compile(r"; ([0-9.]+) s$")


def verify_sections(args, src, paths, lock, lock_file, total, cores, workers) -> None:
    rel = [str(p.relative_to(src)) for p in paths]
    per_proc = max(1, len(rel) // cores // 4)
    command = [*K3INFRA, "weights", "verify", str(src), "--lock", str(lock_file), "--full"]
    singles, ours, ours_cpu, cmd, cmd_cpu, cmd_inside, base, basep, loads = ([] for _ in range(9))
    ours_other, cmd_other = [], []
    for _ in range(args.repeat):
        loads.append(load1())
        singles.append(single_core_sha256(1.0))
        evict(paths, args.cold)
        with measure() as cpu:
            report = verify.verify_tree(str(src), lock, workers=workers,
                                        emit=None)
        assert report.ok, report.problems
        ours.append(cpu.wall)
        ours_cpu.append(cpu.here)
        ours_other.append(cpu.other)
        evict(paths, args.cold)
        cpu, res = run(command, cwd=src.parent, env=CHILD_ENV)
        cmd.append(cpu.wall)
        cmd_cpu.append(cpu.child)
        cmd_other.append(cpu.other)
        cmd_inside.append(float(SUMMARY_SECONDS.search(res.stdout.strip().splitlines()[-1]).group(1)))
        evict(paths, args.cold)
        base.append(run(["sha256sum", *rel], cwd=src)[0].wall)
        evict(paths, args.cold)
        basep.append(run(["sh", "-c", f"ls | xargs -P {cores} -n {per_proc} sha256sum > /dev/null"],
                         cwd=src)[0].wall)
    single = max(singles)
    limit = single * workers

    def gbps(seconds: list[float]) -> list[float]:
        return [total / s / 1e9 for s in seconds]

    def of_limit(seconds: list[float]) -> str:
        # Paired by round: each round's figure over the limit measured in that round (the
        # single-core probe runs just before it), so a busy moment weighs on both alike.
        # The best-case limit (the run's fastest single-core probe) is given beside it.
        g = gbps(seconds)
        paired = [x / (workers * one) for x, one in zip(g, singles)]
        return (f"median {statistics.median(paired):.0%} ({min(paired):.0%}-{max(paired):.0%}) of "
                f"the same round's limit; {statistics.median(g) / limit:.0%} of the best-case limit")

    print(f"\n    {args.repeat} interleaved rounds; load average (1 min) per round: "
          + ", ".join(f"{x:.2f}" for x in loads))
    print("\n[1] SHA-256 speed and the machine limit")
    row("single-core hashlib SHA-256, median (min-max)", spread(singles) + " GB/s")
    row(f"machine limit per round ({workers} threads x that round's single-core)",
        spread([workers * one for one in singles]) + " GB/s")
    row(f"best-case limit ({workers} threads x the best single-core)", f"{limit:.2f} GB/s")

    print("\n[2] full verify vs sha256sum, same files" + (" (evicted from the page cache)"
                                                          if args.cold else " (page cache warm)"))
    row(f"our full verify, {workers} threads, in-process", spread(gbps(ours)) + " GB/s",
        f"{spread(ours)} s; {of_limit(ours)}")
    row("  CPU s: its threads / the rest of the machine", f"{spread(ours_cpu)} / "
        f"{statistics.median(ours_other):.2f}", f"{workers} cores x the median wall time = "
        f"{workers * statistics.median(ours):.2f} CPU s available")
    row("sha256sum, one process", spread(gbps(base)) + " GB/s", f"{spread(base)} s")
    row(f"sha256sum, {cores} processes via xargs -P", spread(gbps(basep)) + " GB/s", f"{spread(basep)} s")
    row("ratio: ours / sha256sum (medians)",
        f"{statistics.median(base) / statistics.median(ours):.2f}x", "target >= 1.6x")
    row(f"ratio: ours / sha256sum x{cores} (medians)",
        f"{statistics.median(basep) / statistics.median(ours):.2f}x")

    print("\n[3] the whole `k3infra weights verify --full` command, process start included")
    row(f"whole command ({len(paths)} files, {total / 1e9:.2f} GB)", spread(gbps(cmd)) + " GB/s",
        f"{spread(cmd)} s; {of_limit(cmd)}")
    row("  CPU s: the command / the rest of the machine", f"{spread(cmd_cpu)} / "
        f"{statistics.median(cmd_other):.2f}", f"{workers} cores x the median wall time = "
        f"{workers * statistics.median(cmd):.2f} CPU s available")
    outside = [c - i for c, i in zip(cmd, cmd_inside)]
    row("  of which outside verify_tree (start, imports, exit)", spread(outside, "{:.3f}") + " s",
        f"verify_tree itself: {spread(cmd_inside)} s")
    start_only = [run([VENV_PY, "-c", "pass"])[0].wall for _ in range(10)]
    imports = [run([VENV_PY, "-c", "import k3infra.cli.weights, k3infra.weights.verify"], cwd=src.parent,
                   env=CHILD_ENV)[0].wall for _ in range(10)]
    row("  baseline: bare `python -c pass`, median of 10", f"{statistics.median(start_only) * 1000:.0f} ms")
    row("  baseline: python + the verify command's imports, median of 10",
        f"{statistics.median(imports) * 1000:.0f} ms")
    warm = [run([*K3INFRA, "weights", "verify", str(src), "--lock", str(lock_file)], cwd=src.parent,
                env=CHILD_ENV)[0].wall for _ in range(10)]
    row(f"re-verify, page cache warm, no stamps trusted ({len(paths)} files), median of 10",
        f"{statistics.median(warm) * 1000:.0f} ms", f"max {max(warm) * 1000:.0f} ms")


HASH_CPU = re.compile(r"hashing CPU ([0-9.]+) s")


def prefetch_section(src, paths, lock_file, tmp, total, workers, link_gbps, rounds) -> None:
    # The Hub is a subprocess's peer here: the server runs in this process, the prefetch
    # in its own (`python -m k3infra.weights prefetch`), as in the Job.
    files = {str(p.relative_to(src)): p.read_bytes() for p in paths}
    lock = tree.load_lock(str(lock_file))[0]
    links = [("loopback", None)]
    if link_gbps:
        links.append((f"paced {link_gbps:g} GB/s", link_gbps * 1e9))
    print(f"\n[4] prefetch from the loopback Hub (real huggingface_hub client, 8 download workers, "
          f"{workers} hashing threads); {rounds} interleaved rounds")
    print("    CPU seconds per run: Hub = the stand-in Hub (this process); prefetch = the prefetch "
          "process,\n    of which hash = its hashing threads; other = the rest of the machine "
          "(other sessions, kernel)")
    print(f"    {'round':>5} {'link':<16} {'mode':<11} {'seconds':>8} {'GB/s':>6} {'Hub':>6} "
          f"{'prefetch':>9} {'hash':>6} {'other':>6} {'load1':>6}")
    hubs = [LoopbackHub(lock.repo, files, commit=lock.revision, link_bytes_per_s=rate).start()
            for _label, rate in links]
    results: dict[tuple[str, str], list] = {}

    def prefetch_once(hub, mode: str) -> tuple[Cpu, float, float]:
        env = environment(hub, str(tmp / "hf-home"))
        dest = tmp / "dest"
        shutil.rmtree(dest, ignore_errors=True)
        os.sync()           # the last run's deletes and writes settle before the clock
        cmd = [PY, "-m", "k3infra.weights", "prefetch", "--lock", str(lock_file),
               "--dest", str(dest), "--workers", str(workers)]
        if mode == "sequential":
            cmd.append("--no-overlap")
        load = load1()
        cpu, res = run(cmd, env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
        return cpu, float(HASH_CPU.search(res.stdout).group(1)), load

    try:
        # One untimed run per mode first: the first prefetch after the verify rounds ran
        # slower (up to 1.3x) whatever its mode, and round 1 always starts with "overlap".
        for mode in ("overlap", "sequential"):
            cpu, _, _ = prefetch_once(hubs[0], mode)
            print(f"    {'warm-up, not counted':<22} {mode:<11} {cpu.wall:>8.2f}", flush=True)
        for r in range(rounds):
            for (label, _rate), hub in zip(links, hubs):
                modes = ("overlap", "sequential") if (r % 2 == 0) else ("sequential", "overlap")
                for mode in modes:
                    cpu, hashing, load = prefetch_once(hub, mode)
                    results.setdefault((label, mode), []).append((cpu, hashing))
                    print(f"    {r + 1:>5} {label:<16} {mode:<11} {cpu.wall:>8.2f} "
                          f"{total / cpu.wall / 1e9:>6.2f} {cpu.here:>6.2f} {cpu.child:>9.2f} "
                          f"{hashing:>6.2f} {cpu.other:>6.2f} {load:>6.2f}", flush=True)
        shutil.rmtree(tmp / "dest", ignore_errors=True)
    finally:
        for hub in hubs:
            hub.stop()
    print()
    for label, rate in links:
        o = [c.wall for c, _ in results[(label, "overlap")]]
        s = [c.wall for c, _ in results[(label, "sequential")]]
        paired = [b - a for a, b in zip(o, s)]          # same round: sequential - overlapped
        row(f"{label}: overlapped verify, median (min-max)", spread(o) + " s",
            f"{total / statistics.median(o) / 1e9:.2f} GB/s")
        row(f"{label}: verify after download, median (min-max)", spread(s) + " s",
            f"{total / statistics.median(s) / 1e9:.2f} GB/s")
        row(f"{label}: overlap saves (same round), median (min-max)", spread(paired) + " s",
            f"{statistics.median(paired) / statistics.median(s):.0%} of the sequential time; "
            f"overlap slower in {sum(1 for d in paired if d < 0)} of {len(paired)} rounds")
        for mode in ("overlap", "sequential"):
            runs = results[(label, mode)]
            row(f"{label}: {mode} CPU s, Hub / prefetch (hash) / other",
                f"{statistics.median(c.here for c, _ in runs):.1f} / "
                f"{statistics.median(c.child for c, _ in runs):.1f} "
                f"({statistics.median(h for _, h in runs):.1f}) / "
                f"{statistics.median(c.other for c, _ in runs):.1f}",
                f"medians; {workers} cores x {statistics.median(c.wall for c, _ in runs):.1f} s = "
                f"{workers * statistics.median(c.wall for c, _ in runs):.1f} CPU s available")
        if rate:
            row(f"{label}: link-time floor (bytes / link rate)", f"{total / rate:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
