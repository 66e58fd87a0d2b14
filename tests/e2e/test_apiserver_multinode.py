"""The multi-node render (k3:topology = multi-node, issue 17) on a real kube-apiserver with
the pinned LeaderWorkerSet CRD (tools/testbed/workload-crds) and the ComputeDomain CRD
(k3infra's statement of NVIDIA's v25.8.1 API, tests/workload_crds.py) installed.

Every object of the offline render is created on the server; the server must store the
LeaderWorkerSet and the ComputeDomain as rendered (its structural-schema validation and
pruning run, nothing may be dropped); the Pods the LeaderWorkerSet controller would make
from the two templates pass the namespace's Pod Security level in a dry run; `k3infra
verify`'s reading of the live group holds, and names a worker flag patched through the API.

No LeaderWorkerSet controller, DRA driver or kubelet runs: what is proven is that the
objects are accepted as written, not that the controllers act on them."""
from __future__ import annotations

import copy
import time
import uuid
from pathlib import Path

import pytest

import workload_crds
from policy_corpus import MULTI_NODE_OVERRIDES

pytest_plugins = ["apiserver"]
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# The labels and env the LeaderWorkerSet controller gives the pods of group 0.
GROUP_LABELS = {"leaderworkerset.sigs.k8s.io/group-index": "0",
                "leaderworkerset.sigs.k8s.io/group-key": "e2e"}


@pytest.fixture(scope="module")
def rendered():
    from k3infra.render import render_stack

    # The template's storage class is a REPLACE placeholder the server refuses as a name.
    return render_stack("existing", [*MULTI_NODE_OVERRIDES, "weights.storageClass=e2e-rwx"],
                        REPO).manifests()


@pytest.fixture(scope="module")
def crds(cluster, tmp_path_factory):
    started = time.monotonic()
    own = workload_crds.write_compute_domain_crd(tmp_path_factory.mktemp("crds"))
    names = cluster.install_crds([*workload_crds.crd_paths().values(), own])
    print(f"\ninstalled {names} in {time.monotonic() - started:.1f} s")
    return names


@pytest.fixture(scope="module")
def applied(cluster, crds, rendered):
    """Every rendered object, created on the server in a namespace of its own."""
    from kubernetes import dynamic

    tag = uuid.uuid4().hex[:6]
    # Each rendered namespace (serving, engine build) gets a fresh name on the shared server.
    renamed = {o["metadata"]["name"]: f"e2e-mn-{tag}-{i}"
               for i, o in enumerate(o for o in rendered if o["kind"] == "Namespace")}
    objects = []
    for obj in copy.deepcopy(rendered):
        meta = obj["metadata"]
        if obj["kind"] == "Namespace":
            meta["name"] = renamed[meta["name"]]
        elif "namespace" in meta:
            meta["namespace"] = renamed[meta["namespace"]]
        objects.append(obj)
    namespace = next(o["metadata"]["namespace"] for o in objects if o["kind"] == "LeaderWorkerSet")
    with cluster.api_client() as api_client:
        dyn = dynamic.DynamicClient(api_client)
        for obj in objects:
            res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            res.create(body=obj, namespace=obj["metadata"].get("namespace"))
        print(f"created {len(objects)} objects: "
              + ", ".join(sorted({o['kind'] for o in objects})))
        yield dyn, namespace, objects
        for name in renamed.values():
            dyn.resources.get(api_version="v1", kind="Namespace").delete(name=name)


def _subset(want, got, path="") -> list[str]:
    """Where `got` (the stored object) lacks or differs from `want` (the rendered one)."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{path}: {got!r}"]
        return [d for k, v in want.items() for d in _subset(v, got.get(k), f"{path}.{k}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{path}: {got!r}"]
        return [d for i, v in enumerate(want) for d in _subset(v, got[i], f"{path}[{i}]")]
    return [] if want == got or str(want) == str(got) else [f"{path}: {got!r} != {want!r}"]


@pytest.mark.parametrize("kind", ["LeaderWorkerSet", "ComputeDomain"])
def test_the_server_stores_the_group_as_rendered(applied, kind):
    dyn, namespace, objects = applied
    (obj,) = [o for o in objects if o["kind"] == kind]
    live = dyn.resources.get(api_version=obj["apiVersion"], kind=kind).get(
        name=obj["metadata"]["name"], namespace=namespace).to_dict()
    assert _subset(obj["spec"], live["spec"], "spec") == []
    assert live["metadata"]["annotations"]["k3infra.dev/measured-configuration"] == "false"
    defaulted = sorted(set(_flatten(live["spec"])) - set(_flatten(obj["spec"])))
    print(f"{kind}: stored as rendered; server defaults added: {defaulted}")


def _flatten(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(v, f"{path}.{k}")
    elif isinstance(value, list):
        for v in value:
            yield from _flatten(v, f"{path}[]")
    else:
        yield path


def _pod(lws: dict, role: str) -> dict:
    """The Pod the LeaderWorkerSet controller would create for group 0 (labels, env, the
    cache claim of its claim template), as far as admission is concerned."""
    lwt = lws["spec"]["leaderWorkerTemplate"]
    template = copy.deepcopy(lwt[f"{role}Template"])
    name = lws["metadata"]["name"]
    pod_name = f"{name}-0" if role == "leader" else f"{name}-0-1"
    spec = template["spec"]
    for c in spec["containers"]:
        c.setdefault("env", []).append({"name": "LWS_LEADER_ADDRESS",
                                        "value": f"{name}-0.{name}.{lws['metadata']['namespace']}"})
    for claim in lwt.get("volumeClaimTemplates") or []:
        spec["volumes"].append({"name": claim["metadata"]["name"], "persistentVolumeClaim": {
            "claimName": f"{claim['metadata']['name']}-{pod_name}"}})
    labels = {**template["metadata"]["labels"], **GROUP_LABELS,
              "leaderworkerset.sigs.k8s.io/name": name,
              "leaderworkerset.sigs.k8s.io/worker-index": "0" if role == "leader" else "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "labels": labels,
                         "annotations": template["metadata"]["annotations"]},
            "spec": spec}


def _enforced(objects: list[dict], namespace: str) -> str:
    (ns,) = [o for o in objects if o["kind"] == "Namespace" and o["metadata"]["name"] == namespace]
    return ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]


@pytest.mark.parametrize("role", ["leader", "worker"])
def test_the_group_pods_are_admitted(cluster, applied, role):
    from kubernetes import client

    dyn, namespace, objects = applied
    (lws,) = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
    pod = _pod(lws, role)
    with cluster.api_client() as api_client:
        made = client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod, dry_run="All")
    claims = made.spec.resource_claims
    print(f"{role} pod {pod['metadata']['name']}: admitted (Pod Security "
          f"{_enforced(objects, namespace)}); "
          f"resourceClaims kept by the server: {claims is not None} "
          f"(dropped when DynamicResourceAllocation is off, the v1.33 default)")
    vllm = next(c for c in made.spec.containers if c.name == "vllm")
    assert vllm.resources.limits["nvidia.com/gpu"] == "4"


def test_verify_reads_the_group_and_names_a_patched_worker_flag(cluster, applied):
    from k3infra.cli.verify import verify_rows
    from k3infra.live.cluster import KubeCluster
    from k3infra.receipt import load_receipt

    dyn, namespace, objects = applied
    receipt = load_receipt()
    with cluster.api_client() as api_client:
        kube = KubeCluster(api_client, namespace)
        (lws,) = kube.groups()
        rows = verify_rows(kube, receipt, check_results=False, tolerance_pct=10.0)
        group = [r for r in rows if r.area == "group"]
        for r in group:
            print(f"  {'ok ' if r.ok else 'BAD'} {r.check}: {r.actual}")
        bad = {r.check for r in group if not r.ok}
        # Nothing runs: no group is ready, and no pod can be read. Every flag holds.
        assert bad == {f"ready replicas [{lws['metadata']['name']} leader]"}, bad
        assert any(r.check.startswith("verified marker [") and not r.ok for r in rows)

        patched = copy.deepcopy(lws)
        worker = patched["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
        vllm = next(c for c in worker["containers"] if c["name"] == "vllm")
        vllm["args"].remove("--headless")
        dyn.resources.get(api_version=lws["apiVersion"], kind="LeaderWorkerSet").replace(
            body=patched, namespace=namespace)
        rows = verify_rows(kube, receipt, check_results=False, tolerance_pct=10.0)
    bad = {r.check: r.actual for r in rows if r.area == "group" and not r.ok}
    print(f"after removing --headless through the API: {bad}")
    assert f"multi-node args [{lws['metadata']['name']} worker]" in bad


# --- `pulumi up` of the multi-node stack: the real engine and provider ----------------------------

from engine import copy_template, stack_ready  # noqa: E402
from engine import testbed_bin, project, pulumi, pulumi_home  # noqa: E402,F401  (fixtures)


def test_pulumi_up_applies_the_group_and_destroys_it(pulumi, cluster, crds):
    """The `existing` stack with k3:topology = multi-node through the real Pulumi engine and
    Kubernetes provider (the test-only program of test_apiserver_stack.py: every object is
    ready once it exists): the LeaderWorkerSet and ComputeDomain are created labelled not
    measured, a second `up` changes nothing (the label transformation is stable), and
    `destroy` removes them."""
    from kubernetes import dynamic

    from test_apiserver_stack import EXISTS_IS_READY_PROGRAM

    pulumi.extra_env.update(cluster.env())
    copy_template(pulumi)
    stack_ready(pulumi, ("k3:topology", "multi-node"), ("k3:gpuProduct", "NVIDIA-GB300"),
                ("k3:gpuMemoryGib", "267.69"))
    (pulumi.cwd / "__main__.py").write_text(EXISTS_IS_READY_PROGRAM)
    started = time.monotonic()
    pulumi.run("up", "--yes", show=30)
    print(f"up: {time.monotonic() - started:.0f} s")
    outputs = pulumi.json("stack", "output", "--json")
    assert "NOT the measured configuration" in outputs["topology"]
    with cluster.api_client() as api_client:
        dyn = dynamic.DynamicClient(api_client)
        lws = dyn.resources.get(api_version="leaderworkerset.x-k8s.io/v1",
                                kind="LeaderWorkerSet").get(name="kimi-k3-r0", namespace="kimi-k3")
        cd = dyn.resources.get(api_version="resource.nvidia.com/v1beta1",
                               kind="ComputeDomain").get(name="kimi-k3-r0-domain",
                                                         namespace="kimi-k3")
        for obj in (lws, cd):
            ann = obj.metadata.annotations
            assert ann["k3infra.dev/measured-configuration"] == "false"
            assert "NOT the measured configuration" in ann["k3infra.dev/warning"]
        assert lws.spec.leaderWorkerTemplate.size == 2
        assert cd.spec.channel.resourceClaimTemplate.name == "kimi-k3-r0-imex"
        pulumi.run("up", "--yes", "--expect-no-changes", show=10)
        pulumi.run("destroy", "--yes", show=10)
        left = dyn.resources.get(api_version="leaderworkerset.x-k8s.io/v1",
                                 kind="LeaderWorkerSet").get(namespace="kimi-k3").items
        assert left == [], [o.metadata.name for o in left]
