"""Safe updates: what the rollout procedure in docs/operations.md relies on.

- engine-path changes are refused unless `k3:profile: custom` (every receipt flag and env
  variable, not one example), before anything is registered;
- operations-only changes (monitoring, network) never touch the StatefulSet, so they
  never restart a 1.5 TB load; allow-listed surface changes touch only its pod template;
- the StatefulSet rolls one pod (= one node) at a time, drains before SIGTERM and gives
  the drain and shutdown time inside the grace period.
"""
from __future__ import annotations

import json

import pytest

from k3infra.config import ConfigError
from k3infra.serving import manifests as m

from conftest import GOOD_REVISION, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"


def _engine_flags(receipt) -> list[tuple[str, object]]:
    return [(a.flag, a.value if a.value is not None else True) for a in receipt.serve.engine_args]


def test_every_receipt_engine_flag_is_refused_as_a_surface_change(receipt):
    for flag, value in _engine_flags(receipt):
        with pytest.raises(ConfigError) as exc:
            render("existing", PIN, "surface=" + json.dumps({"args": {flag: value}}))
        assert exc.value.key == f"k3:surface.args.{flag}"
        assert "profile = custom" in str(exc.value)


def test_every_receipt_engine_env_is_refused_as_a_surface_change(receipt):
    for name in receipt.serve.engine_env_map():
        with pytest.raises(ConfigError) as exc:
            render("existing", PIN, "surface=" + json.dumps({"env": {name: "x"}}))
        assert exc.value.key == f"k3:surface.env.{name}"


def test_engine_path_changes_without_profile_custom_are_refused():
    with pytest.raises(ConfigError) as exc:
        render("existing", PIN, 'custom={"args": ["--max-num-seqs", "16"]}')
    assert exc.value.key == "k3:custom" and "k3:profile = custom" in str(exc.value)


def test_profile_custom_carries_the_change_and_labels_it_not_measured(receipt):
    r = render("existing", PIN, "profile=custom", 'custom={"args": ["--max-num-seqs", "16"]}')
    sts = manifest(r, "StatefulSet")
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    n = len(receipt.serve.engine_arg_tokens())
    assert args[1:1 + n] == receipt.serve.engine_arg_tokens()      # the receipt's flags stay
    assert args[1 + n:3 + n] == ["--max-num-seqs", "16"]
    note = sts["spec"]["template"]["metadata"]["annotations"]
    assert note["k3infra.dev/measured-configuration"] == "false"
    assert any(w.startswith("k3:profile") for w in r.warnings)


def test_operations_changes_never_touch_the_statefulset():
    base = manifest(render("existing", PIN), "StatefulSet")
    changed = render("existing", PIN,
                     'monitoring={"serviceMonitor": true, "prometheusRule": true, '
                     '"dashboard": true, "p99MarginPct": 25}',
                     'network={"allowFromNamespaces": ["gateway"], "scraperNamespace": "obs"}')
    assert manifest(changed, "StatefulSet") == base


def test_a_surface_change_only_changes_the_pod_template():
    before = render("existing", PIN)
    after = render("existing", PIN, 'surface={"args": {"--uvicorn-log-level": "warning"}}')
    sts_before, sts_after = manifest(before, "StatefulSet"), manifest(after, "StatefulSet")
    assert sts_before["spec"]["template"] != sts_after["spec"]["template"]     # a rollout
    for key in set(sts_before["spec"]) - {"template"}:
        assert sts_before["spec"][key] == sts_after["spec"][key], key
    assert _others(before) == _others(after)


def _others(r) -> dict:
    """Every object but the StatefulSet, by kind and name (registration order varies)."""
    return {(x["kind"], x["metadata"]["name"]): x for x in r.manifests()
            if x["kind"] != "StatefulSet"}


def test_rolling_update_goes_one_pod_at_a_time():
    spec = manifest(render("existing", PIN, "replicas=3", 'rollout={"gate": false}'),
                    "StatefulSet")["spec"]
    # RollingUpdate without maxUnavailable: the controller replaces one pod, waits for it
    # to be Ready, then the next (podManagementPolicy affects scaling only).
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert spec["replicas"] == 3
    # The benchmark gate (on by default with 2 or more replicas) holds all but the canary;
    # its promotion lowers the partition to 0 (tests/test_rollout.py).
    gated = manifest(render("existing", PIN, "replicas=3"), "StatefulSet")["spec"]
    assert gated["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}


def test_disruptions_are_one_node_at_a_time():
    r = render("existing", PIN, "replicas=3")
    pdb = manifest(r, "PodDisruptionBudget")["spec"]
    assert pdb["maxUnavailable"] == 1
    pod_labels = manifest(r, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in pdb["selector"]["matchLabels"].items())


def test_drain_and_shutdown_fit_in_the_grace_period():
    for grace in (60, 180, 600):
        pod = manifest(render("existing", PIN, f'serving={{"terminationGraceSeconds": {grace}}}'),
                       "StatefulSet")["spec"]["template"]["spec"]
        pre_stop = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert pod["terminationGracePeriodSeconds"] == grace
        assert pre_stop + m.SHUTDOWN_SECONDS <= grace   # time is left for vLLM after the drain


def test_grace_period_shorter_than_the_floor_is_refused():
    with pytest.raises(ConfigError) as exc:
        render("existing", PIN, 'serving={"terminationGraceSeconds": 10}')
    assert exc.value.key == "k3:serving.terminationGraceSeconds"
