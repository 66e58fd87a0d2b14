"""The Hub once per cluster through the real Pulumi engine and a real API server: the
`existing` stack in node-local mode with 3 replicas (`k3:weights.source` at its default,
cluster-then-hub). The server must accept the in-cluster source (Deployment, Service,
NetworkPolicy) under the namespace's Pod Security `restricted` level, and the engine must
record the order the render promises: Job 0, then source 0 (Deployment, then Service),
then the Jobs that fill from it.

No kubelet runs: the test-only program of test_apiserver_stack makes every object ready
once it exists (see there), so `up` returns without pods running.
"""

from __future__ import annotations

import json
import time

import pytest

from engine import Pulumi, copy_template, object_key, offline_render, stack_ready
from engine import testbed_bin, project, pulumi, pulumi_home  # noqa: F401  (fixtures)
from test_apiserver_stack import (INSTANCE, PROXY_IMAGE, kube, labelled, live,  # noqa: F401
                                  pod_from_template, privileged, use_test_program)

pytest_plugins = ["apiserver"]
pytestmark = pytest.mark.e2e


@pytest.fixture
def fanout_stack(pulumi: Pulumi, cluster, kube):  # noqa: F811
    pulumi.extra_env.update(cluster.env())
    copy_template(pulumi)
    stack_ready(pulumi, ("--path", "k3:serving.proxyImage", PROXY_IMAGE),
                ("--path", "k3:weights.mode", "node-local"), ("k3:replicas", "3"))
    yield pulumi
    if [r for r in pulumi.state_resources() if r["type"] != "pulumi:pulumi:Stack"]:
        pulumi.run("destroy", "--yes", "--continue-on-error", check=False, show=5)
    dyn, _core = kube
    deadline = time.monotonic() + 120
    while labelled(dyn, INSTANCE) and time.monotonic() < deadline:
        time.sleep(1)


def test_sources_are_admitted_and_ordered(fanout_stack, kube, tmp_path):  # noqa: F811
    from kubernetes.client.exceptions import ApiException

    dyn, core = kube
    use_test_program(fanout_stack).run("up", "--yes", show=30)
    rendered = offline_render(fanout_stack, tmp_path / "offline")
    wanted = [o for o in rendered if o["kind"] in ("Deployment", "Service", "NetworkPolicy")
              and "weights-source" in o["metadata"]["name"]]
    assert {(o["kind"], o["metadata"]["name"]) for o in wanted} == {
        ("Deployment", "kimi-k3-weights-source-0"), ("Service", "kimi-k3-weights-source-0"),
        ("NetworkPolicy", "kimi-k3-weights-source")}
    for o in wanted:
        got = live(dyn, object_key(o)).to_dict()
        print(f"{o['kind']}/{o['metadata']['name']}: on the server, uid {got['metadata']['uid']}")

    dep = live(dyn, ("apps/v1", "Deployment", "kimi-k3", "kimi-k3-weights-source-0")).to_dict()
    pod = pod_from_template(dep, "dry-run-weights-source-0")
    core.create_namespaced_pod("kimi-k3", pod, dry_run="All")
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("kimi-k3", privileged(pod), dry_run="All")
    message = json.loads(refused.value.body)["message"]
    print(f"source pod: admitted under restricted; privileged variant refused: {message}")
    assert refused.value.status == 403 and "violates PodSecurity" in message

    # The engine's own record of the edges (state, not the render).
    state = {r["urn"].split("::")[-1]: r for r in fanout_stack.state_resources()}
    urn = {name: r["urn"] for name, r in state.items()}
    deps = {name: set(r.get("dependencies") or []) for name, r in state.items()}
    print("recorded edges: " + "; ".join(
        f"{n} <- {sorted(u.split('::')[-1] for u in deps[n] if 'weights' in u)}"
        for n in ("kimi-k3-weights-source-0", "kimi-k3-weights-source-svc-0",
                  "kimi-k3-weights-job-1", "kimi-k3-weights-job-2")))
    assert urn["kimi-k3-weights-job-0"] in deps["kimi-k3-weights-source-0"]
    assert urn["kimi-k3-weights-source-0"] in deps["kimi-k3-weights-source-svc-0"]
    for i in (1, 2):
        assert {urn["kimi-k3-weights-source-0"], urn["kimi-k3-weights-source-svc-0"]} \
            <= deps[f"kimi-k3-weights-job-{i}"]
    assert not any("weights-source" in u for u in deps["kimi-k3-weights-job-0"])
    timeouts = state["kimi-k3-weights-source-0"].get("customTimeouts") or {}
    print(f"source-0 customTimeouts in state: {timeouts}")
    fanout_stack.run("destroy", "--yes", show=10)
