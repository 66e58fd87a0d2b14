"""Two `K3ServingStack` instances in two namespaces, from a user's own program (the
README's snippet), applied to the real API server (tests/e2e/apiserver.py) and
destroyed: the objects of one instance are all in its namespace, none is shared,
selects or is owned by the other's, and nothing of either is left afterwards.

Two instances in one namespace the user's program creates (`k3:createNamespace`
false, docs/component.md "The namespace: who owns it"): both apply, their Pods are
admitted under the user's `restricted` label, and removing one instance from the
program deletes its objects only; the other's and the namespace stay.

The program registers the same test-only transform as test_apiserver_stack.py
(`pulumi.com/waitFor: jsonpath={.metadata.uid}`: no kubelet, nothing becomes Ready, so
every object is ready once it exists; deletions are still awaited).
"""

from __future__ import annotations

import time

import pytest

from engine import API_KEY, ROOT, Pulumi
from engine import testbed_bin, project, pulumi, pulumi_home  # noqa: F401  (fixtures)
from test_apiserver_stack import (EXISTS_IS_READY_PROGRAM, INSTANCE_LABEL, LABELLED_KINDS,
                                  kube)  # noqa: F401  (kube: a fixture)
from test_engine import readme_program

pytest_plugins = ["apiserver"]
pytestmark = pytest.mark.e2e

INSTANCES = {"kimi": "inference", "kimi-b": "inference-b"}  # instance -> its namespace


def two_instances_program() -> str:
    """The README snippet twice (as test_engine's render-mode test builds it), after the
    test-only transform instead of the shipped stack program."""
    program = readme_program()
    first, rest = program.split("k3 = K3ServingStack(", 1)
    body = "K3ServingStack(" + rest.split("pulumi.export")[0]
    components = (first + "a = " + body + "b = " + body.replace('"kimi"', '"kimi-b"', 1)
                  .replace('namespace="inference"', 'namespace="inference-b"')
                  + 'pulumi.export("endpoints", [a.endpoint, b.endpoint])\n')
    transform = EXISTS_IS_READY_PROGRAM.replace("from k3infra.program import run\n", "")
    assert transform.endswith("\nrun()\n")
    return transform[: -len("run()\n")] + components


SHARED_NAMESPACE = "inference"
SHARED = ("kimi", "kimi-b")      # the instances in the user's one namespace


def shared_namespace_program(instances: tuple[str, ...]) -> str:
    """The README snippet once per instance, each in the namespace the program itself
    creates (Pod Security `restricted`, as a user who owns it would label it), with
    `createNamespace=False` and the user's Namespace in `depends_on`."""
    program = readme_program()
    first, rest = program.split("k3 = K3ServingStack(", 1)
    body = "K3ServingStack(" + rest.split("pulumi.export")[0]
    owns = "createNamespace=True,   # this instance creates and owns it"
    end = "    receipt=load_receipt(),\n))"
    assert owns in body and end in body and f'namespace="{SHARED_NAMESPACE}"' in body
    body = body.replace(owns, "createNamespace=False,").replace(
        end, "    receipt=load_receipt(),\n), pulumi.ResourceOptions(depends_on=[user_ns]))")
    user_ns = ("import pulumi_kubernetes as k8s\n\n"
               f'user_ns = k8s.core.v1.Namespace("{SHARED_NAMESPACE}", metadata={{\n'
               f'    "name": "{SHARED_NAMESPACE}",\n'
               '    "labels": {"pod-security.kubernetes.io/enforce": "restricted"}})\n')
    components = "".join(f"k3_{i} = " + body.replace('"kimi"', f'"{name}"', 1)
                         for i, name in enumerate(instances))
    exports = ", ".join(f"k3_{i}.endpoint" for i in range(len(instances)))
    transform = EXISTS_IS_READY_PROGRAM.replace("from k3infra.program import run\n", "")
    assert transform.endswith("\nrun()\n")
    return (transform[: -len("run()\n")] + first + user_ns + components
            + f'pulumi.export("endpoints", [{exports}])\n')


def consumer_project(pulumi: Pulumi, cluster, tmp_path, program: str) -> Pulumi:
    """A user's own project outside the repository, pointed at the test server."""
    d = tmp_path / "consumer"
    d.mkdir()
    (d / "Pulumi.yaml").write_text(
        "name: k3-consumer\nruntime:\n  name: python\n  options:\n"
        f"    toolchain: pip\n    virtualenv: {ROOT / '.venv'}\n")
    (d / "__main__.py").write_text(program)
    pulumi.cwd = d
    pulumi.extra_env.update(cluster.env())
    pulumi.run("stack", "init", "dev")
    pulumi.run("config", "set", "--secret", "apiKey", API_KEY, show=0)
    return pulumi


def destroy_leftovers(pulumi: Pulumi) -> None:
    """Whatever a failed test leaves is destroyed after it (the server is shared by the
    session)."""
    if [r for r in pulumi.state_resources() if r["type"] != "pulumi:pulumi:Stack"]:
        pulumi.run("destroy", "--yes", "--continue-on-error", check=False, show=5)


@pytest.fixture
def consumer(pulumi: Pulumi, cluster, kube, tmp_path) -> Pulumi:
    yield consumer_project(pulumi, cluster, tmp_path, two_instances_program())
    destroy_leftovers(pulumi)


@pytest.fixture
def shared_consumer(pulumi: Pulumi, cluster, kube, tmp_path) -> Pulumi:
    yield consumer_project(pulumi, cluster, tmp_path, shared_namespace_program(SHARED))
    destroy_leftovers(pulumi)


def kinds_of(state: list[dict]) -> list[tuple[str, str]]:
    """The kinds to list: test_apiserver_stack's (with those the controllers create)
    and every kind in the state, so a kind the product adds later is listed too."""
    kinds = dict.fromkeys(LABELLED_KINDS)
    for r in state:
        out = r.get("outputs") or {}
        if r["type"].startswith("kubernetes:") and out.get("kind"):
            kinds.setdefault((out["apiVersion"], out["kind"]))
    return list(kinds)


def objects_of(dyn, instance: str, kinds) -> list[dict]:
    """Every object labelled with the instance, in any namespace, as plain dicts."""
    found = []
    for api_version, kind in kinds:
        res = dyn.resources.get(api_version=api_version, kind=kind)
        for o in res.get(label_selector=f"{INSTANCE_LABEL}={instance}").items:
            obj = o.to_dict()
            obj.setdefault("kind", kind)
            found.append(obj)
    return found


def where(obj: dict) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']}/{meta.get('namespace') or '-'}/{meta['name']}"


def selected_instances(obj: dict) -> set[str]:
    """The instance label values the object's selectors name (pods it selects)."""
    spec = obj.get("spec") or {}
    selectors = [spec.get("selector"), spec.get("podSelector")]
    values = set()
    for sel in selectors:
        if not isinstance(sel, dict):
            continue
        labels = sel.get("matchLabels", sel)  # a Service's selector is the labels themselves
        if isinstance(labels, dict) and INSTANCE_LABEL in labels:
            values.add(labels[INSTANCE_LABEL])
    return values


def component_of(resource: dict, by_urn: dict) -> str:
    """The name of the K3ServingStack a resource of the state belongs to."""
    r = resource
    while "K3ServingStack" not in r["type"]:
        r = by_urn[r["parent"]]
    return r["urn"].rsplit("::", 1)[-1]


def test_two_instances_apply_apart_and_destroy_cleanly(consumer: Pulumi, kube):
    dyn, _core = kube
    started = time.monotonic()
    consumer.run("up", "--yes", show=15)
    up_s = time.monotonic() - started

    state = consumer.state_resources()
    kinds = kinds_of(state)
    found = {i: objects_of(dyn, i, kinds) for i in INSTANCES}
    for instance, objs in found.items():
        print(f"\n{instance}: {len(objs)} objects: " + ", ".join(sorted(map(where, objs))))
    uid_instance = {o["metadata"]["uid"]: i for i, objs in found.items() for o in objs}

    # No object is both instances' (a label has one value; by uid, none is listed twice).
    a, b = ({o["metadata"]["uid"] for o in objs} for objs in found.values())
    assert a and b and not a & b

    # Every Kubernetes resource Pulumi created is found under its own instance's label.
    by_place = {where(o): i for i, objs in found.items() for o in objs}
    by_urn = {r["urn"]: r for r in state}
    kube_resources = [r for r in state if r["type"].startswith("kubernetes:")
                      and not r["type"].startswith("pulumi:providers:")]
    assert kube_resources
    for r in kube_resources:
        out = r.get("outputs") or {}
        meta = out.get("metadata") or {}
        place = f"{out.get('kind')}/{meta.get('namespace') or '-'}/{meta.get('name')}"
        assert by_place.get(place) == component_of(r, by_urn), (place, by_place.get(place))

    managers = {}
    for instance, namespace in INSTANCES.items():
        for obj in found[instance]:
            meta = obj["metadata"]
            # In its own namespace (a Namespace: it is that namespace).
            assert (meta["name"] if obj["kind"] == "Namespace" else meta.get("namespace")) \
                == namespace, where(obj)
            # Owned (ownerReferences: Pods and PVCs made by the controllers) only by
            # objects of the same instance.
            owners = {uid_instance.get(ref["uid"], "unlabelled")
                      for ref in meta.get("owner_references") or meta.get("ownerReferences") or []}
            assert owners <= {instance}, (where(obj), owners)
            # Selecting only its own instance's pods (a workload, Service or PDB by name).
            selects = selected_instances(obj)
            assert selects <= {instance}, (where(obj), selects)
            if obj["kind"] in ("StatefulSet", "Service", "PodDisruptionBudget"):
                assert selects == {instance}, (where(obj), selects)
            for entry in meta.get("managed_fields") or meta.get("managedFields") or []:
                managers.setdefault(instance, set()).add(entry["manager"])
    print(f"field managers: { {i: sorted(m) for i, m in managers.items()} }")
    # Server-side apply: the provider's field manager is per Pulumi resource, so no
    # resource of one instance owns a field of the other's objects.
    applied = [{m for m in managers[i] if m.startswith("pulumi-kubernetes")} for i in INSTANCES]
    assert all(applied) and not applied[0] & applied[1], applied

    started = time.monotonic()
    consumer.run("destroy", "--yes", show=10)
    def left_over() -> list[str]:
        return [where(o) for i in INSTANCES for o in objects_of(dyn, i, kinds)]

    print(f"right after destroy: {left_over()}")
    deadline = time.monotonic() + 120
    while (left := left_over()) and time.monotonic() < deadline:
        time.sleep(1)
    print(f"up {up_s:.1f} s; destroy and namespaces finalized {time.monotonic() - started:.1f} s")
    assert left == [], left


def test_two_instances_in_one_user_namespace_apply_and_one_leaves_alone(shared_consumer: Pulumi,
                                                                       kube):
    dyn, core = kube
    started = time.monotonic()
    shared_consumer.run("up", "--yes", show=15)
    up_s = time.monotonic() - started

    state = shared_consumer.state_resources()
    kinds = kinds_of(state)
    # One Namespace in the state: the user's, a child of the stack, not of an instance.
    namespaces = [r for r in state if r["type"] == "kubernetes:core/v1:Namespace"]
    assert [(r["urn"].rsplit("::", 1)[-1], r["parent"].split("::")[-2]) for r in namespaces] \
        == [(SHARED_NAMESPACE, "pulumi:pulumi:Stack")], namespaces
    found = {i: objects_of(dyn, i, kinds) for i in SHARED}
    for instance, objs in found.items():
        print(f"\n{instance}: {len(objs)} objects: " + ", ".join(sorted(map(where, objs))))
        assert objs
        # No instance labels a Namespace: it created none.
        assert [where(o) for o in objs if o["kind"] == "Namespace"] == []
        assert {o["metadata"].get("namespace") for o in objs} == {SHARED_NAMESPACE}
    a, b = ({o["metadata"]["uid"] for o in objs} for objs in found.values())
    assert a and b and not a & b

    # The controllers' Pods of both instances are admitted under the user's label.
    labels = core.read_namespace(SHARED_NAMESPACE).metadata.labels or {}
    assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", labels
    deadline = time.monotonic() + 60
    pods = {}
    while time.monotonic() < deadline:
        pods = {i: [p.metadata.name for p in core.list_namespaced_pod(
            SHARED_NAMESPACE, label_selector=f"{INSTANCE_LABEL}={i}").items] for i in SHARED}
        if all(pods.values()):
            break
        time.sleep(1)
    print(f"pods admitted in {SHARED_NAMESPACE} (restricted): {pods}")
    assert all(pods.values()), pods

    # Remove the second instance from the program: `up` deletes its objects only.
    kept, removed = SHARED
    (shared_consumer.cwd / "__main__.py").write_text(shared_namespace_program((kept,)))
    started = time.monotonic()
    shared_consumer.run("up", "--yes", show=15)
    deadline = time.monotonic() + 120
    while (left := objects_of(dyn, removed, kinds)) and time.monotonic() < deadline:
        time.sleep(1)
    print(f"{removed} removed in {time.monotonic() - started:.1f} s (up {up_s:.1f} s); "
          f"left: {[where(o) for o in left]}")
    assert left == []
    # The other instance's objects are the same objects (uids), and the namespace is
    # still there and not terminating.
    still = objects_of(dyn, kept, kinds)
    created_by_pulumi = {o["metadata"]["uid"] for o in found[kept] if o["kind"] != "Pod"}
    assert created_by_pulumi <= {o["metadata"]["uid"] for o in still}, \
        sorted(where(o) for o in found[kept] if o["metadata"]["uid"] not in
               {s["metadata"]["uid"] for s in still})
    assert core.read_namespace(SHARED_NAMESPACE).status.phase == "Active"
    assert [r for r in shared_consumer.state_resources()
            if f"K3ServingStack::{removed}" in r["urn"]] == []

    shared_consumer.run("destroy", "--yes", show=10)
    deadline = time.monotonic() + 120
    while (left := objects_of(dyn, kept, kinds)) and time.monotonic() < deadline:
        time.sleep(1)
    assert left == [], [where(o) for o in left]
