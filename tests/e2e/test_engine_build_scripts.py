"""The in-cluster engine build's pod scripts, as rendered, run for real: the Job's
`build.sh` (both passes) drives real BuildKit (buildkitd and buildctl v0.23.2, the
release of the default k3:engine.buildkitImage, built from their Go module by
tools/testbed/buildkit) over a small recipe, pushes to a loopback registry, and the Job's
`report.py` writes the result into the rendered result ConfigMap on the real API server
with the rendered ServiceAccount's own token (its Role: get/patch on that one name).
Pulumi's reading of it (`parse_build_result`, `check_result_object`) then gives the
digest the registry holds. A broken recipe fails a pass with BuildKit's own lines, which
`build.sh` leaves for the report container.

Beside the test rather than in the Job (test_node_stack.py runs the Job itself on the
node, through `pulumi up`): buildkitd runs as root with Debian's runc, `BUILDCTL` is a
two-line wrapper that talks to it, and the failure cases run here because they take
seconds. The recipe is
tests/e2e/recipes/tiny-engine (the shape of images/Dockerfile; no CUDA base can be pulled
here). The registry speaks plain HTTP on the namespace's loopback, set in buildkitd's
own config.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from apiserver import _Processes, _tail
from build_job import broken_recipe, build_objects, pushed_repo_tag, recipe
from engine import testbed_bin  # noqa: F401  (fixture)
from node import NODE_IP_ENV, image_layout, wait_for
from registry import missing_tools, run_registry

from k3infra.engine import manifests as em
from k3infra.engine.result import check_result_object, parse_build_result

pytest_plugins = ["apiserver"]
pytestmark = [pytest.mark.e2e, pytest.mark.node]

BUILD_TIMEOUT_S = 600


def _missing(bin_dir: Path) -> str | None:
    if not os.environ.get(NODE_IP_ENV):
        return (f"{NODE_IP_ENV} is not set: this tier runs inside the network namespace "
                "tests/e2e/netns.sh makes (`make e2e`)")
    for name in ("buildkitd", "buildctl"):
        if not os.access(bin_dir / name, os.X_OK):
            return f"{bin_dir} lacks {name}: run tools/testbed/build.sh"
    if shutil.which("runc") is None:
        return "runc is not installed (.ci/run installs Debian's runc)"
    return missing_tools()


@pytest.fixture(scope="module")
def registry(testbed_bin, tmp_path_factory):  # noqa: F811
    reason = _missing(Path(testbed_bin))
    if reason:
        pytest.skip(reason)
    with run_registry(tmp_path_factory.mktemp("registry")) as reg:
        base = reg.push(image_layout("base"), "k3e2e/debian", "bookworm")
        yield reg, base


@pytest.fixture(scope="module")
def buildctl(testbed_bin, registry, tmp_path_factory):  # noqa: F811
    """buildkitd (root, OCI worker on Debian's runc), its state the test's; a `buildctl`
    wrapper for build.sh's BUILDCTL."""
    reg, _base = registry
    work = tmp_path_factory.mktemp("buildkit")
    sock = work / "buildkitd.sock"
    config = work / "buildkitd.toml"
    config.write_text(f'root = "{work / "root"}"\n'
                      f'[grpc]\n  address = ["unix://{sock}"]\n'
                      '[worker.oci]\n  enabled = true\n  binary = "runc"\n'
                      '[worker.containerd]\n  enabled = false\n'
                      f'[registry."{reg.address}"]\n  http = true\n')
    wrapper = work / "buildctl"
    buildctl_bin = Path(testbed_bin) / "buildctl"
    wrapper.write_text(f'#!/bin/sh\nexec {buildctl_bin} --addr unix://{sock} "$@"\n')
    wrapper.chmod(0o755)
    # Stopped whatever happens, and with the test run if it dies (the servers' helper).
    procs = _Processes(work)
    try:
        procs.start("buildkitd", [str(Path(testbed_bin) / "buildkitd"), "--config", str(config)])
        wait_for("buildkitd", lambda: procs.check_alive() or subprocess.run(
            [str(wrapper), "debug", "workers"], capture_output=True).returncode == 0,
            timeout=60, interval=0.5)
        version = subprocess.run([str(Path(testbed_bin) / "buildkitd"), "--version"],
                                 capture_output=True, text=True).stdout.strip()
        print(f"\n{version}; state in {work}")
        yield wrapper
    finally:
        procs.stop()
        print("buildkitd log (last lines):\n" + _tail(work / "buildkitd.log", 15))


def container(job: dict, name: str) -> dict:
    spec = job["spec"]["template"]["spec"]
    return next(c for c in spec["initContainers"] + spec["containers"] if c["name"] == name)


def env_of(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def unpack(configmap: dict, into: Path) -> Path:
    into.mkdir(parents=True)
    for key, text in configmap["data"].items():
        (into / key).write_text(text)
    return into


def run_build(objs: dict, buildctl: Path, work: Path, registry_address: str) -> subprocess.CompletedProcess:
    """The rendered build container's command and env, with its mount paths under work."""
    job_dir = unpack(objs["job-files"], work / "job")
    context = unpack(objs["context"], work / "context")
    auth = work / "auth"
    push = work / "registry-auth" / "config.json"
    push.parent.mkdir()
    push.write_text(json.dumps({"auths": {registry_address: {"auth": "azM6ZTJl"}}}))
    # The `auth` init container's command, as rendered, first.
    auth_c = container(objs["job"], "auth")
    argv = [a.replace(em.JOB_DIR, str(job_dir)).replace(em.AUTH_DIR, str(auth))
            .replace(em.REGISTRY_AUTH_DIR, str(push.parent)) for a in auth_c["command"]]
    auth.mkdir()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    build = container(objs["job"], "build")
    env = {**env_of(build), "K3_OUT": str(work / "out"), "DOCKER_CONFIG": str(auth),
           "K3_BUILD_ARGS_FILE": str(job_dir / em.BUILD_ARGS_KEY),
           "K3_CONTEXT_DIR": str(context), "BUILDCTL": str(buildctl),
           "PATH": os.environ["PATH"], "HOME": str(work)}
    command = [a.replace(em.JOB_DIR, str(job_dir)) for a in build["command"]]
    start = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    print(f"\n$ {' '.join(command)}    [exit {done.returncode}, {time.monotonic() - start:.1f} s]")
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("k3-engine:") or "ERROR" in line or "error" in line:
            print(f"    {line}")
    return done


def test_build_pushes_and_report_writes_the_digest_pulumi_reads(registry, buildctl, cluster,
                                                                 tmp_path):
    from kubernetes import client, utils

    reg, base = registry
    plan, names, objs = build_objects(reg.address, base, recipe(), apiServerCidrs=["127.0.0.1/32"])
    done = run_build(objs, buildctl, tmp_path, reg.address)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    log = done.stdout + done.stderr
    assert "k3-engine: pass 1 (wheel)" in log and "k3-engine: pass 2 (runtime image)" in log
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    pushed = reg.manifest_digest(*pushed_repo_tag(plan))
    print(f"pushed {plan.tagged_ref}: {pushed} (BuildKit metadata "
          f"{metadata['containerimage.digest']})")
    assert metadata["containerimage.digest"] == pushed

    # The result ConfigMap and the Job's RBAC, as rendered, on the real API server.
    with cluster.api_client() as api_client:
        for role in ("namespace", "service-account", "role", "role-binding", "result"):
            utils.create_from_dict(api_client, objs[role])
        core = client.CoreV1Api(api_client)
        created = core.read_namespaced_config_map(names.result_configmap, names.namespace)
        token = core.create_namespaced_service_account_token(
            names.service_account, names.namespace,
            client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
                audiences=[], expiration_seconds=3600))).status.token
        token_dir = tmp_path / "token"
        token_dir.mkdir()
        (token_dir / "token").write_text(token)
        shutil.copy(cluster.workdir / "pki" / "ca.crt", token_dir / "ca.crt")
        report_c = container(objs["job"], "report")
        env = {**env_of(report_c), "K3_NAMESPACE": names.namespace, "K3_API": cluster.server,
               "K3_OUT": str(tmp_path / "out"), "K3_TOKEN_DIR": str(token_dir),
               "PATH": os.environ["PATH"]}
        job_dir = tmp_path / "job"
        argv = [a.replace(em.JOB_DIR, str(job_dir)) for a in report_c["command"]]
        argv[0] = shutil.which("python3")
        first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        print(f"report: exit {first.returncode}: {(first.stdout + first.stderr).strip()}")
        assert first.returncode == 0
        back = core.read_namespaced_config_map(names.result_configmap, names.namespace)
        check_result_object(back.immutable, back.metadata.uid, created.metadata.uid,
                            names.result_configmap)
        result = parse_build_result(back.data, plan)
        assert result.image == f"{plan.repository}@{pushed}"
        record = json.loads((tmp_path / "out" / "wheel" / "engine-wheel.json").read_text())
        assert result.wheel_sha256 == record["sha256"]
        # Written once: a report of another digest (a re-run Job) is refused by the API
        # server, and the ConfigMap keeps the first.
        other_out = tmp_path / "other-out"
        shutil.copytree(tmp_path / "out", other_out)
        (other_out / "metadata.json").write_text(json.dumps(
            {**metadata, "containerimage.digest": "sha256:" + "e" * 64}))
        again = subprocess.run(argv, env={**env, "K3_OUT": str(other_out)}, capture_output=True,
                               text=True, timeout=120)
        print(f"a second report of another digest: exit {again.returncode}: "
              f"{again.stderr.strip()[-300:]}")
        assert again.returncode == 1 and "HTTP 422" in again.stderr
        assert core.read_namespaced_config_map(names.result_configmap,
                                               names.namespace).data == back.data
        # The token may write no other ConfigMap (the Role names one).
        env_other = {**env, "K3_RESULT_CONFIGMAP": "kimi-k3-something-else"}
        other = subprocess.run(argv, env=env_other, capture_output=True, text=True, timeout=120)
        assert other.returncode == 1 and "HTTP 403" in other.stderr


def test_a_broken_recipe_fails_the_build_with_buildkits_lines(registry, buildctl, tmp_path):
    reg, base = registry
    broken = broken_recipe()
    _plan, _names, objs = build_objects(reg.address, base, broken, apiServerCidrs=["127.0.0.1/32"])
    done = run_build(objs, buildctl, tmp_path, reg.address)
    log = done.stdout + done.stderr
    # build.sh records the failure for the report container (which fails the Job).
    assert done.returncode == 0
    assert "k3 e2e: a broken step" in log and "exit code: 3" in log
    assert "pass 2" not in log and not (tmp_path / "out" / "metadata.json").exists()
    failed = (tmp_path / "out" / "build.failed").read_text()
    assert "k3 e2e: a broken step" in failed and "exit code: 3" in failed
