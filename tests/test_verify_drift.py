"""`k3infra verify` on recorded objects (no cluster): the StatefulSet the stack renders,
a weights marker and lock as the weights runtime writes them, and a benchmark run
archived the way the reader pod streams it."""
import base64
import copy
import io
import json
import tarfile

import pytest

from k3infra.bench import fetch as kc
from k3infra.live import drift
from k3infra.receipt import load_receipt
from k3infra.bench import pod_runner
from k3infra.bench.workload import WORKLOAD_ID
from k3infra.cli import main
from k3infra.cli.verify import verify_rows
from k3infra.weights.manifests import WeightsLayout
from k3infra.weights.tree import MARKER_NAME

from bench_results import receipt_latencies_ms, result_dict
from conftest import GOOD_REVISION, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"


@pytest.fixture
def sts():
    obj = copy.deepcopy(manifest(render("existing", PIN, "benchmark.enabled=true"), "StatefulSet"))
    obj["status"] = {"replicas": 1, "readyReplicas": 1}
    return obj


def _container(sts):
    return sts["spec"]["template"]["spec"]["containers"][0]


def _failed(rows):
    return [r.check for r in rows if not r.ok]


def test_rendered_statefulset_has_no_drift(sts, receipt):
    rows = drift.statefulset_drift(sts, receipt, expected_image=_container(sts)["image"])
    assert _failed(rows) == []
    assert {r.check for r in rows} >= {"image pinned by digest", "no other engine-path flags",
                                       "API key", "ready replicas"}


@pytest.mark.parametrize("mutate, failing", [
    (lambda c, s: c.update(image="registry.example.com/k3/vllm:latest"),
     ["image pinned by digest", "image"]),
    (lambda c, s: c["args"].insert(c["args"].index("--enable-expert-parallel"), "--max-num-seqs"),
     ["engine args (receipt order, after the model dir)", "no other engine-path flags"]),
    (lambda c, s: c["args"].extend(["--gpu-memory-utilization", "0.95"]),
     ["no other engine-path flags"]),
    (lambda c, s: c["args"].remove("--disable-custom-all-reduce"),
     ["engine args (receipt order, after the model dir)"]),
    (lambda c, s: next(e for e in c["env"] if e["name"] == "PYTORCH_CUDA_ALLOC_CONF")
     .update(value="expandable_segments:False"), ["env PYTORCH_CUDA_ALLOC_CONF"]),
    (lambda c, s: c["env"].append({"name": "NCCL_ALGO", "value": "Ring"}),
     ["no other engine-path env"]),
    (lambda c, s: next(e for e in c["env"] if e["name"] == "VLLM_API_KEY").update(
        {"value": "sk-literal", "valueFrom": None}), ["API key"]),
    (lambda c, s: s["status"].update(readyReplicas=0), ["ready replicas"]),
    (lambda c, s: s["metadata"]["annotations"].update({"k3infra.dev/profile": "custom"}),
     ["profile"]),
    (lambda c, s: s["metadata"]["annotations"].update(
        {"k3infra.dev/engine-commit": "0123456789abcdef0123456789abcdef01234567"}),
     ["engine commit annotation"]),
    # The full commit a build takes (k3:engine.commit) names the receipt's engine.
    (lambda c, s: s["metadata"]["annotations"].update(
        {"k3infra.dev/engine-commit": (load_receipt().engine.commit + "0" * 40)[:40]}), []),
])
def test_drift_is_reported(sts, receipt, mutate, failing):
    expected = _container(sts)["image"]
    c = _container(sts)
    mutate(c, sts)
    if "valueFrom" in next((e for e in c["env"] if e["name"] == "VLLM_API_KEY"), {}):
        env = next(e for e in c["env"] if e["name"] == "VLLM_API_KEY")
        if env["valueFrom"] is None:
            del env["valueFrom"]
    assert _failed(drift.statefulset_drift(sts, receipt, expected_image=expected)) == failing


def test_reordered_engine_args_are_drift(sts, receipt):
    c = _container(sts)
    i = c["args"].index("--moe-backend")
    j = c["args"].index("--kda-prefill-backend")
    c["args"][i:i + 2], c["args"][j:j + 2] = c["args"][j:j + 2], c["args"][i:i + 2]
    assert _failed(drift.statefulset_drift(sts, receipt)) == [
        "engine args (receipt order, after the model dir)"]


def test_parse_serve_forms():
    model, flags = drift.parse_serve(["vllm", "serve", "/w", "--a", "1", "--b", "--c=x", "y"])
    assert model == "/w" and flags == [("--a", "1"), ("--b", None), ("--c", "x"), ("y", None)]
    assert drift.parse_serve(["python", "app.py"]) == (None, [])


def _marker(receipt, **over):
    m = {"format": "k3-verified/1", "algorithm": "k3-tree-v1",
         "tree_digest": receipt.model.tree_digest, "repo": receipt.model.repo,
         "revision": GOOD_REVISION, "files": 96}
    m.update(over)
    return m


def test_weights_marker_checks(receipt):
    lock = {"tree_digest": receipt.model.tree_digest, "revision": GOOD_REVISION}
    assert _failed(drift.weights_drift(_marker(receipt), lock, receipt,
                                       revision=GOOD_REVISION)) == []
    assert _failed(drift.weights_drift(None, lock, receipt, revision=GOOD_REVISION)) == [
        "verified marker"]
    other = "sha256:" + "1" * 64
    assert _failed(drift.weights_drift(_marker(receipt, tree_digest=other), lock, receipt,
                                       revision=GOOD_REVISION)) == [
        "marker digest vs lock", "digest vs receipt"]
    assert _failed(drift.weights_drift(_marker(receipt), lock, receipt,
                                       revision="f" * 40)) == ["revision"]
    custom_lock = {"tree_digest": other}
    assert _failed(drift.weights_drift(_marker(receipt, tree_digest=other), custom_lock, receipt,
                                       revision=GOOD_REVISION, profile="custom")) == []


# --- verify end to end on a recorded cluster ----------------------------------------------

def _run_archive(tmp_path, receipt, scale=1.0, tamper=False) -> str:
    """A benchmark run laid out as the Job writes it, archived as the reader streams it."""
    run = tmp_path / "pvc" / "20260729T120000Z-bench"
    run.mkdir(parents=True)
    m = receipt.measurement(8)
    w = receipt.workload_a
    sets = []
    for c in w.concurrencies:
        for role, n in (("warmup", w.warmup_requests), ("measured", w.measured_requests)):
            name = f"run1-c{c}-{role}"
            lat = ([v * scale for v in receipt_latencies_ms(m.p50_ms, m.p99_ms)]
                   if c == m.concurrency and role == "measured" else [9000.0 + i for i in range(n)])
            meta = {"k3_workload": WORKLOAD_ID, "k3_role": role, "k3_ignore_eos": "true"}
            data = result_dict(lat, concurrency=c, metadata=meta,
                               input_lens=[(w.prompt_tokens_min + w.prompt_tokens_max) // 2] * n,
                               output_len=w.output_tokens_max)
            (run / f"{name}.json").write_text(json.dumps(data))
            sets.append({"name": name, "role": role, "concurrency": c, "run": 1,
                         "result": f"{name}.json", "ok": True})
    pod_runner.write_evidence(run, {"run_id": run.name, "status": "complete", "sets": sets})
    if tamper:
        (run / "run1-c8-measured.json").write_text("{}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(run, arcname=run.name)
    return base64.b64encode(buf.getvalue()).decode()


class RecordedCluster:
    namespace = "k3"

    def __init__(self, sts, files, job, archive):
        self._sts, self._files, self._job, self._archive = sts, files, job, archive
        self.reader_pods = []

    def statefulset(self):
        return self._sts

    def read_file(self, pod, container, path):
        assert container == "vllm"
        return self._files.get((pod, path))

    def benchmark_job(self, selector=None):
        return self._job

    def exec_reader(self, pod_manifest, command):
        self.reader_pods.append(pod_manifest)
        assert command == kc.b.export_command()
        return self._archive


def _cluster(tmp_path, sts, receipt, marker=None, scale=1.0, tamper=False):
    job = manifest(render("existing", PIN, "benchmark.enabled=true"), "Job", "kimi-k3-bench")
    tree = drift.model_dir(sts)
    lock_path = WeightsLayout(receipt.model.repo, GOOD_REVISION).lock
    files = {("kimi-k3-0", f"{tree}/{MARKER_NAME}"): json.dumps(marker or _marker(receipt)),
             ("kimi-k3-0", lock_path): json.dumps({"tree_digest": receipt.model.tree_digest,
                                                   "revision": GOOD_REVISION})}
    return RecordedCluster(sts, files, job, _run_archive(tmp_path, receipt, scale, tamper))


def test_verify_passes_on_a_deployment_that_matches(tmp_path, sts, receipt):
    cl = _cluster(tmp_path, sts, receipt)
    rows = verify_rows(cl, receipt, fetch_dir=tmp_path / "fetched", tolerance_pct=10)
    assert _failed(rows) == []
    assert {r.area for r in rows} == {"statefulset", "weights", "benchmark"}
    assert any(r.area == "benchmark" and "c=8 p99" in r.check for r in rows)
    pod = cl.reader_pods[0]
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "kimi-k3-bench-results", "readOnly": True}
    assert (tmp_path / "fetched" / "20260729T120000Z-bench" / "SHA256SUMS").is_file()


def test_verify_reports_slow_results_and_a_bad_marker(tmp_path, sts, receipt):
    cl = _cluster(tmp_path, sts, receipt, scale=1.2,
                  marker=_marker(receipt, revision="e" * 40))
    failed = _failed(verify_rows(cl, receipt, fetch_dir=tmp_path / "f", tolerance_pct=10))
    assert "revision [kimi-k3-0]" in failed
    assert any(f.startswith("c=8 p50 e2el") for f in failed)


def test_verify_refuses_results_that_do_not_match_their_sums(tmp_path, sts, receipt):
    cl = _cluster(tmp_path, sts, receipt, tamper=True)
    rows = verify_rows(cl, receipt, fetch_dir=tmp_path / "f", tolerance_pct=10)
    bench = [r for r in rows if r.area == "benchmark"]
    assert len(bench) == 1 and not bench[0].ok and "SHA256SUMS" in bench[0].actual


def test_unpack_refuses_escaping_members(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"x"
        info = tarfile.TarInfo("../evil")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(kc.FetchError, match="refusing"):
        kc.unpack_run(base64.b64encode(buf.getvalue()).decode(), tmp_path)
    with pytest.raises(kc.FetchError, match="base64"):
        kc.unpack_run("not base64 !!", tmp_path)


def test_cli_without_a_cluster_says_so(tmp_path, capsys):
    rc = main(["verify", "--kubeconfig", str(tmp_path / "missing-kubeconfig")])
    assert rc == 2
    assert "kubeconfig" in capsys.readouterr().err


class PendingPodCluster(RecordedCluster):
    """The serving pod exists but never ran (no node yet, or crash-looping)."""

    def read_file(self, pod, container, path):
        from k3infra.live.cluster import ClusterError

        raise ClusterError(f"exec in pod {pod} in namespace k3: 400 pod {pod} does not "
                           "have a host assigned")


def test_verify_shows_the_statefulset_rows_when_the_pod_cannot_be_read(tmp_path, sts, receipt):
    """Found by the real API server: a Pending pod made verify exit 2 with no table,
    hiding a drifted serve flag - the likely reason the pod is not running."""
    args = _container(sts)["args"]
    args[args.index("--block-size") + 1] = "64"
    cl = PendingPodCluster(sts, {}, None, None)
    rows = verify_rows(cl, receipt, check_results=False, tolerance_pct=10)
    failed = {r.check: r.actual for r in rows if not r.ok}
    assert "--block-size 64" in failed["engine args (receipt order, after the model dir)"]
    assert "does not have a host assigned" in failed["verified marker [kimi-k3-0]"]
    assert set(failed) == {"engine args (receipt order, after the model dir)",
                           "verified marker [kimi-k3-0]"}


def test_a_refused_exec_shows_the_servers_message():
    from kubernetes.client.exceptions import ApiException

    from k3infra.live.cluster import _api_message

    body = ('{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
            '"message":"pod kimi-k3-0 does not have a host assigned","reason":"BadRequest",'
            '"code":400}')
    exc = ApiException(status=0, reason="Handshake status 400 Bad Request -+-+- "
                                        "{'audit-id': 'x'} -+-+- " + body)
    assert _api_message(exc) == "400 pod kimi-k3-0 does not have a host assigned"
    assert _api_message(ApiException(status=403, reason="Forbidden")) == "403 Forbidden"


def test_the_table_names_the_pod_of_a_weights_row():
    """Found in the real server's run: rich read "[kimi-k3-0]" as markup and dropped it."""
    import io

    from k3infra.cli.verify import print_rows
    from k3infra.display import console

    out = io.StringIO()
    print_rows([drift.DriftRow("weights", "verified marker [kimi-k3-0]", "present",
                               "cannot read: [x]", False)],
               console(file=out, width=200, color_system=None))
    assert "verified marker [kimi-k3-0]" in out.getvalue()
    assert "cannot read: [x]" in out.getvalue()


def test_an_api_server_that_does_not_answer_is_one_line(tmp_path, capsys):
    """verify and startup against a kubeconfig whose server refuses connections: one
    line naming the server, exit 2, no traceback (the node e2e's run found a traceback)."""
    import socket

    from k3infra.cli import main

    with socket.socket() as s:            # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    for argv in (["verify", "--no-results"], ["startup"]):
        assert main([*argv, "--kubeconfig", str(kubeconfig)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"the cluster's API server at https://127.0.0.1:{port} did not answer" in err
