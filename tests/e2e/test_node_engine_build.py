"""The in-cluster engine build Job, as rendered, run on the node: rootless BuildKit (the
project's `buildkit` image: Debian's runc and uidmap, buildkitd/buildctl/rootlesskit
v0.23.2 from their Go modules, in the layout of moby/buildkit:v0.23.2-rootless) runs the
Job's `build.sh` (both passes) over a small recipe, pushes to a registry on the node's
address, and the `report` container writes the digest into the result ConfigMap through
the API server with the Job's own ServiceAccount; Pulumi's checks then accept it.

What the test changes, and why (the rest is applied as rendered, in the stack's order):
- the node: its `nvidia.com/gpu.product` label is removed (the Job keeps off GPU nodes and
  this cluster has one node) and it gets the build pool's label (what a user gives their
  CPU build nodes); the pool's taint is not set (the toleration is what is rendered);
- the build container's CPU request and limit are lowered to 1 (k3:engine.buildCpu's
  minimum is 4; this machine has 2 cores);
- a ConfigMap with buildkitd.toml is mounted at ~/.config/buildkit: the registry here
  speaks plain HTTP, and BuildKit needs to be told (a real registry has TLS).
The recipe is tests/e2e/recipes/tiny-engine (the shape of images/Dockerfile on the Debian
base image: no CUDA image can be pulled here). NetworkPolicies are applied but not
enforced (the bridge CNI has none). `pulumi up`'s wait for the Job is not exercised here.
"""
from __future__ import annotations

import base64
import json
import time

import pytest

from build_job import build_objects, pushed_repo_tag, recipe
from node import image_layout, node_fixture, wait_for
from registry import run_registry

from k3infra.engine import manifests as em
from k3infra.engine.result import check_result_object, parse_build_result
from k3infra.placement import BUILD_NODE_KEY, GPU_PRODUCT_LABEL

pytest_plugins = ["apiserver"]
pytestmark = [pytest.mark.e2e, pytest.mark.node]

PRODUCT = "K3E2E-BUILD"
JOB_TIMEOUT_S = 600

node = node_fixture(PRODUCT, images=("buildkit", "engine-cpu"))


@pytest.fixture(scope="module")
def pod_registry(node, tmp_path_factory):
    """A registry the pods reach (the node's address), with the recipe's base image."""
    with run_registry(tmp_path_factory.mktemp("pod-registry"), host=node.ip) as reg:
        yield reg, reg.push(image_layout("base"), "k3e2e/debian", "bookworm")


def adapt(job: dict, config_map: str) -> None:
    """The test's changes to the rendered Job (the module docstring says why)."""
    spec = job["spec"]["template"]["spec"]
    build = next(c for c in spec["initContainers"] if c["name"] == "build")
    for section in ("requests", "limits"):
        build["resources"][section]["cpu"] = "1"
    build["volumeMounts"].append({"name": "buildkitd-config", "readOnly": True,
                                  "mountPath": f"{em.BUILDKIT_HOME}/.config/buildkit"})
    spec["volumes"].append({"name": "buildkitd-config", "configMap": {"name": config_map}})


def job_state(batch, name: str, ns: str) -> str | None:
    job = batch.read_namespaced_job(name, ns)
    for cond in job.status.conditions or []:
        if cond.status == "True" and cond.type in ("Complete", "Failed"):
            return cond.type
    return None


def test_the_rendered_build_job_builds_pushes_and_reports(node, pod_registry):
    from kubernetes import client, utils

    reg, base = pod_registry
    plan, names, objs = build_objects(
        reg.address, base, recipe(), apiServerCidrs=[f"{node.ip}/32"],
        buildkitImage=node.images["buildkit"], reporterImage=node.images["engine-cpu"],
        buildDiskGi=50, buildMemoryGi=16, buildTimeoutMinutes=30)
    ns = names.namespace
    with node.cluster.api_client() as api_client:
        core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
        core.patch_node(node.name, {"metadata": {"labels": {GPU_PRODUCT_LABEL: None,
                                                             BUILD_NODE_KEY: "true"}}})
        utils.create_from_dict(api_client, objs["namespace"])
        auth = base64.b64encode(b"k3e2e:push").decode()
        core.create_namespaced_secret(ns, client.V1Secret(
            metadata=client.V1ObjectMeta(name="push"), type="kubernetes.io/dockerconfigjson",
            data={".dockerconfigjson": base64.b64encode(json.dumps(
                {"auths": {reg.address: {"auth": auth}}}).encode()).decode()}))
        core.create_namespaced_config_map(ns, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="buildkitd-config"),
            data={"buildkitd.toml": f'[registry."{reg.address}"]\n  http = true\n'}))
        adapt(objs["job"], "buildkitd-config")
        for role, obj in objs.items():
            if role == "namespace":
                continue
            # NetworkPolicy warnings and Pod Security `warn: restricted` come back as
            # warnings, printed; a refusal raises.
            utils.create_from_dict(api_client, obj)
        created = core.read_namespaced_config_map(names.result_configmap, ns)
        start = time.monotonic()
        try:
            state = wait_for("the build Job to finish", lambda: job_state(batch, names.job, ns),
                             timeout=JOB_TIMEOUT_S, interval=3)
        finally:
            for pod in core.list_namespaced_pod(ns, label_selector=f"job-name={names.job}").items:
                for c in ("auth", "build", "report"):
                    try:
                        log = core.read_namespaced_pod_log(pod.metadata.name, ns, container=c)
                    except client.ApiException as exc:
                        log = f"(no log: {exc.reason})"
                    lines = [x for x in log.splitlines() if x.startswith("k3-engine")
                             or "error" in x.lower()] if c == "build" else log.splitlines()
                    print(f"\n{pod.metadata.name} [{c}]:\n    " + "\n    ".join(lines[-20:]))
        print(f"\nJob {names.job}: {state} {time.monotonic() - start:.0f} s after creation")
        assert state == "Complete"
        pushed = reg.manifest_digest(*pushed_repo_tag(plan))
        back = core.read_namespaced_config_map(names.result_configmap, ns)
        check_result_object(back.immutable, back.metadata.uid, created.metadata.uid,
                            names.result_configmap)
        result = parse_build_result(back.data, plan)
        print(f"result ConfigMap {names.result_configmap}: {back.data}")
        assert result.image == f"{plan.repository}@{pushed}"
