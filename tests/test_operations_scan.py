"""The operations objects against real validators: kubernetes-validate (OpenAPI schemas of
real Kubernetes releases, strict: unknown fields fail) for the built-in kinds, field lists
of the Prometheus Operator API for its CRDs (kubernetes-validate has no CRD schemas), and
checkov, whose CKV2_K8S_6 ("pods which lack an associated NetworkPolicy") must pass for
the serving and prefetch pods only because of these policies."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from k3infra.render import write_render

from conftest import GOOD_REVISION, ROOT, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
ALL = ('monitoring={"serviceMonitor": true, "prometheusRule": true, "dashboard": true}',
       'network={"allowFromNamespaces": ["ingress-nginx"], "allowFromPodLabels": {"role": "client"}}',
       'benchmark={"enabled": true}')
# Oldest and newest Kubernetes minor the schemas ship; NetworkPolicy v1 is GA in both.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
OPERATIONS_KINDS = {"NetworkPolicy", "ServiceMonitor", "PrometheusRule"}
# Prometheus Operator API (monitoring.coreos.com/v1), the fields k3infra may use.
SERVICEMONITOR_SPEC = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels",
                       "podTargetLabels", "sampleLimit"}
SERVICEMONITOR_ENDPOINT = {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout",
                           "honorLabels", "relabelings", "metricRelabelings"}
PROMETHEUSRULE_GROUP = {"name", "interval", "rules"}
PROMETHEUSRULE_RULE = {"alert", "record", "expr", "for", "keep_firing_for", "labels",
                       "annotations"}


def operations_manifests(r) -> list[dict]:
    # the engine build's own NetworkPolicy (build namespace) belongs to the engine tests
    out = [x for x in r.manifests() if x["kind"] in OPERATIONS_KINDS
           and x["metadata"].get("namespace") != "kimi-k3-build"]
    out += [x for x in r.manifests() if x["kind"] in ("Service", "ConfigMap")
            and x["metadata"]["name"] in ("kimi-k3-metrics", "kimi-k3-dashboard")]
    return out


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_kinds_validate_strictly(version):
    objs = [o for o in operations_manifests(render("existing", PIN, *ALL))
            if o["apiVersion"] in ("v1", "networking.k8s.io/v1")]
    # default deny, serving, prefetch, clients (allowFromPodLabels), benchmark, its reader
    assert sorted(o["kind"] for o in objs) == ["ConfigMap", *["NetworkPolicy"] * 6, "Service"]
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_would_catch_a_misspelt_field():
    policy = copy.deepcopy(manifest(render("existing", PIN), "NetworkPolicy", "kimi-k3-serving"))
    policy["spec"]["ingres"] = policy["spec"].pop("ingress")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, K8S_VERSIONS[-1], strict=True)


def test_crd_objects_use_only_prometheus_operator_fields():
    r = render("existing", PIN, *ALL)
    sm = manifest(r, "ServiceMonitor")
    assert set(sm["spec"]) <= SERVICEMONITOR_SPEC
    for endpoint in sm["spec"]["endpoints"]:
        assert set(endpoint) <= SERVICEMONITOR_ENDPOINT
        assert endpoint["scheme"] in ("http", "https")
    rule = manifest(r, "PrometheusRule")
    for group in rule["spec"]["groups"]:
        assert set(group) <= PROMETHEUSRULE_GROUP
        for item in group["rules"]:
            assert set(item) <= PROMETHEUSRULE_RULE
            assert all(isinstance(v, str) for v in item["labels"].values())
            assert all(isinstance(v, str) for v in item["annotations"].values())
    for obj in (sm, rule):
        assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
        assert obj["metadata"]["namespace"] == "kimi-k3"


def _checkov() -> str:
    for candidate in (os.environ.get("K3INFRA_CHECKOV"), str(ROOT / ".venv-scan/bin/checkov"),
                      shutil.which("checkov")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.skip("checkov not installed (make test installs it into .venv-scan)")


def _scan(directory: Path) -> dict[str, list[dict]]:
    proc = subprocess.run([_checkov(), "-d", str(directory), "--framework", "kubernetes",
                           "-o", "json", "--compact", "--skip-download"],
                          capture_output=True, text=True, timeout=600)
    assert proc.stdout, proc.stderr
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    results: dict[str, list[dict]] = {"passed": [], "failed": []}
    for report in reports:
        for key in results:
            results[key] += report.get("results", {}).get(f"{key}_checks", [])
    return results


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ops-render")
    write_render(render("existing", PIN, *ALL), out)
    return out / "manifests"


@pytest.fixture(scope="module")
def scanned(rendered) -> dict[str, list[dict]]:
    return _scan(rendered)


def test_checkov_finds_nothing_on_the_operations_objects(scanned):
    failed = scanned["failed"]
    ours = [f"{c['check_id']} {c['resource']}" for c in failed
            if c["resource"].split(".")[0] in OPERATIONS_KINDS
            or c["resource"] in ("Service.k3.kimi-k3-metrics", "ConfigMap.k3.kimi-k3-dashboard")]
    assert ours == []


def _network_policy_check(results: dict, outcome: str) -> set[str]:
    """Pods CKV2_K8S_6 reported with this outcome, by their component label."""
    return {c["resource"].split("app.kubernetes.io/component-")[1].split(".")[0]
            for c in results[outcome] if c["check_id"] == "CKV2_K8S_6"}


def test_every_pod_has_a_network_policy_and_would_not_without_ours(rendered, scanned, tmp_path):
    pods = {"serving", "weights-prefetch", "benchmark"}
    assert _network_policy_check(scanned, "passed") >= pods
    assert not _network_policy_check(scanned, "failed")
    # Control: the same pods without the policies fail the check.
    for path in rendered.glob("*.yaml"):
        if yaml.safe_load(path.read_text())["kind"] != "NetworkPolicy":
            shutil.copy(path, tmp_path / path.name)
    assert _network_policy_check(_scan(tmp_path), "failed") >= pods
