#!/usr/bin/env python3
"""The Hub once per cluster, measured on loopback (on demand; not part of `make test`).

    .venv/bin/python benchmarks/fill_bench.py [--tree-mib 256] [--shards 16]
                                              [--hub-mbps 40] [--nodes 1,2,4] [--rounds 3]

A generated tree (16 shards + small files, 256 MiB by default) behind the loopback Hub
stand-in (tests/hub_loopback.py) paced at --hub-mbps: ONE shared link, standing for the
cluster's egress to the Hub (and the Hub's rate limit). N simulated nodes are processes
on this machine, each with its own directory, running the real prefetch
(`python -m k3infra.weights prefetch`, huggingface_hub underneath):

- **baseline** (`k3:weights.source: hub`, node-local today): every node pulls the whole
  tree from the Hub at once;
- **fan-out** (`cluster-then-hub`): node 0 pulls from the Hub; each verified copy then
  runs the source's start check (`gate --require-marker`, a full re-hash) and serves with
  the real nginx and the configuration the stack renders (k3infra/weights/source_server.py);
  node i fills from `k3infra.weights.fanout.origins` (parent (i-1)//2, then node 0, then
  the Hub), starting as soon as its parent serves, like the Pulumi order.

Per run: Hub bytes (what the stand-in sent, every file body) and the fill time (start to
the last node's marker). Rounds interleave N and the two modes, so a busy moment on this
shared machine hits both alike; each figure is the median of its rounds with the spread
(min-max) and the load average per run. The limits, measured in the same run: the Hub
link floor (Hub bytes / --hub-mbps) and the machine's hashing limit (every filling node
hashes every byte: cores x single-core SHA-256), against which the in-cluster fill rate
is shown. The in-cluster path is unthrottled loopback: its figure is this machine's CPU
(HTTP client + hashing + nginx on 2 cores), not a network.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchlib import single_core_sha256

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))     # the loopback Hub lives with the tests

from hub_loopback import LoopbackHub  # noqa: E402

from k3infra.config import parse_stack_config  # noqa: E402
from k3infra.receipt import load_receipt  # noqa: E402
from k3infra.weights import fanout, source_server, tree  # noqa: E402
from k3infra.weights.manifests import WEIGHTS_ROOT, WeightsLayout  # noqa: E402

MIB = 1 << 20
PY = sys.executable
REPO = "moonshotai/Kimi-K3"
REVISION = "a" * 40
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
WORKERS = 2


def make_files(total_mib: int, shards: int) -> dict[str, bytes]:
    files = {"config.json": b'{"architectures": ["KimiK3ForCausalLM"]}\n',
             "tokenizer_config.json": b"{}\n", "README.md": b"# generated\n"}
    size = total_mib * MIB // shards
    for i in range(1, shards + 1):
        seed = hashlib.sha256(i.to_bytes(4, "big")).digest()
        block = hashlib.sha256(seed).digest() * (MIB // 32)
        files[f"model-{i:05d}-of-{shards:05d}.safetensors"] = (block * (size // MIB + 1))[:size - i]
    return files


def stack_config(nodes: int, source: str):
    raw = {"k3:weightsRevision": REVISION, "k3:apiKey": "x",
           "k3:engineImage": "registry.example.com/k3/vllm@sha256:" + "1" * 64,
           "k3:replicas": str(nodes),
           "k3:weights": json.dumps({"mode": "node-local", "source": source})}
    return parse_stack_config(raw, receipt=load_receipt())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One simulated node: its own weights root, prefetch process, and (once verified)
    its source: the start check, then nginx."""

    def __init__(self, base: Path, i: int, lock_text: str, lock: tree.Lock):
        self.i = i
        self.root = base / f"node-{i}" / "weights"
        self.lay = WeightsLayout(REPO, REVISION)
        self.tree = Path(self.lay.tree.replace(WEIGHTS_ROOT, str(self.root), 1))
        self.lock_path = Path(self.lay.lock.replace(WEIGHTS_ROOT, str(self.root), 1))
        self.tree.parent.mkdir(parents=True)
        self.lock_path.write_text(lock_text)
        self.lock = lock
        self.home = base / f"node-{i}" / "home"
        self.nginx = None
        self.url = None
        self.ready = threading.Event()
        self.done_at = None
        self.error = None

    def fill(self, sources: str, hub_endpoint: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        env.update({"PYTHONPATH": str(ROOT), "HF_ENDPOINT": hub_endpoint, "HF_HOME": str(self.home),
                    "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1,127.0.0.2"})
        res = subprocess.run([PY, "-m", "k3infra.weights", "prefetch", "--lock", str(self.lock_path),
                              "--dest", str(self.tree), "--workers", str(WORKERS),
                              "--sources", sources], env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"node {self.i}: prefetch failed: {res.stderr[-2000:]}")

    def serve(self) -> None:
        check = subprocess.run(
            [PY, "-m", "k3infra.weights", "gate", str(self.tree), "--lock", str(self.lock_path),
             "--expect-digest", self.lock.tree_digest, "--repo", REPO, "--revision", REVISION,
             "--workers", str(WORKERS), "--require-marker"],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"node {self.i}: source start check refused: {check.stderr[-2000:]}")
        port = free_port()
        tmp = self.root.parent / "nginx"
        tmp.mkdir()
        conf = source_server.nginx_conf(self.lay, weights_root=str(self.root), tmp_dir=str(tmp),
                                        port=port).replace("listen ", "listen 127.0.0.1:", 1)
        # nginx starts as root here (a pod runs it as uid 1000, where `user` is ignored).
        (tmp / "nginx.conf").write_text("user root;\n" + conf)
        self.nginx = subprocess.Popen([NGINX, "-e", "stderr", "-c", str(tmp / "nginx.conf"),
                                       "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        for _ in range(400):
            try:
                urllib.request.urlopen(self.url + source_server.LIVE_PATH, timeout=2).read()
                return
            except OSError:
                time.sleep(0.025)
        raise RuntimeError(f"node {self.i}: nginx did not start")

    def stop(self) -> None:
        if self.nginx is not None:
            self.nginx.terminate()
            self.nginx.wait(10)


def run_scenario(hub: LoopbackHub, lock: tree.Lock, lock_text: str, nodes: int, source: str,
                 scratch: Path) -> dict:
    cfg = stack_config(nodes, source)
    serving = set(fanout.serving_copies(cfg))
    base = Path(tempfile.mkdtemp(prefix=f"fill-{source}-{nodes}-", dir=scratch))
    fleet = [Node(base, i, lock_text, lock) for i in range(nodes)]
    hub.clear_hits()
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()

    def work(node: Node) -> None:
        try:
            order = fanout.origins(cfg, node.i)
            for o in order:
                if o != fanout.HUB:
                    fleet[o].ready.wait()        # like the Pulumi order: its source serves
                    if fleet[o].error:
                        raise RuntimeError(f"source {o} never served")
                    break
            urls = ",".join(o if o == fanout.HUB else fleet[o].url for o in order)
            node.fill(urls, hub.endpoint)
            node.done_at = time.monotonic() - t0
            if node.i in serving:
                node.serve()
        except Exception as exc:       # reported below; children then stop waiting
            node.error = exc
        finally:
            node.ready.set()

    threads = [threading.Thread(target=work, args=(n,)) for n in fleet]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in fleet:
        n.stop()
    errors = [n.error for n in fleet if n.error]
    if errors:
        raise RuntimeError(errors[0])
    result = {"seconds": max(n.done_at for n in fleet), "hub_bytes": hub.body_bytes(),
              "load1": (load_before + os.getloadavg()[0]) / 2,
              "node_seconds": [n.done_at for n in fleet]}
    shutil.rmtree(base, ignore_errors=True)
    return result


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree-mib", type=int, default=256)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--hub-mbps", type=float, default=40.0, help="Hub stand-in pace, MB/s (one shared link)")
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not os.path.exists(NGINX):
        print("nginx is not installed (apt-get install nginx-light): the in-cluster source needs it")
        return 2
    counts = [int(x) for x in args.nodes.split(",")]
    files = make_files(args.tree_mib, args.shards)
    lock = tree.make_lock(REPO, REVISION, [tree.FileEntry(p, len(d), hashlib.sha256(d).hexdigest())
                                           for p, d in files.items()])
    lock_text = tree.lock_to_json(lock)
    total = lock.total_bytes
    cores = len(os.sched_getaffinity(0))
    print(f"tree: {len(files)} files, {total / 1e6:.1f} MB; Hub stand-in paced at "
          f"{args.hub_mbps:g} MB/s (one shared link); {cores} cores; {WORKERS} hashing threads "
          "per node; nginx " + subprocess.run([NGINX, "-v"], capture_output=True, text=True).stderr.strip())
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sha = single_core_sha256()
    hash_limit = sha * cores
    print(f"single-core SHA-256 {sha:.2f} GB/s; machine hashing limit {cores} x that = "
          f"{hash_limit:.2f} GB/s")
    results: dict = {}
    hub = LoopbackHub(REPO, files, commit=REVISION, link_bytes_per_s=args.hub_mbps * 1e6).start()
    scratch = Path(tempfile.mkdtemp(prefix="k3-fill-bench-"))
    try:
        print(f"\n{'round':>5} {'N':>3} {'mode':<18} {'seconds':>8} {'Hub MB':>9} {'x tree':>7} "
              f"{'load1':>6}  per-node seconds (done)")
        for rnd in range(1, args.rounds + 1):
            for n in counts:
                modes = ("hub", "cluster-then-hub") if rnd % 2 else ("cluster-then-hub", "hub")
                for source in modes:
                    res = run_scenario(hub, lock, lock_text, n, source, scratch)
                    results.setdefault((n, source), []).append(res)
                    print(f"{rnd:>5} {n:>3} {source:<18} {res['seconds']:>8.2f} "
                          f"{res['hub_bytes'] / 1e6:>9.1f} {res['hub_bytes'] / total:>7.2f} "
                          f"{res['load1']:>6.2f}  "
                          + " ".join(f"{s:.1f}" for s in res["node_seconds"]), flush=True)
    finally:
        hub.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    floor = total / (args.hub_mbps * 1e6)
    print(f"\nHub link floor for one tree: {floor:.2f} s ({total / 1e6:.1f} MB / {args.hub_mbps:g} MB/s)")
    print(f"{'N':>3} {'mode':<18} {'fill seconds, median (min-max)':<32} {'Hub bytes x tree':<18} "
          f"{'/ its Hub floor':<16} in-cluster copies")
    for n in counts:
        for source in ("hub", "cluster-then-hub"):
            runs = results[(n, source)]
            secs = [r["seconds"] for r in runs]
            xs = sorted({round(r["hub_bytes"] / total, 3) for r in runs})
            extra = ""
            if source != "hub" and n > 1:
                # Copies after the first: time from the first copy's marker to the last one's.
                tails = [r["seconds"] - r["node_seconds"][0] for r in runs]
                rate = (n - 1) * total / statistics.median(tails) / 1e9
                extra = (f"{n - 1} cop{'y' if n == 2 else 'ies'} in {spread(tails)} s after copy 0: {rate:.2f} GB/s, "
                         f"{rate / hash_limit:.0%} of the hashing limit")
            # Its Hub floor: the Hub bytes it pulled over the paced link, the time no
            # scheme that pulls them can beat.
            own_floor = floor * statistics.median([r["hub_bytes"] for r in runs]) / total
            print(f"{n:>3} {source:<18} {spread(secs):<32} {', '.join(f'{x:g}' for x in xs):<18} "
                  f"{statistics.median(secs) / own_floor:<16.2f} {extra}")
        if n > 1:
            base = statistics.median([r["seconds"] for r in results[(n, "hub")]])
            fan = statistics.median([r["seconds"] for r in results[(n, "cluster-then-hub")]])
            print(f"    N={n}: fan-out / baseline fill time = {fan / base:.2f}")
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
