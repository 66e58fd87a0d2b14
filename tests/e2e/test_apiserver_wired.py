"""The engine image wired from another resource of the user's program, unknown until that
resource exists, through the real engine and the real API server: `pulumi preview` shows
every field of the serving objects but the ones the image fills, and `pulumi up` fills
them (docs/component.md, "What a preview shows").

The source stands for what a user wires in (a build's digest, another stack's output):
in `up` the image read from a ConfigMap the program creates, in a preview an unknown
Output (pulumi-kubernetes' preview of a create knows every field of a ConfigMap, so no
object of this server stays unknown). Differences from a user's program: the README snippet with that source,
and the test-only transform of test_apiserver_stack.py (no kubelet: every object is
ready once it exists).
"""

from __future__ import annotations

import pytest

from engine import IMAGE, Pulumi
from engine import testbed_bin, project, pulumi, pulumi_home  # noqa: F401  (fixtures)
from test_apiserver_instances import consumer_project, destroy_leftovers
from test_apiserver_stack import EXISTS_IS_READY_PROGRAM, kube  # noqa: F401  (kube: a fixture)
from test_engine import readme_program

pytest_plugins = ["apiserver"]
pytestmark = pytest.mark.e2e

# How the engine writes an unknown value in `pulumi preview --json` (pulumi's
# computedValuePlaceholder, the same string as the SDK's rpc.UNKNOWN).
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
SOURCE = '''import asyncio

import pulumi_kubernetes as k8s

# Stands for a build or another stack whose output is not known before `up`: its value
# once the ConfigMap exists, and in a preview an unknown, as the engine gives a value a
# provider cannot compute yet (pulumi-kubernetes' preview of a create knows every field of
# this ConfigMap, so nothing of a real one stays unknown).
image_source = k8s.core.v1.ConfigMap("image-source", data={"image": "%s"})


def unknown():
    loop = asyncio.get_event_loop()
    value, known = loop.create_future(), loop.create_future()
    value.set_result(None)
    known.set_result(False)
    return pulumi.Output(set(), value, known)


wired_image = (unknown() if pulumi.runtime.is_dry_run()
               else image_source.data.apply(lambda d: d["image"]))
''' % IMAGE


def wired_program() -> str:
    program = readme_program()
    first, rest = program.split("cfg = pulumi.Config()\n", 1)
    literal = f'engineImage="{IMAGE}",'
    assert literal in rest
    transform = EXISTS_IS_READY_PROGRAM.replace("from k3infra.program import run\n", "")
    assert transform.endswith("\nrun()\n")
    return (transform[: -len("run()\n")] + first + SOURCE + "cfg = pulumi.Config()\n"
            + rest.replace(literal, "engineImage=wired_image,"))


def unknown_places(value, at=()) -> list[str]:
    """Where `value` holds the engine's unknown, list items named by their `name`."""
    if value == UNKNOWN:
        return ["/".join(at)]
    if isinstance(value, dict):
        return sorted(p for k, v in value.items() for p in unknown_places(v, (*at, k)))
    if isinstance(value, list):
        return sorted(p for i, v in enumerate(value) for p in unknown_places(
            v, (*at, v["name"] if isinstance(v, dict) and "name" in v else str(i))))
    return []


def leaves(value) -> int:
    if isinstance(value, dict):
        return sum(map(leaves, value.values()))
    if isinstance(value, list):
        return sum(map(leaves, value))
    return 1


@pytest.fixture
def wired(pulumi: Pulumi, cluster, kube, tmp_path) -> Pulumi:
    yield consumer_project(pulumi, cluster, tmp_path, wired_program())
    destroy_leftovers(pulumi)


def test_a_preview_shows_the_serving_objects_but_the_image_and_up_fills_it(wired: Pulumi, kube):
    preview = wired.json("preview")
    creates = {s["urn"].rsplit("::", 1)[-1]: s["newState"] for s in preview["steps"]
               if s.get("op") == "create" and s.get("newState", {}).get("type", "").startswith(
                   "kubernetes:")}
    unknown = {name: unknown_places(state.get("inputs") or {}) for name, state in creates.items()}
    print("\npreview (fields known/unknown): " + "; ".join(
        f"{n} {leaves(creates[n].get('inputs') or {}) - len(p)}/{len(p)}"
        for n, p in sorted(unknown.items())))
    vllm = "spec/template/spec/containers/vllm"
    assert unknown["kimi-serving-statefulset"] == [f"{vllm}/env/K3_ENGINE_IMAGE/value",
                                                   f"{vllm}/image"]
    sts = creates["kimi-serving-statefulset"]["inputs"]
    assert sts["spec"]["serviceName"] == "kimi-headless"
    assert sts["spec"]["template"]["spec"]["containers"][0]["args"][0].startswith("/")
    assert unknown["kimi-weights-job"] == ["spec/template/spec/containers/prefetch/image"]
    # The objects the image does not reach preview whole.
    for name in ("kimi-serving-svc-kimi", "kimi-serving-svc-kimi-headless", "kimi-serving-pdb",
                 "kimi-api-key", "kimi-namespace"):
        assert unknown[name] == [], name

    wired.run("up", "--yes", show=8)
    _dyn, core = kube
    from kubernetes import client
    live = client.AppsV1Api(core.api_client).read_namespaced_stateful_set("kimi", "inference")
    (vllm_container,) = [c for c in live.spec.template.spec.containers if c.name == "vllm"]
    assert vllm_container.image == IMAGE
    env = {e.name: e.value for e in vllm_container.env}
    assert env["K3_ENGINE_IMAGE"] == IMAGE
    wired.run("destroy", "--yes", show=5)
