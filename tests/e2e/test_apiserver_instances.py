"""Two `K3ServingStack` instances in two namespaces, from a user's own program (the
README's snippet), applied to the real API server (tests/e2e/apiserver.py) and
destroyed: the objects of one instance are all in its namespace, none is shared,
selects or is owned by the other's, and nothing of either is left afterwards.

The program registers the same test-only transform as test_apiserver_stack.py
(`pulumi.com/waitFor: jsonpath={.metadata.uid}`: no kubelet, nothing becomes Ready, so
every object is ready once it exists; deletions are still awaited).
"""

from __future__ import annotations

import time

import pytest

from engine import API_KEY, ROOT, Pulumi
from engine import engine_bin, project, pulumi, pulumi_home  # noqa: F401  (fixtures)
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


@pytest.fixture
def consumer(pulumi: Pulumi, cluster, kube, tmp_path) -> Pulumi:
    """A user's own project outside the repository, pointed at the test server; whatever
    a failed test leaves is destroyed after it (the server is shared by the session)."""
    d = tmp_path / "consumer"
    d.mkdir()
    (d / "Pulumi.yaml").write_text(
        "name: k3-consumer\nruntime:\n  name: python\n  options:\n"
        f"    toolchain: pip\n    virtualenv: {ROOT / '.venv'}\n")
    (d / "__main__.py").write_text(two_instances_program())
    pulumi.cwd = d
    pulumi.extra_env.update(cluster.env())
    pulumi.run("stack", "init", "dev")
    pulumi.run("config", "set", "--secret", "apiKey", API_KEY, show=0)
    yield pulumi
    if [r for r in pulumi.state_resources() if r["type"] != "pulumi:pulumi:Stack"]:
        pulumi.run("destroy", "--yes", "--continue-on-error", check=False, show=5)


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
