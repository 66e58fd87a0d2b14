"""The e2e control plane itself works: the server answers with the pinned release, the
controllers the later tests rely on run, and Pod Security admission enforces.

Without this, a failing apply/drift/teardown test could not tell a k3infra defect from a
control plane that was never whole."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest

# The session fixture `cluster`, registered once however many modules name it.
pytest_plugins = ["apiserver"]
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 90.0  # controllers on a loaded 2-core machine; they usually act within seconds


def _pinned_kubernetes() -> str:
    """The k8s.io/kubernetes version tools/testbed/cluster/go.mod pins."""
    text = (REPO / "tools/testbed/cluster/go.mod").read_text()
    found = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", text, re.MULTILINE)
    assert found, "tools/testbed/cluster/go.mod does not require k8s.io/kubernetes"
    return found.group(1)


def _until(what: str, probe, timeout: float = WAIT_S):
    """probe() until it returns something truthy; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout:.0f} s")


@pytest.fixture
def api(cluster):
    from kubernetes import client

    with cluster.api_client() as api_client:
        yield client.CoreV1Api(api_client), client.BatchV1Api(api_client)


@pytest.fixture
def namespace(api):
    """A fresh namespace, deleted afterwards (without waiting for it to finalize)."""
    from kubernetes import client

    core, _batch = api
    name = f"e2e-smoke-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def _pod_spec(privileged: bool):
    """A Pod spec that meets the "restricted" Pod Security level, or one that breaks it
    only by running privileged."""
    from kubernetes import client

    if privileged:
        container_ctx = client.V1SecurityContext(privileged=True)
    else:
        container_ctx = client.V1SecurityContext(
            allow_privilege_escalation=False,
            capabilities=client.V1Capabilities(drop=["ALL"]),
        )
    return client.V1PodSpec(
        restart_policy="Never",
        security_context=client.V1PodSecurityContext(
            run_as_non_root=True,
            run_as_user=1000,
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        ),
        containers=[client.V1Container(
            name="main",
            image="registry.invalid/e2e/never-pulled:1",
            command=["true"],
            security_context=container_ctx,
        )],
    )


def test_server_runs_the_pinned_release(cluster):
    pinned = _pinned_kubernetes()
    assert cluster.git_version == pinned
    major, minor = pinned[1:].split(".")[:2]
    assert (cluster.version["major"], cluster.version["minor"]) == (major, minor)


def test_deleted_namespace_finalizes(api):
    """The namespace controller empties a deleted namespace and removes it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, _batch = api
    name = f"e2e-smoke-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    core.create_namespaced_config_map(name, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="content"), data={"k": "v"}))
    core.delete_namespace(name)

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except ApiException as exc:
            return exc.status == 404
        return False

    _until(f"namespace {name} to finalize after deletion", gone)


def test_job_gets_its_pod(api, namespace):
    """The job controller creates the Job's Pod; with no scheduler it stays Pending."""
    from kubernetes import client

    core, batch = api
    batch.create_namespaced_job(namespace, client.V1Job(
        metadata=client.V1ObjectMeta(name="smoke"),
        spec=client.V1JobSpec(
            backoff_limit=0,
            template=client.V1PodTemplateSpec(spec=_pod_spec(privileged=False)),
        ),
    ))
    pods = _until(
        "the job controller to create the Job's Pod",
        lambda: core.list_namespaced_pod(
            namespace, label_selector="batch.kubernetes.io/job-name=smoke").items,
    )
    assert len(pods) == 1
    pod = pods[0]
    assert pod.metadata.owner_references[0].kind == "Job"
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


def test_pod_security_refuses_privileged_pod(api, namespace):
    """Under enforce=restricted the server admits a restricted Pod and refuses the same
    Pod made privileged, with Pod Security's own message."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, _batch = api
    core.patch_namespace(namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})

    def pod(name: str, privileged: bool):
        return client.V1Pod(metadata=client.V1ObjectMeta(name=name),
                            spec=_pod_spec(privileged))

    admitted = core.create_namespaced_pod(namespace, pod("restricted", False), dry_run="All")
    assert admitted.metadata.name == "restricted"

    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, pod("privileged", True), dry_run="All")
    message = json.loads(refused.value.body)["message"]
    print(f"\nthe server refused the privileged Pod: {message}")
    assert refused.value.status == 403
    assert 'violates PodSecurity "restricted:latest"' in message
    assert 'container "main" must not set securityContext.privileged=true' in message
