"""Each policy of the pack, called the way CrossGuard calls it: pulumi-policy's own
`ResourceValidationArgs` / `StackValidationArgs` / `PolicyResource`, built from a real
render's recorded inputs, once as rendered (passes) and once broken (fails)."""
from __future__ import annotations

import copy
import json

import pytest
from pulumi_policy import (EnforcementLevel, PolicyResource, ResourceValidationArgs,
                           ResourceValidationPolicy, StackValidationArgs, StackValidationPolicy)
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError

from k3infra.policies import POLICIES, level, policy
from k3infra.policies.runner import (check_plan, loaded_stack_config, policy_resources,
                                     reconcile_config, resource_options, wire_props)

from conftest import render
from policy_corpus import (CORPUS, MULTI_NODE_CORPUS, R, affinity_values, pod_spec, prefetch,
                           vllm)

CUSTOM = ("k3:profile=custom",
          'k3:custom={"args": ["--enforce-eager"], "env": {"VLLM_USE_V1": "1"}}')
ADVISORY = {"k3-serve-flags-custom", "k3-tree-digest-custom", "k3-license-acknowledged",
            "k3-receipt-measured"}


@pytest.fixture(scope="module")
def plan() -> dict:
    return render("existing").plan()


def violations(p, plan: dict, config: dict | None = None) -> list[tuple[str, str | None]]:
    """Run one policy over a plan with pulumi-policy's argument types; (message, urn)."""
    found: list[tuple[str, str | None]] = []
    config = config if config is not None else reconcile_config([p])[p.name].config

    def report(message: str, urn: str | None = None) -> None:
        found.append((message, urn))

    with loaded_stack_config(plan["config"]):
        if isinstance(p, ResourceValidationPolicy):
            for r in plan["resources"]:
                args = ResourceValidationArgs(r["type"], wire_props(r["inputs"]), r["urn"],
                                              r["name"], resource_options(r), None, config)
                p.validate(args, report)
        else:
            p.validate(StackValidationArgs(policy_resources(plan), config), report)
    return found


def test_every_policy_is_described_and_leveled():
    names = [p.name for p in POLICIES]
    assert len(names) == len(set(names)) and len(names) >= 19
    # The receipt's figures as literals (k3infra/receipt/*.yaml), not re-derived here.
    facts = ["kimi-k3-8xb300-2026-07-29", "f68f4fdd",
             "sha256:ebf0b1a75a29ab5e01f319252302c418d0e8f9340e402950497094a6fc64aced",
             "moonshotai/Kimi-K3", "NVIDIA-B300-SXM6-AC", "1561 GB", "8", "Kimi K3 License",
             "175.40 GiB",
             "--tensor-parallel-size 8 --enable-expert-parallel --max-model-len 40960 "
             "--moe-backend marlin --kda-prefill-backend triton --disable-custom-all-reduce "
             "--block-size 128"]
    for p in POLICIES:
        assert p.name.startswith("k3-") and len(p.description) > 80, p.name
        assert any(fact in p.description for fact in facts), f"{p.name} cites no receipt fact"
        expected = EnforcementLevel.ADVISORY if p.name in ADVISORY else EnforcementLevel.MANDATORY
        assert level(p) == expected, p.name


def test_every_mandatory_policy_has_a_corpus_variant():
    mandatory = {p.name for p in POLICIES if level(p) == EnforcementLevel.MANDATORY}
    # The multi-node policies' variants mutate the multi-node render (tests/test_multinode.py).
    assert mandatory == {v.policy for v in CORPUS} | {v.policy for v in MULTI_NODE_CORPUS}


@pytest.mark.parametrize("name", sorted({v.policy for v in CORPUS}))
def test_policy_passes_the_render_and_fails_its_variants(plan, name):
    p = policy(name)
    assert violations(p, plan) == []
    for v in (v for v in CORPUS if v.policy == name):
        found = violations(p, v.apply(plan))
        assert found, f"{name} missed {v.id}"
        assert all(isinstance(m, str) and m for m, _ in found)
        if isinstance(p, StackValidationPolicy):
            urns = {r["urn"] for r in plan["resources"]}
            assert all(u is None or u in urns for _, u in found)


def test_policies_take_plain_dict_props_too(plan):
    """Unit callers may pass plain inputs; the proxies are not required."""
    sts = next(r for r in plan["resources"] if r["type"].endswith("StatefulSet"))
    broken = copy.deepcopy(sts["inputs"])
    broken["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:latest"
    found = []
    policy("k3-image-digest").validate(
        ResourceValidationArgs(sts["type"], broken, sts["urn"], sts["name"],
                               resource_options(sts), None), lambda m, u=None: found.append(m))
    assert found and "latest" in found[0]


# --- profile custom: the engine-path checks become advisory and say so ----------------------

def test_custom_profile_is_reported_by_the_advisory_twins():
    custom = render("existing", *CUSTOM).plan()
    assert violations(policy("k3-serve-flags"), custom) == []
    assert violations(policy("k3-tree-digest"), custom) == []
    flags = [m for m, _ in violations(policy("k3-serve-flags-custom"), custom)]
    assert any("--enforce-eager" in m and "NOT the measured" in m for m in flags)
    assert any("VLLM_USE_V1" in m for m in flags)
    # Without a lock of its own, a custom stack now holds the weights to the receipt's
    # digest too (issue 21): nothing for the digest twin to report.
    assert violations(policy("k3-tree-digest-custom"), custom) == []


def test_custom_profile_with_its_own_lock_is_reported_not_measured(tmp_path):
    from k3infra.weights import tree

    revision = render("existing", *CUSTOM).raw_config["k3:weightsRevision"]
    lock = tree.make_lock("moonshotai/Kimi-K3", revision, [
        tree.FileEntry("model-00001-of-00001.safetensors", 10, "1" * 64)])
    path = tmp_path / "lock.json"
    path.write_text(tree.lock_to_json(lock))
    custom = render("existing", *CUSTOM, f"weights.lockFile={path}").plan()
    assert violations(policy("k3-tree-digest"), custom) == []
    digest = [m for m, _ in violations(policy("k3-tree-digest-custom"), custom)]
    assert digest and all("NOT the measured tree" in m for m in digest)


def test_measured_stack_gets_nothing_from_the_advisory_twins(plan):
    assert violations(policy("k3-serve-flags-custom"), plan) == []
    assert violations(policy("k3-tree-digest-custom"), plan) == []


def test_relabelling_one_pod_custom_does_not_downgrade_the_stack(plan):
    broken = next(v for v in CORPUS if v.id == "relabelled_custom_to_dodge").apply(plan)
    assert violations(policy("k3-serve-flags"), broken)
    assert violations(policy("k3-serve-flags-custom"), broken) == []


# --- licence (advisory, with the thresholds) --------------------------------------------------

def test_license_policy_warns_with_the_thresholds_until_accepted(plan):
    found = violations(policy("k3-license-acknowledged"), plan)
    assert len(found) == 1
    for section in R.license.sections:
        assert section.text in found[0][0]
    accepted = copy.deepcopy(plan)
    accepted["config"]["k3:acceptModelLicense"] = True
    assert violations(policy("k3-license-acknowledged"), accepted) == []


# --- policy config (schema defaults, overrides, enforcement levels) --------------------------

def test_allowed_products_config_widens_the_product_set_but_not_hbm(plan):
    b200 = "NVIDIA-B200"
    broken = copy.deepcopy(plan)
    affinity_values(broken, [R.hardware.gpu_product_label, b200])
    wider = {"allowedProducts": [R.hardware.gpu_product_label, b200]}
    assert violations(policy("k3-gpu-product"), broken)
    assert violations(policy("k3-gpu-product"), broken, wider) == []
    assert any(b200 in m for m, _ in violations(policy("k3-hbm-fit"), broken))


def test_startup_budget_uses_the_configured_storage_throughput(plan):
    p = policy("k3-startup-budget")
    assert violations(p, plan, {"storageReadGBps": 100.0}) == []
    slow = violations(p, plan, {"storageReadGBps": 0.25})
    assert slow and "startupProbe allows" in slow[0][0]


def test_startup_budget_follows_the_stack_serving_config(plan):
    slower = copy.deepcopy(plan)
    slower["config"]["k3:serving"] = {"storageReadGBps": 0.25}
    assert violations(policy("k3-startup-budget"), slower)


def test_host_path_allowed_paths_config(plan):
    broken = next(v for v in CORPUS if v.id == "docker_socket").apply(plan)
    assert violations(policy("k3-host-path"), broken)
    assert violations(policy("k3-host-path"), broken,
                      {"allowedPaths": ["/var/run/docker.sock"]}) == []


def test_node_local_weights_need_no_host_path(plan):
    """Node-local weights are local PersistentVolumes: even the weights root is not an
    allowed hostPath any more (issue 21: the serving namespace stays restricted)."""
    aws = render("aws").plan()
    assert aws["config"]["k3:weights"]["mode"] == "node-local"
    assert violations(policy("k3-host-path"), aws) == []
    mounted = copy.deepcopy(aws)
    vllm(mounted).setdefault("volumeMounts", []).append({"name": "nvme", "mountPath": "/nvme"})
    pod_spec(mounted)["volumes"].append({"name": "nvme", "hostPath": {"path": "/mnt/k3-weights"}})
    assert violations(policy("k3-host-path"), mounted)


def test_extra_secret_patterns_config(plan):
    leaked = copy.deepcopy(plan)
    vllm(leaked)["env"].append({"name": "SERVED_BY", "value": "acme-tok-12345678"})
    assert violations(policy("k3-no-literal-secrets"), leaked) == []
    assert violations(policy("k3-no-literal-secrets"), leaked,
                      {"extraPatterns": [r"acme-tok-\d{8}"]})


def test_credential_shaped_names_need_a_secret_ref_but_paths_and_switches_pass(plan):
    ok = copy.deepcopy(plan)
    env = vllm(ok)["env"]
    env += [{"name": "HF_TOKEN_PATH", "value": "/secrets/hf/token"},
            {"name": "HF_HUB_DISABLE_IMPLICIT_TOKEN", "value": "1"},
            {"name": "TOKENIZERS_PARALLELISM", "value": "false"}]
    assert violations(policy("k3-no-literal-secrets"), ok) == []
    bad = copy.deepcopy(plan)
    vllm(bad)["env"].append({"name": "HF_TOKEN", "valueFrom": {
        "configMapKeyRef": {"name": "cm", "key": "token"}}})
    assert any("configMapKeyRef" in m for m, _ in violations(policy("k3-no-literal-secrets"), bad))


def test_pack_config_sets_levels_and_refuses_unknown_names(plan):
    broken = next(v for v in CORPUS if v.id == "no_network_policy").apply(plan)
    # Without any NetworkPolicy the serving pods' exposure is everything: both policies.
    report = check_plan(broken, pack_config={"k3-network-policy": "advisory",
                                             "k3-network-exposure": "advisory"})
    assert not report.mandatory and report.by_policy("k3-network-policy")[0].level == "advisory"
    report = check_plan(broken, pack_config={"k3-network-policy": {"enforcementLevel": "disabled"}})
    assert not report.by_policy("k3-network-policy")
    report = check_plan(broken, pack_config={"all": "advisory", "k3-network-policy": "mandatory"})
    assert [f.policy for f in report.mandatory] == ["k3-network-policy"]
    with pytest.raises(ValueError, match="k3-no-such-policy"):
        check_plan(plan, pack_config={"k3-no-such-policy": "advisory"})
    with pytest.raises(ValueError, match="unknown property"):
        check_plan(plan, pack_config={"k3-gpu-product": {"allowedGpus": ["x"]}})


# --- what CrossGuard hands a policy ----------------------------------------------------------

def test_props_arrive_as_crossguard_sees_them(plan):
    sts = next(r for r in plan["resources"] if r["type"].endswith("StatefulSet"))
    props = wire_props(sts["inputs"])
    probe = props["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert isinstance(probe["failureThreshold"], float)     # protobuf numbers
    assert not isinstance(props, dict)                       # the read-only proxy


def test_unknown_values_in_a_preview_cannot_run_and_are_advisory(plan):
    preview = copy.deepcopy(plan)
    vllm(preview)["image"] = UNKNOWN_STRING_VALUE     # an image digest from a build not yet run
    with pytest.raises(UnknownValueError):
        violations(policy("k3-image-digest"), preview)
    report = check_plan(preview)
    stuck = report.by_policy("k3-image-digest")
    assert stuck and all(f.could_not_run and f.level == "advisory" for f in stuck)
    assert not report.mandatory


def test_stack_resources_carry_parents_and_dependencies(plan):
    res = {r.urn: r for r in policy_resources(plan)}
    sts = next(r for r in res.values() if r.resource_type.endswith("StatefulSet"))
    job = prefetch(plan)["urn"]
    assert isinstance(sts.parent, PolicyResource) and job in {d.urn for d in sts.dependencies}


def test_gpu_product_accepts_a_node_selector_pin(plan):
    pinned = copy.deepcopy(plan)
    spec = pod_spec(pinned)
    del spec["affinity"]["nodeAffinity"]
    spec["nodeSelector"] = {"nvidia.com/gpu.product": R.hardware.gpu_product_label}
    assert violations(policy("k3-gpu-product"), pinned) == []
    assert violations(policy("k3-hbm-fit"), pinned) == []


def test_runner_report_is_json_serialisable(plan):
    report = check_plan(plan)
    json.dumps([f.__dict__ for f in report.findings])
    assert report.resources == len(plan["resources"]) and report.policies == [p.name for p in POLICIES]


@pytest.mark.parametrize("variant", ["prefetch_egress_to_instance_metadata",
                                     "prefetch_except_narrowed_past_instance_metadata",
                                     "prefetch_egress_into_the_cluster"])
def test_a_hand_edit_that_opens_instance_metadata_is_refused_naming_it(plan, variant):
    """Issue 48: reachability of 169.254.169.254 judged by the addresses each block admits
    (its cidr less its excepts), whatever rule or object carries it."""
    v = next(v for v in CORPUS if v.id == variant)
    [(message, _)] = violations(policy("k3-network-exposure"), v.apply(plan))
    assert "Job kimi-k3-weights-prefetch" in message and "its pods may reach ipBlock " in message
    assert "(the instance metadata service, 169.254.169.254" in message, message


@pytest.mark.parametrize("peer, reached", [
    ({"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}}, False),
    ({"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/24"]}}, True),
    ({"ipBlock": {"cidr": "169.254.169.254/32"}}, True),
    ({"ipBlock": {"cidr": "169.0.0.0/8", "except": ["169.254.169.0/24"]}}, False),
    ({"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}}, False),
    ({"podSelector": {}}, False),
])
def test_metadata_reachability_is_containment_less_excepts(peer, reached):
    from ipaddress import ip_address

    from k3infra.policies.exposure import _peer, reaches

    assert reaches(_peer(peer, "k3"), ip_address("169.254.169.254")) is reached
