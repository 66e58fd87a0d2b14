"""The in-cluster build: its manifests against real Kubernetes schemas (strict), its
pod script run with a stand-in `buildctl-daemonless.sh`, and the report container's
script against a loopback API server."""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from pathlib import Path

import kubernetes_validate
import pytest

from k3infra import checkov_skips

from k3infra.config import parse_stack_config
from k3infra.receipt import load_receipt
from k3infra.engine import component as ec
from k3infra.engine import manifests as em
from k3infra.engine.plan import build_namespace, resolve_engine
from k3infra.engine.pod import report
from k3infra.placement import GPU_PRODUCT_LABEL

from conftest import GOOD_REVISION, ROOT

REPO = "registry.example.com/k3/vllm"
K8S_VERSIONS = ["1.33.0", kubernetes_validate.utils.latest_version()]
POD = ROOT / "k3infra" / "engine" / "pod"


CACHE_REPO = "registry.example.com/k3/vllm-buildcache"
API_SERVER = "10.0.0.10/32"


def cfg(**engine):
    return parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "k", "namespace": "k3", "engine": {
        "build": "in-cluster", "registry": REPO, "registrySecret": "push",
        "cacheRegistry": CACHE_REPO, "cacheRegistrySecret": "cache-push",
        "apiServerCidrs": [API_SERVER], **engine}}, receipt=load_receipt())


def objects(c=None, receipt=None):
    from k3infra.receipt import load_receipt

    c = c or cfg()
    plan = resolve_engine(receipt or load_receipt(), c)
    context = ec.recipe_files(ROOT / "images") if c.engine.context == "configmap" else {}
    scripts = ec.job_files()
    names = em.BuildNames("kimi-k3", build_namespace(c), em.build_hash(plan, c, context, scripts))
    labels = {"app.kubernetes.io/name": "kimi-k3", "app.kubernetes.io/component": "engine-build"}
    return plan, names, em.build_manifests(plan, c, names, labels, context, scripts)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("engine", [{}, {"context": "git", "gitUrl": "https://git.example.com/k.git",
                                         "gitRevision": "a" * 40, "sccacheSecret": "sccache",
                                         "buildNodeSelector": {"pool": "cpu-build"}},
                                    {"buildIsolation": "runtime-class", "buildRuntimeClass": "gvisor",
                                     "cacheRegistry": None, "cacheRegistrySecret": None}])
def test_build_objects_validate_strictly(version, engine):
    _, _, objs = objects(cfg(**engine))
    for obj in objs.values():
        kubernetes_validate.validate(obj, version, strict=True)


def test_build_runs_in_its_own_privileged_namespace():
    _, names, objs = objects()
    assert names.namespace == "k3-build"
    ns = objs["namespace"]
    assert ns["metadata"]["name"] == "k3-build"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for role, obj in objs.items():
        if role != "namespace":
            assert obj["metadata"]["namespace"] == "k3-build", role
    assert build_namespace(cfg(buildNamespace="ci-builds")) == "ci-builds"


def test_build_namespace_must_not_be_the_serving_namespace():
    from k3infra.config import ConfigError

    with pytest.raises(ConfigError) as err:
        build_namespace(cfg(buildNamespace="k3"))
    assert err.value.key == "k3:engine.buildNamespace"


def job_spec(c=None):
    plan, names, objs = objects(c)
    return plan, names, objs["job"]


def test_job_runs_rootless_buildkit_then_report_off_gpu_nodes():
    plan, names, job = job_spec()
    spec = job["spec"]["template"]["spec"]
    auth, build = spec["initContainers"]
    (rep,) = spec["containers"]
    assert auth["image"] == rep["image"] and auth["securityContext"] == rep["securityContext"]
    assert build["image"].startswith("moby/buildkit:v0.23.2-rootless@sha256:")
    assert rep["image"].startswith("python:3.12.11-slim-bookworm@sha256:")
    assert build["command"] == ["/bin/sh", f"{em.JOB_DIR}/build.sh"]
    assert build["securityContext"]["runAsNonRoot"] and build["securityContext"]["runAsUser"] == 1000
    assert {"name": "BUILDKITD_FLAGS", "value": "--oci-worker-no-process-sandbox"} in build["env"]
    assert rep["command"] == ["python3", f"{em.JOB_DIR}/report.py"]
    assert rep["securityContext"]["readOnlyRootFilesystem"] is True
    assert rep["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert job["spec"]["backoffLimit"] == 0
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": GPU_PRODUCT_LABEL, "operator": "DoesNotExist"}]
    assert "nvidia.com/gpu" not in json.dumps(build["resources"])


def test_job_resources_are_the_build_node_the_parallelism_was_sized_for():
    c = cfg(buildCpu=48, buildMemoryGi=192)
    plan, _, job = job_spec(c)
    _, build = job["spec"]["template"]["spec"]["initContainers"]
    assert build["resources"]["requests"]["cpu"] == "48"
    assert build["resources"]["limits"]["memory"] == "192Gi"
    assert plan.build_args["MAX_JOBS"] == str((192 - 8) // 5)


def test_registry_credentials_come_from_the_secret_and_only_report_gets_a_token():
    _, names, job = job_spec()
    spec = job["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["registry-auth"]["secret"]["secretName"] == "push"
    assert vols["registry-auth"]["secret"]["items"] == [{"key": ".dockerconfigjson",
                                                         "path": "config.json"}]
    assert vols["cache-auth"]["secret"]["secretName"] == "cache-push"
    assert spec["automountServiceAccountToken"] is False
    auth, build = spec["initContainers"]
    rep = spec["containers"][0]
    assert "token" not in {m["name"] for m in build["volumeMounts"]}
    # BuildKit sees one merged Docker config (memory-backed), never the Secrets' volumes.
    assert {m["name"] for m in build["volumeMounts"]} & {"registry-auth", "cache-auth"} == set()
    assert {"name": "DOCKER_CONFIG", "value": em.AUTH_DIR} in build["env"]
    assert auth["command"] == ["python3", f"{em.JOB_DIR}/auth.py", em.AUTH_DIR,
                               f"{em.REGISTRY_AUTH_DIR}/config.json",
                               f"{em.CACHE_AUTH_DIR}/config.json"]
    assert vols["auth"]["emptyDir"]["medium"] == "Memory"
    assert {"name": "token", "mountPath": em.TOKEN_DIR, "readOnly": True} in rep["volumeMounts"]


def test_network_policy_selects_the_build_pod_and_allows_no_ingress():
    plan, names, objs = objects(cfg(registry="registry.example.com:5000/k3/vllm"))
    pol = objs["network-policy"]["spec"]
    assert pol["podSelector"]["matchLabels"] == objs["job"]["spec"]["template"]["metadata"]["labels"]
    assert pol["ingress"] == []
    ports = {p["port"] for rule in pol["egress"] for p in rule.get("ports", [])}
    assert {53, 80, 443, 6443, 5000} <= ports


def test_the_builds_listed_cidrs_never_reach_instance_metadata():
    """Issue 48: k3:engine.apiServerCidrs / registryCidrs took their CIDRs as typed, so a
    wide one (a registry anywhere: 0.0.0.0/0) opened 169.254.169.254 to untrusted code."""
    _, _, objs = objects(cfg(apiServerCidrs=["0.0.0.0/0"], registryCidrs=["169.0.0.0/8", "::/0"]))
    _, _, api_server, registry = objs["network-policy"]["spec"]["egress"]
    assert api_server["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}}]
    assert registry["to"] == [{"ipBlock": {"cidr": "169.0.0.0/8", "except": ["169.254.0.0/16"]}},
                              {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}}]


def test_build_egress_never_reaches_the_cluster_or_instance_metadata():
    """Issue 21: the build Job ran untrusted code with egress to 0.0.0.0/0 on 80/443/6443
    (IMDS and in-cluster services included)."""
    _, _, objs = objects(cfg(registryCidrs=["10.20.0.5/32"]))
    dns, internet, api_server, registry = objs["network-policy"]["spec"]["egress"]
    assert internet["to"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12",
                                                     "192.168.0.0/16", "100.64.0.0/10",
                                                     "169.254.0.0/16"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}}]
    assert {p["port"] for p in internet["ports"]} == {80, 443}
    assert api_server == {"to": [{"ipBlock": {"cidr": API_SERVER}}],
                          "ports": [{"port": 443, "protocol": "TCP"},
                                    {"port": 6443, "protocol": "TCP"}]}
    assert registry["to"] == [{"ipBlock": {"cidr": "10.20.0.5/32"}}]
    deny = objs["default-deny"]
    assert deny["metadata"]["namespace"] == "k3-build"
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                            "ingress": [], "egress": []}


def test_build_runs_only_on_its_own_tainted_pool_or_in_a_sandbox_runtime():
    _, _, job = job_spec(cfg(buildNodeSelector={"pool": "cpu-build"}))
    spec = job["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"k3infra.dev/engine-build": "true", "pool": "cpu-build"}
    assert spec["tolerations"] == [{"key": "k3infra.dev/engine-build", "operator": "Equal",
                                    "value": "true", "effect": "NoSchedule"}]
    assert "runtimeClassName" not in spec
    _, _, job = job_spec(cfg(buildIsolation="runtime-class", buildRuntimeClass="gvisor"))
    spec = job["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "gvisor" and "tolerations" not in spec


@pytest.mark.parametrize("engine, key", [
    ({"buildIsolation": "runtime-class"}, "k3:engine.buildRuntimeClass"),
    ({"buildRuntimeClass": "gvisor"}, "k3:engine.buildRuntimeClass"),
    ({"cacheRegistry": REPO}, "k3:engine.cacheRegistry"),
    ({"cacheRegistrySecret": None}, "k3:engine.cacheRegistrySecret"),
    ({"cacheRegistrySecret": "push"}, "k3:engine.cacheRegistrySecret"),
    ({"cacheRegistry": None}, "k3:engine.cacheRegistrySecret"),
])
def test_isolation_and_cache_keys_that_do_not_fit_are_refused(engine, key):
    from k3infra.config import ConfigError
    from k3infra.receipt import load_receipt

    with pytest.raises(ConfigError) as err:
        resolve_engine(load_receipt(), cfg(**engine))
    assert err.value.key == key


def test_job_carries_the_documented_checkov_skips():
    _, _, job = job_spec()
    notes = job["metadata"]["annotations"]
    skipped = {v.split("=", 1)[0] for k, v in notes.items() if k.startswith("checkov.io/skip")}
    assert skipped == {s.check for s in checkov_skips.BUILDKIT_SKIPS}
    doc = (ROOT / "docs" / "engine.md").read_text()
    for s in checkov_skips.BUILDKIT_SKIPS:
        assert s.check in doc, s.check


def test_role_may_only_write_this_builds_result():
    _, names, objs = objects()
    (rule,) = objs["role"]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": [names.result_configmap], "verbs": ["get", "patch"]}
    assert objs["service-account"]["automountServiceAccountToken"] is False


def test_build_args_reach_the_job_as_lines():
    plan, _, objs = objects()
    lines = objs["job-files"]["data"][em.BUILD_ARGS_KEY].splitlines()
    assert lines == [f"{k}={v}" for k, v in plan.build_args.items()]


def test_build_hash_changes_with_the_recipe_and_not_otherwise():
    plan, names, _ = objects()
    c = cfg()
    context = ec.recipe_files(ROOT / "images")
    scripts = ec.job_files()
    again = em.build_hash(plan, c, context, scripts)
    assert again == names.build_hash
    edited = {**context, "Dockerfile": context["Dockerfile"] + "\n# changed\n"}
    assert em.build_hash(plan, c, edited, scripts) != again
    assert em.build_hash(plan, cfg(buildCpu=64), context, scripts) != again


def fake_buildctl(tmp_path: Path, digest: str = "sha256:" + "ef" * 32) -> Path:
    """Stands in for buildctl-daemonless.sh: logs its arguments; pass 1 writes the wheel
    record into the local export, pass 2 writes BuildKit's metadata file."""
    script = tmp_path / "buildctl"
    script.write_text(f"""#!/bin/sh
echo "$@" >> "{tmp_path}/calls"
dest=""; meta=""
while [ $# -gt 0 ]; do
  case "$1" in
    --output) case "$2" in type=local,dest=*) dest="${{2#type=local,dest=}}";; esac; shift;;
    --metadata-file) meta="$2"; shift;;
  esac
  shift
done
if [ -n "$dest" ]; then
  printf 'WHEEL_FILE=vllm.whl\\nWHEEL_SHA256=%s\\nENGINE_COMMIT_FULL=%s\\nENGINE_VERSION=v\\n' \\
    "$FAKE_SHA" "$FAKE_COMMIT" > "$dest/engine-wheel.env"
fi
if [ -n "$meta" ]; then
  printf '{{"containerimage.digest": "{digest}"}}' > "$meta"
fi
""")
    script.chmod(0o755)
    return script


def configmap_volume(tmp_path: Path) -> Path:
    """The layout the kubelet gives a ConfigMap volume: each key a link into ..data."""
    vol = tmp_path / "ctx"
    data = vol / "..2026_12_02_00_00_00.0"
    data.mkdir(parents=True)
    for name in ("Dockerfile", "build.lock"):
        (data / name).write_text(f"{name}\n")
        (vol / name).symlink_to(f"..data/{name}")
    (vol / "..data").symlink_to(data.name)
    return vol


def run_build_sh(tmp_path: Path, context: str = "local", sha: str = "ab" * 32,
                 args: str | None = None, c=None) -> subprocess.CompletedProcess:
    plan, _, objs = objects(c)
    args_file = tmp_path / "build-args"
    args_file.write_text(objs["job-files"]["data"][em.BUILD_ARGS_KEY] if args is None else args)
    env = {"PATH": os.environ["PATH"], "BUILDCTL": str(fake_buildctl(tmp_path)),
           "K3_CONTEXT": context, "K3_IMAGE": plan.tagged_ref, "K3_CACHE": plan.cache_ref or "",
           "K3_BUILD_ARGS_FILE": str(args_file), "K3_OUT": str(tmp_path / "out"),
           "K3_CONTEXT_DIR": str(configmap_volume(tmp_path)), "FAKE_SHA": sha,
           "FAKE_COMMIT": "f" * 40}
    return subprocess.run(["sh", str(POD / "build.sh")], env=env, capture_output=True, text=True)


def test_build_sh_runs_both_passes_with_the_wheel_hash_as_label_args(tmp_path):
    r = run_build_sh(tmp_path)
    assert r.returncode == 0, r.stderr
    plan, _, _ = objects()
    pass1, pass2 = (tmp_path / "calls").read_text().splitlines()
    # BuildKit reads a plain copy of the ConfigMap volume: its keys, no links, no ..data.
    ctx = tmp_path / "out" / "context"
    assert sorted(p.name for p in ctx.iterdir()) == ["Dockerfile", "build.lock"]
    assert not any(p.is_symlink() for p in ctx.iterdir())
    assert (ctx / "build.lock").read_text() == "build.lock\n"
    for call in (pass1, pass2):
        assert call.startswith(f"build --frontend dockerfile.v0 --local context={ctx} "
                               f"--local dockerfile={ctx}")
        for key, value in plan.build_args.items():
            assert f"--opt build-arg:{key}={value}" in call
        assert f"--import-cache type=registry,ref={plan.cache_ref}" in call
    assert "--opt target=wheel-export" in pass1
    assert f"--output type=local,dest={tmp_path}/out/wheel" in pass1
    assert "--opt target=runtime" in pass2
    assert f"--opt build-arg:WHEEL_SHA256={'ab' * 32}" in pass2
    assert f"--opt build-arg:ENGINE_COMMIT_FULL={'f' * 40}" in pass2
    assert f"--output type=image,name={plan.tagged_ref},push=true" in pass2
    assert f"--export-cache type=registry,ref={plan.cache_ref},mode=max,ignore-error=true" in pass2
    assert json.loads((tmp_path / "out" / "metadata.json").read_text())["containerimage.digest"]


def test_build_sh_without_a_cache_repository_uses_no_registry_cache(tmp_path):
    r = run_build_sh(tmp_path, c=cfg(cacheRegistry=None, cacheRegistrySecret=None))
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "calls").read_text()
    assert "--import-cache" not in calls and "--export-cache" not in calls
    assert CACHE_REPO not in calls and f"{REPO}:buildcache" not in calls


def test_build_sh_git_context(tmp_path):
    r = run_build_sh(tmp_path, context="https://git.example.com/k.git#" + "a" * 40 + ":images")
    assert r.returncode == 0, r.stderr
    call = (tmp_path / "calls").read_text().splitlines()[0]
    assert "--opt context=https://git.example.com/k.git#" in call and "--local" not in call


def test_build_sh_stops_on_a_bad_wheel_hash_before_pass_two(tmp_path):
    """A failed pass: no pass 2, no success marker, the log's last lines for `report`
    (build.sh itself exits 0 so that the report container can fail the Job with them)."""
    r = run_build_sh(tmp_path, sha="not-a-hash")
    assert r.returncode == 0, r.stderr
    assert "bad WHEEL_SHA256" in r.stdout
    assert len((tmp_path / "calls").read_text().splitlines()) == 1
    out = tmp_path / "out"
    assert not (out / "build.ok").exists() and not (out / "metadata.json").exists()
    failed = (out / "build.failed").read_text()
    assert "k3-engine: pass 1 (wheel) for" in failed
    assert failed.rstrip().endswith("k3-engine: bad WHEEL_SHA256 'not-a-hash'")


def test_build_sh_marks_a_build_whose_passes_all_ran(tmp_path):
    r = run_build_sh(tmp_path)
    out = tmp_path / "out"
    assert r.returncode == 0 and (out / "build.ok").exists() and not (out / "build.failed").exists()
    assert "k3-engine: pass 2 took" in (out / "build.log").read_text()


def test_build_sh_refuses_empty_build_args(tmp_path):
    r = run_build_sh(tmp_path, args="# nothing\n")
    assert r.returncode == 2 and "no build args" in r.stderr


class FakeApi(http.server.BaseHTTPRequestHandler):
    """Just enough of the Kubernetes API for one ConfigMap: PATCH (merge) and GET."""

    store: dict = {}
    seen: list = []

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PATCH(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("PATCH", self.path, self.headers["Authorization"],
                          self.headers["Content-Type"]))
        if self.path not in self.store:
            return self._send(404, {"reason": "NotFound"})
        obj = self.store[self.path]
        if obj.get("immutable"):       # what the API server does to an immutable ConfigMap
            return self._send(422, {"reason": "Invalid", "message": "field is immutable"})
        obj.setdefault("data", {}).update(body["data"])
        if "immutable" in body:
            obj["immutable"] = body["immutable"]
        self._send(200, obj)

    def do_GET(self):  # noqa: N802
        self.seen.append(("GET", self.path, self.headers["Authorization"], None))
        if self.path not in self.store:
            return self._send(404, {"reason": "NotFound"})
        self._send(200, self.store[self.path])

    def log_message(self, *a):
        pass


@pytest.fixture
def api():
    FakeApi.store = {"/api/v1/namespaces/k3/configmaps/result": {"data": {}}}
    FakeApi.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def out_dir(tmp_path: Path, digest="sha256:" + "ef" * 32, sha="ab" * 32, commit="f" * 40):
    (tmp_path / "wheel").mkdir()
    (tmp_path / "metadata.json").write_text(json.dumps({"containerimage.digest": digest}))
    (tmp_path / "wheel" / "engine-wheel.json").write_text(json.dumps(
        {"sha256": sha, "engine_commit": commit, "version": "0.1.0", "wheel": "vllm.whl"}))
    return tmp_path


def test_report_writes_the_result_and_reads_it_back(api, tmp_path):
    data = report.report(out_dir(tmp_path), api, "k3", "result", REPO, "tok", None)
    assert data["image"] == f"{REPO}@sha256:{'ef' * 32}"
    stored = FakeApi.store["/api/v1/namespaces/k3/configmaps/result"]["data"]
    assert stored == data
    assert FakeApi.seen[0] == ("PATCH", "/api/v1/namespaces/k3/configmaps/result",
                               "Bearer tok", "application/merge-patch+json")


def test_report_writes_the_result_once_and_makes_it_immutable(api, tmp_path):
    """Issue 21: the result ConfigMap decides the served digest; after the Job's write
    nobody, the Job included, can change its data."""
    report.report(out_dir(tmp_path), api, "k3", "result", REPO, "tok", None)
    assert FakeApi.store["/api/v1/namespaces/k3/configmaps/result"]["immutable"] is True
    again = tmp_path / "again"
    again.mkdir()
    with pytest.raises(report.ReportError, match="HTTP 422"):
        report.report(out_dir(again, digest="sha256:" + "66" * 32), api, "k3",
                      "result", REPO, "tok", None)


def test_auth_merges_the_push_and_cache_credentials_and_refuses_a_shared_host(tmp_path):
    from k3infra.engine.pod import auth

    push = tmp_path / "push.json"
    cache = tmp_path / "cache.json"
    push.write_text(json.dumps({"auths": {"registry.example.com": {"auth": "cHVzaA=="}}}))
    cache.write_text(json.dumps({"auths": {"cache.example.com": {"auth": "Y2FjaGU="}}}))
    out = tmp_path / "out"
    out.mkdir()
    assert auth.main([str(out), str(push), str(cache)]) == 0
    merged = json.loads((out / "config.json").read_text())
    assert set(merged["auths"]) == {"registry.example.com", "cache.example.com"}
    cache.write_text(json.dumps({"auths": {"registry.example.com": {"auth": "Y2FjaGU="}}}))
    (out / "config.json").unlink()
    assert auth.main([str(out), str(push), str(cache)]) == 1
    assert not (out / "config.json").exists()


def test_report_main_exit_codes(api, tmp_path, monkeypatch):
    token = tmp_path / "sa"
    token.mkdir()
    (token / "token").write_text("tok\n")
    out = tmp_path / "out"
    out.mkdir()
    env = {"K3_API": api, "K3_OUT": str(out_dir(out)),
           "K3_NAMESPACE": "k3", "K3_RESULT_CONFIGMAP": "result", "K3_REPOSITORY": REPO,
           "K3_TOKEN_DIR": str(token)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert report.main() == 0
    monkeypatch.setenv("K3_RESULT_CONFIGMAP", "missing")       # RBAC / name mistakes: 4xx
    assert report.main() == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"digest": ""}, "no image digest"),
    ({"sha": "x"}, "no sha256"),
    ({"commit": "f68f4fdd"}, "no full engine commit"),
])
def test_report_refuses_incomplete_build_output(api, tmp_path, kwargs, message):
    with pytest.raises(report.ReportError, match=message):
        report.report(out_dir(tmp_path, **kwargs), api, "k3", "result", REPO, "tok", None)
    assert FakeApi.store["/api/v1/namespaces/k3/configmaps/result"]["data"] == {}


def test_the_e2e_buildkit_is_the_default_images_release():
    """tools/testbed/buildkit (the BuildKit `make e2e` runs build.sh with) is the release of
    the default k3:engine.buildkitImage, so what the e2e tier proves holds for that image."""
    import re

    from k3infra.config.models import EngineConfig

    default = EngineConfig.model_fields["buildkit_image"].default
    tag = re.match(r"moby/buildkit:(v[0-9.]+)-rootless@sha256:", default)
    assert tag, default
    gomod = (ROOT / "tools/testbed/buildkit/go.mod").read_text()
    assert f"github.com/moby/buildkit {tag.group(1)} " in gomod


def test_report_fails_a_failed_build_with_its_last_lines_and_writes_nothing(api, tmp_path,
                                                                           monkeypatch, capsys):
    """build.sh's build.failed: report exits 1 before any API call, printing the newest
    lines within the kubelet's 2048-byte termination message (the rendered policy is
    FallbackToLogsOnError, so they are what `pulumi up` shows)."""
    out = tmp_path / "out"
    out.mkdir()
    lines = [f"#7 {i} " + "x" * 120 for i in range(40)] + [
        "error: failed to solve: process \"/bin/sh -c " + "y" * 2000 +
        "\" did not complete successfully: exit code: 3"]
    (out / "build.failed").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("K3_OUT", str(out))
    assert report.main() == 1
    err = capsys.readouterr().err
    assert err.startswith("k3-engine report: the build failed; its last lines:\n")
    assert err.rstrip().endswith("exit code: 3")
    assert len(err.encode()) < 2048 and "#7 39 " in err and "#7 0 " not in err
    assert FakeApi.seen == []
    _, _, objs = objects()
    rep = next(c for c in objs["job"]["spec"]["template"]["spec"]["containers"]
               if c["name"] == "report")
    assert rep["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_plain_http_registries_reach_buildkitd_through_its_config_file():
    """k3:engine.plainHttpRegistries: a buildkitd.toml in the job ConfigMap, passed with
    --config; without the key neither exists and the build's names are unchanged."""
    _, names, objs = objects(cfg(plainHttpRegistries=["10.0.0.5:5000", "registry.lan"]))
    data = objs["job-files"]["data"]
    assert data["buildkitd.toml"] == ('[registry."10.0.0.5:5000"]\n  http = true\n'
                                      '[registry."registry.lan"]\n  http = true\n')
    build = next(c for c in objs["job"]["spec"]["template"]["spec"]["initContainers"]
                 if c["name"] == "build")
    env = {e["name"]: e["value"] for e in build["env"] if "value" in e}
    assert env["BUILDKITD_FLAGS"] == ("--oci-worker-no-process-sandbox "
                                      "--config=/k3/job/buildkitd.toml")
    _, plain_names, plain = objects()
    assert "buildkitd.toml" not in plain["job-files"]["data"]
    build = next(c for c in plain["job"]["spec"]["template"]["spec"]["initContainers"]
                 if c["name"] == "build")
    assert {e["name"]: e.get("value") for e in build["env"]}["BUILDKITD_FLAGS"] == \
        "--oci-worker-no-process-sandbox"
    assert names.build_hash != plain_names.build_hash
