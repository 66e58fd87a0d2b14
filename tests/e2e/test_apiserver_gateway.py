"""The inference gateway's objects against their pinned CRD schemas, on the real API
server: Gateway and HTTPRoute (Gateway API, standard channel), InferencePool (the
Inference Extension), SecurityPolicy (Envoy Gateway) and ScaledObject (KEDA), from
tools/testbed/gatewaycrds/build.sh. The server validates each rendered object (OpenAPI
schema and CEL rules) on create; objects broken on purpose show it really does.

The CRDs are cluster-wide: this module installs them once (skipping any already there)."""

from __future__ import annotations

import copy
import time
import uuid
from pathlib import Path

import pytest

pytest_plugins = ["apiserver"]
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = "gateway-crds"
PLURALS = {"Gateway": "gateways", "HTTPRoute": "httproutes", "InferencePool": "inferencepools",
           "SecurityPolicy": "securitypolicies", "ScaledObject": "scaledobjects"}
ESTABLISHED_S = 60.0


def _render_objects() -> list[dict]:
    import sys

    sys.path.insert(0, str(REPO / "tests"))
    from conftest import render

    r = render("existing", "gateway.enabled=true", "gateway.className=eg", "replicas=3",
               'autoscaling={"enabled": true, "min": 2, "max": 4, '
               '"prometheusUrl": "http://prometheus.monitoring.svc:9090"}')
    kinds = {"Gateway", "HTTPRoute", "InferencePool", "SecurityPolicy", "ScaledObject"}
    return [copy.deepcopy(m) for m in r.manifests() if m["kind"] in kinds]


@pytest.fixture(scope="module")
def crds(cluster):
    """Install the pinned CRDs (those not yet there) and wait until they are served."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    paths = sorted((cluster.bin_dir / CRD_DIR).glob("*.yaml"))
    if not paths:
        pytest.fail(f"no CRDs in {cluster.bin_dir / CRD_DIR}: run tools/testbed/build.sh "
                    "(its gatewaycrds part)")
    names = []
    with cluster.api_client() as api_client:
        ext = client.ApiextensionsV1Api(api_client)
        for path in paths:
            crd = yaml.safe_load(path.read_text())
            names.append(crd["metadata"]["name"])
            try:
                ext.create_custom_resource_definition(crd)
            except ApiException as exc:
                if exc.status != 409:
                    raise
        deadline = time.monotonic() + ESTABLISHED_S
        for name in names:
            while not any(c.type == "Established" and c.status == "True" for c in
                          ext.read_custom_resource_definition(name).status.conditions or []):
                if time.monotonic() > deadline:
                    pytest.fail(f"CRD {name} not Established after {ESTABLISHED_S:.0f} s")
                time.sleep(0.25)
    return names


@pytest.fixture
def namespace(cluster):
    from kubernetes import client

    name = f"e2e-gateway-{uuid.uuid4().hex[:8]}"
    with cluster.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        yield name
        core.delete_namespace(name)


def _create(cluster, namespace: str, obj: dict) -> dict:
    from kubernetes import client

    group, version = obj["apiVersion"].split("/")
    plural = PLURALS[obj["kind"]]
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    with cluster.api_client() as api_client:
        return client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            group, version, namespace, plural, obj)


def _kept(sent, stored) -> bool:
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(k in stored and _kept(v, stored[k])
                                                for k, v in sent.items())
    if isinstance(sent, list):
        return (isinstance(stored, list) and len(sent) == len(stored)
                and all(_kept(a, b) for a, b in zip(sent, stored)))
    return sent == stored


def test_crds_installed_are_the_pinned_ones(crds):
    assert set(crds) == {"gateways.gateway.networking.k8s.io",
                         "httproutes.gateway.networking.k8s.io",
                         "inferencepools.inference.networking.k8s.io",
                         "securitypolicies.gateway.envoyproxy.io",
                         "scaledobjects.keda.sh"}


def test_rendered_gateway_objects_are_accepted(cluster, crds, namespace):
    objects = _render_objects()
    assert sorted(o["kind"] for o in objects) == [
        "Gateway", "HTTPRoute", "InferencePool", "ScaledObject", "SecurityPolicy"]
    for obj in objects:
        created = _create(cluster, namespace, obj)
        # Pruning drops fields a schema does not know: everything written was kept
        # (the server may add defaults).
        assert _kept(obj["spec"], created["spec"]), (obj["kind"], created["spec"])


@pytest.mark.parametrize("kind,breaks", [
    ("InferencePool", lambda o: o["spec"].update(targetPorts=[])),
    ("InferencePool", lambda o: o["spec"]["endpointPickerRef"].update(failureMode="Sometimes")),
    ("HTTPRoute", lambda o: o["spec"]["rules"][0]["matches"][0].update(method="BREW")),
    ("Gateway", lambda o: o["spec"]["listeners"][0].update(port=0)),
    ("SecurityPolicy", lambda o: o["spec"]["apiKeyAuth"].pop("credentialRefs")),
    ("ScaledObject", lambda o: o["spec"].pop("scaleTargetRef")),
])
def test_broken_objects_are_refused(cluster, crds, namespace, kind, breaks):
    from kubernetes.client.exceptions import ApiException

    obj = next(o for o in _render_objects() if o["kind"] == kind)
    breaks(obj)
    with pytest.raises(ApiException) as exc:
        _create(cluster, namespace, obj)
    assert exc.value.status == 422, exc.value.body
