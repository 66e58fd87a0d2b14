"""The `existing` stack through a real API server: the real Pulumi engine applies every
object k3infra creates to kube-apiserver (tests/e2e/apiserver.py), so server-side
defaulting, validation, Pod Security admission, field ownership and deletion run as on a
user's cluster.

No kubelet runs, so nothing becomes Ready: `up` runs the shipped program plus a test-only
transform that gives every object the readiness condition "it exists"
(`pulumi.com/waitFor: jsonpath={.metadata.uid}`), so creates and updates return at once
while deletions are still awaited as on a user's cluster. (`pulumi.com/skipAwait` also
skips the deletion awaits: a replaced fixed-name Job then collides with its
still-terminating predecessor, which no user meets.) `preview` runs the shipped program
unchanged, with the policy pack.
"""

from __future__ import annotations

import copy
import json
import time

import pytest

from engine import Pulumi, copy_template, object_key, offline_render, stack_ready
from engine import testbed_bin, project, pulumi, pulumi_home  # noqa: F401  (fixtures)

# The session fixture `cluster`, registered once however many modules name it.
pytest_plugins = ["apiserver"]
pytestmark = pytest.mark.e2e

INSTANCE_LABEL = "app.kubernetes.io/instance"
INSTANCE = "kimi-k3"  # the stack program's instance (k3infra.program.INSTANCE, k3infra.naming)
PROXY_IMAGE = "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:" + "ab" * 32
# Test-only: written over the temporary copy's __main__.py, never the repository's.
EXISTS_IS_READY_PROGRAM = '''"""Test-only (tests/e2e/test_apiserver_stack.py): the shipped stack program, where
every Kubernetes object is ready once it exists - no kubelet, nothing becomes Ready."""
import pulumi

from k3infra.program import run


def _annotated(meta):
    meta = dict(meta or {})
    annotations = dict(meta.get("annotations") or {})
    annotations["pulumi.com/waitFor"] = "jsonpath={.metadata.uid}"
    meta["annotations"] = annotations
    return meta


def exists_is_ready(args: pulumi.ResourceTransformArgs):
    if not args.custom or not args.type_.startswith("kubernetes:"):
        return None
    props = dict(args.props)
    meta = props.get("metadata")
    props["metadata"] = (meta.apply(_annotated) if isinstance(meta, pulumi.Output)
                         else _annotated(meta))
    return pulumi.ResourceTransformResult(props, args.opts)


pulumi.runtime.register_resource_transform(exists_is_ready)
run()
'''


@pytest.fixture
def on_server(pulumi: Pulumi, cluster, kube):
    """The `existing` stack, set up as the README says, pointed at the test server; the
    server is shared by the session, so whatever a test leaves is destroyed after it."""
    pulumi.extra_env.update(cluster.env())
    copy_template(pulumi)
    stack_ready(pulumi, ("--path", "k3:benchmark.enabled", "true"),
                # `up` on a cluster refuses the shipped placeholder digest (a gate).
                ("--path", "k3:serving.proxyImage", PROXY_IMAGE))
    yield pulumi
    if [r for r in pulumi.state_resources() if r["type"] != "pulumi:pulumi:Stack"]:
        pulumi.run("destroy", "--yes", "--continue-on-error", check=False, show=5)
    dyn, _core = kube
    deadline = time.monotonic() + 120
    while labelled(dyn, INSTANCE) and time.monotonic() < deadline:
        time.sleep(1)


def use_test_program(pulumi: Pulumi) -> Pulumi:
    """Run the test-only program instead of the shipped one. The policy pack rightly
    refuses it (k3-serving-gate: serving no longer waits for the prefetch Job's
    completion), so `up` runs without --policy-pack here; test_preview_against_the_server
    runs the shipped program with the pack."""
    (pulumi.cwd / "__main__.py").write_text(EXISTS_IS_READY_PROGRAM)
    return pulumi


@pytest.fixture
def kube(cluster):
    from kubernetes import client, dynamic

    with cluster.api_client() as api_client:
        yield dynamic.DynamicClient(api_client), client.CoreV1Api(api_client)


def live(dyn, key: tuple):
    api_version, kind, namespace, name = key
    return dyn.resources.get(api_version=api_version, kind=kind).get(
        name=name, namespace=namespace)


# Every kind the stack creates, and those its controllers create from it (Pods, PVCs).
LABELLED_KINDS = (
    ("v1", "Namespace"), ("v1", "Secret"), ("v1", "ConfigMap"), ("v1", "Service"),
    ("v1", "ServiceAccount"), ("v1", "PersistentVolumeClaim"), ("v1", "Pod"),
    ("networking.k8s.io/v1", "NetworkPolicy"), ("apps/v1", "StatefulSet"), ("apps/v1", "DaemonSet"),
    ("batch/v1", "Job"), ("batch/v1", "CronJob"), ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
)


def labelled(dyn, instance: str) -> list[str]:
    """Every object labelled with the instance, in any namespace, as kind/ns/name."""
    found = []
    for api_version, kind in LABELLED_KINDS:
        res = dyn.resources.get(api_version=api_version, kind=kind)
        found += [f"{kind}/{o.metadata.namespace}/{o.metadata.name}"
                  for o in res.get(label_selector=f"{INSTANCE_LABEL}={instance}").items]
    return found


def pod_from_template(owner: dict, name: str) -> dict:
    """The Pod the owner's controller would create from its template (a StatefulSet's
    claim templates become the PVC volumes the controller adds)."""
    template = copy.deepcopy(owner["spec"]["template"])
    spec = template["spec"]
    for claim in owner["spec"].get("volumeClaimTemplates") or []:
        claim_name = claim["metadata"]["name"]
        spec.setdefault("volumes", []).append({
            "name": claim_name,
            "persistentVolumeClaim": {
                "claimName": f"{claim_name}-{owner['metadata']['name']}-0"}})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": template["metadata"].get("labels", {})},
            "spec": spec}


def privileged(pod: dict) -> dict:
    pod = copy.deepcopy(pod)
    ctx = pod["spec"]["containers"][0].setdefault("securityContext", {})
    ctx.pop("allowPrivilegeEscalation", None)  # privileged implies escalation
    ctx["privileged"] = True
    pod["metadata"]["name"] += "-privileged"
    return pod


def test_preview_against_the_server(on_server):
    """`pulumi preview` of the shipped program with the policy pack, against the server
    (no render mode): the provider's server-side dry run of what it can check before the
    stack's namespaces exist."""
    on_server.run("preview", "--policy-pack", "policy/", show=30)


def test_apply_admit_and_destroy(on_server, kube, tmp_path):
    from kubernetes.client.exceptions import ApiException

    dyn, core = kube
    use_test_program(on_server).run("up", "--yes", show=30)

    # Every object of the offline render exists on the server, in its namespace.
    rendered = offline_render(on_server, tmp_path / "offline")
    keys = sorted({object_key(o) for o in rendered}, key=str)
    objects = {key: live(dyn, key).to_dict() for key in keys}
    print(f"\napplied to the server: {len(objects)} objects: "
          + ", ".join(f"{k[1]}/{k[3]}" for k in keys))
    instances = {o["metadata"].get("labels", {}).get(INSTANCE_LABEL) for o in rendered}
    assert instances == {INSTANCE}, instances

    # The namespaces carry the Pod Security labels k3infra chose, as applied.
    for key in keys:
        if key[1] == "Namespace":
            want = {k: v for k, v in next(o for o in rendered if object_key(o) == key)
                    ["metadata"]["labels"].items() if k.startswith("pod-security.")}
            got = {k: v for k, v in (objects[key]["metadata"].get("labels") or {}).items()
                   if k.startswith("pod-security.")}
            print(f"namespace {key[3]}: {got}")
            assert got == want and want, key

    # The server admits a Pod from each pod template under those labels, and refuses the
    # same Pod made privileged, with its own message.
    templated = [k for k in keys if k[1] in ("StatefulSet", "Job", "DaemonSet")]
    assert {k[1] for k in templated} == {"StatefulSet", "Job", "DaemonSet"}
    for key in templated:
        pod = pod_from_template(objects[key], f"dry-run-{key[3]}"[:63])
        core.create_namespaced_pod(key[2], pod, dry_run="All")
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(key[2], privileged(pod), dry_run="All")
        message = json.loads(refused.value.body)["message"]
        print(f"{key[1]}/{key[3]}: admitted; privileged variant refused: {message}")
        assert refused.value.status == 403
        assert "violates PodSecurity" in message

    # A second up changes nothing.
    on_server.run("up", "--yes", "--expect-no-changes", show=20)

    # Teardown: nothing labelled with the instance remains anywhere (objects the
    # controllers made, such as the StatefulSet's PVCs, go with the namespace).
    on_server.run("destroy", "--yes", show=20)
    print(f"right after destroy: {labelled(dyn, INSTANCE)}")
    deadline = time.monotonic() + 120
    while (left := labelled(dyn, INSTANCE)) and time.monotonic() < deadline:
        time.sleep(1)
    assert left == [], left


def test_drift_is_shown_and_restored(on_server, kube):
    """A serve flag patched through the API: refresh + preview show it, up restores it."""
    dyn, _core = kube
    use_test_program(on_server).run("up", "--yes", show=10)
    sts_api = dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    (sts,) = [s for s in sts_api.get(label_selector=f"{INSTANCE_LABEL}").items]
    container = sts.spec.template.spec.containers[0]
    args = list(container.args)
    i = args.index("--block-size")
    restored = args[i + 1]
    args[i + 1] = "64" if restored != "64" else "32"
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
    sts_api.patch(name=sts.metadata.name, namespace=sts.metadata.namespace, body=patch,
                  content_type="application/json-patch+json", field_manager="e2e-drift")

    on_server.run("refresh", "--yes", show=10)
    preview = json.loads(on_server.run("preview", "--json", show=0, check=False).stdout)
    changed = [s for s in preview.get("steps", []) if s["op"] not in ("same", "read")]
    print(f"\nafter the drift, preview plans: {[(s['op'], s['urn'].split('::')[-1]) for s in changed]}")
    assert any(s["urn"].split("::")[2].endswith("StatefulSet") for s in changed)

    on_server.run("up", "--yes", show=20)
    now = sts_api.get(name=sts.metadata.name, namespace=sts.metadata.namespace)
    now_args = list(now.spec.template.spec.containers[0].args)
    assert now_args[now_args.index("--block-size") + 1] == restored
    on_server.run("destroy", "--yes", show=10)


def test_updates_in_place_and_replacements(on_server, kube):
    """A surface key updates the StatefulSet in place; a new weights revision replaces the
    prefetch Job (its template is immutable) without an error; then nothing changes."""
    dyn, _core = kube
    pulumi = use_test_program(on_server)
    pulumi.run("up", "--yes", show=10)
    sts_api = dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    job_api = dyn.resources.get(api_version="batch/v1", kind="Job")
    (sts,) = sts_api.get(label_selector=INSTANCE_LABEL).items
    jobs = {j.metadata.name: j.metadata.uid for j in job_api.get(label_selector=INSTANCE_LABEL).items}
    prefetch = [n for n in jobs if "prefetch" in n]
    assert len(prefetch) == 1, jobs

    pulumi.run("config", "set", "k3:servedModelName", "kimi-k3-e2e", show=0)
    pulumi.run("up", "--yes", show=15)
    now = sts_api.get(name=sts.metadata.name, namespace=sts.metadata.namespace)
    assert now.metadata.uid == sts.metadata.uid  # updated in place, not replaced
    assert now.metadata.generation > sts.metadata.generation
    args = list(now.spec.template.spec.containers[0].args)
    assert args[args.index("--served-model-name") + 1] == "kimi-k3-e2e"
    after = {j.metadata.name: j.metadata.uid for j in job_api.get(label_selector=INSTANCE_LABEL).items}
    # The weights are untouched; the benchmark Job (which addresses the model by its
    # served name) is replaced, being immutable.
    assert after[prefetch[0]] == jobs[prefetch[0]]
    print(f"\nJobs replaced by the servedModelName change: "
          f"{sorted(n for n in jobs if after.get(n) != jobs[n])}")
    jobs = after

    pulumi.run("config", "set", "k3:weightsRevision", "4" * 40, show=0)
    pulumi.run("up", "--yes", show=15)
    after = {j.metadata.name: j.metadata.uid for j in job_api.get(label_selector=INSTANCE_LABEL).items}
    print(f"\nJobs before the revision change: {jobs}\nafter: {after}")
    replaced = [n for n in after if "prefetch" in n]
    assert len(replaced) == 1 and after[replaced[0]] != jobs[prefetch[0]]

    pulumi.run("up", "--yes", "--expect-no-changes", show=10)
    pulumi.run("destroy", "--yes", show=10)


def test_monitoring_needs_the_operator_crds(on_server, cluster):
    """With monitoring on and no Prometheus Operator CRDs, `up` fails with a message that
    names the missing kind (not a crash); once the pinned CRDs are installed, `up` again
    creates the ServiceMonitor and PrometheusRule, validated against the CRDs' schemas.

    `preview` does not catch the missing CRDs: the provider lets a preview through since a
    CRD may be created by the same update."""
    if cluster.has_prometheus_crds():
        pytest.skip("the Prometheus Operator CRDs are already installed in this session")
    pulumi = on_server
    pulumi.run("config", "set", "--path", "k3:monitoring.serviceMonitor", "true", show=0)
    pulumi.run("config", "set", "--path", "k3:monitoring.prometheusRule", "true", show=0)
    pulumi.run("preview", "--policy-pack", "policy/", show=5)
    proc = use_test_program(pulumi).run("up", "--yes", check=False, show=25)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert 'no matches for kind "ServiceMonitor" in version "monitoring.coreos.com/v1"' in out
    assert "Verify that any required CRDs have been created" in out
    # Not a crash: no panic, and no frame of k3infra's own code in a traceback (the SDK
    # prints gRPC tracebacks of its own once the engine stops on the error).
    assert "panic:" not in out and str(pulumi.cwd / "k3infra") not in out

    print(f"\ninstalled: {cluster.install_prometheus_crds()}")
    pulumi.run("up", "--yes", show=15)
    kinds = {r["type"] for r in pulumi.state_resources()}
    assert {"kubernetes:monitoring.coreos.com/v1:ServiceMonitor",
            "kubernetes:monitoring.coreos.com/v1:PrometheusRule"} <= kinds, kinds
    pulumi.run("destroy", "--yes", show=10)
