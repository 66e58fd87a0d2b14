"""K3ServingStack as a component in someone else's program: every wireable arg takes an
Output of another resource, an explicit provider reaches every child, names derive from
the instance, children record their own dependencies, and wired values are validated
inside apply with the messages plain values get."""
from __future__ import annotations

import asyncio
import json

import pulumi
import pulumi_kubernetes as k8s
import pytest
from pulumi.output import Unknown

from k3infra import naming
from k3infra.config import ConfigError, parse_stack_config
from k3infra.inputs import WIREABLE
from k3infra.receipt import load_receipt
from k3infra.stack import K3ServingStack

from conftest import GOOD_REVISION
from program_harness import record

IMAGE = "registry.example.com/k3/vllm-k3@sha256:" + "5e" * 32
# A pinned proxy image: these programs run as an update, where a placeholder is refused.
PINNED = {"serving": {"proxyImage": "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:"
                                    + "cd" * 32}}
AWS_WIRED = {"clusterName": "prod-eks",
             "nodeRoleArn": "arn:aws:iam::123456789012:role/eks-node",
             "subnetId": "subnet-0123456789abcdef0",
             "securityGroupId": "sg-0123456789abcdef0"}


def source(name: str, values: dict) -> tuple[pulumi.CustomResource, dict]:
    """Stands for any resource whose outputs a user wires in (an EKS cluster, a build, a
    random password): per key, an Output that resolves once the resource is registered."""
    res = pulumi.CustomResource("test:index:Source", name, dict(values))
    return res, {k: res.urn.apply(lambda _u, v=v: v) for k, v in values.items()}


def wired_args(o: dict, **over) -> dict:
    args = {
        "weightsRevision": o["revision"], "apiKey": pulumi.Output.secret(o["password"]),
        "hfToken": o["token"], "engineImage": o["image"], "acceptModelLicense": True, **PINNED,
        "nodePool": {"provider": "aws", "aws": {
            "clusterName": o["clusterName"], "nodeRoleArn": o["nodeRoleArn"],
            "subnets": [{"id": o["subnetId"], "availabilityZone": "us-east-1b"}],
            "securityGroupIds": [o["securityGroupId"]]}},
    }
    args.update(over)
    return args


def _values(**over) -> dict:
    return {"revision": GOOD_REVISION, "password": "sk-generated", "token": "hf_generated",
            "image": IMAGE, **AWS_WIRED, **over}


def _wired_program(holder: dict, **values):
    def program():
        _, o = source("upstream", _values(**values))
        k8s_provider = k8s.Provider("target-cluster", kubeconfig="{}")
        import pulumi_aws as aws
        aws_provider = aws.Provider("target-account", region="us-east-1")
        holder["stack"] = K3ServingStack(
            "kimi-k3", {**wired_args(o), "receipt": load_receipt()},
            pulumi.ResourceOptions(providers=[k8s_provider, aws_provider]))
        return pulumi.Output.all(*holder["stack"].outputs().values())
    return program


def test_every_wireable_arg_takes_an_output_and_the_provider_reaches_every_child():
    holder: dict = {}
    rec = record(_wired_program(holder))
    provider = rec.named("target-cluster")
    aws_provider = rec.named("target-account")
    kube = rec.kubernetes()
    assert len(kube) > 10
    for r in kube:
        assert r.provider and r.provider.startswith(provider.urn + "::"), (r.type, r.name)
    cloud = [r for r in rec.resources if r.type.startswith("aws:") and r.name != "target-account"]
    assert {r.type for r in cloud} == {"aws:ec2/launchTemplate:LaunchTemplate",
                                       "aws:eks/nodeGroup:NodeGroup"}
    for r in cloud:
        assert r.provider.startswith(aws_provider.urn + "::"), r.name

    # The wired values reach the objects they configure.
    (sts,) = rec.of_type("kubernetes:apps/v1:StatefulSet")
    ann = sts.inputs["metadata"]["annotations"]
    assert ann["k3infra.dev/weights-revision"] == GOOD_REVISION
    vllm = sts.inputs["spec"]["template"]["spec"]["containers"][0]
    assert vllm["image"] == IMAGE
    assert vllm["args"][0].endswith(f"/moonshotai--Kimi-K3/{GOOD_REVISION}")
    (group,) = rec.of_type("aws:eks/nodeGroup:NodeGroup")
    assert group.inputs["clusterName"] == "prod-eks"
    assert group.inputs["nodeRoleArn"] == AWS_WIRED["nodeRoleArn"]
    assert group.inputs["subnetIds"] == [AWS_WIRED["subnetId"]]
    (lt,) = rec.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert lt.inputs["networkInterfaces"][0]["securityGroups"] == [AWS_WIRED["securityGroupId"]]
    (job,) = [r for r in rec.of_type("kubernetes:batch/v1:Job") if "weights" in r.name]
    env = {e["name"]: e.get("value") for e in
           job.inputs["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["K3_REVISION"] == GOOD_REVISION
    secrets = {r.inputs["metadata"]["name"]: r for r in rec.of_type("kubernetes:core/v1:Secret")}
    assert set(secrets) == {"kimi-k3-api-key", "kimi-k3-hf-token"}


def test_the_wired_keys_are_the_ones_documented():
    """Every WIREABLE key is one a user wires from another resource; the test program
    above covers the ones of the AWS pool, the image, the revision and both secrets."""
    assert {"weightsRevision", "engineImage", "nodePool.aws.clusterName",
            "nodePool.aws.nodeRoleArn", "nodePool.aws.subnets[].id",
            "nodePool.aws.securityGroupIds[]"} <= set(WIREABLE)


def _plain_error(**raw) -> str:
    base = {"weightsRevision": GOOD_REVISION, "apiKey": "x", "engineImage": IMAGE}
    with pytest.raises(ConfigError) as err:
        parse_stack_config({**base, **raw}, receipt=load_receipt())
    return str(err.value)


def test_a_wired_value_is_validated_in_apply_with_the_plain_message():
    with pytest.raises(Exception) as err:
        record(_wired_program({}, revision="main"))
    assert _plain_error(weightsRevision="main") in str(err.value)


def test_a_wired_cloud_id_is_validated_in_apply_with_the_plain_message():
    with pytest.raises(Exception) as err:
        record(_wired_program({}, subnetId="subnet-XYZ"))
    assert "k3:nodePool.aws.subnets.id = 'subnet-XYZ'" in str(err.value)


def test_a_wired_placeholder_is_refused_by_an_update(monkeypatch):
    monkeypatch.setenv("K3INFRA_OFFLINE_RENDER", "1")     # ignored: not how a render is asked
    with pytest.raises(Exception) as err:
        record(_wired_program({}, revision="0" * 40))
    assert "refusing to update" in str(err.value)
    assert "k3:weightsRevision" in str(err.value)


def _unknown() -> pulumi.Output:
    """An Output whose value a preview does not know (a resource not created yet)."""
    loop = asyncio.get_event_loop()
    value, known = loop.create_future(), loop.create_future()
    value.set_result(None)
    known.set_result(False)
    return pulumi.Output(set(), value, known)


def _unknown_places(r) -> list[str]:
    """Where a preview's inputs hold an unknown, list items named by their `name`."""
    found = []

    def walk(v, at):
        if isinstance(v, Unknown):
            found.append("/".join(at))
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, (*at, k))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, (*at, x["name"] if isinstance(x, dict) and "name" in x else str(i)))
    walk(r.inputs, ())
    return sorted(found)


def test_a_preview_shows_every_field_but_the_ones_a_wired_value_fills():
    """Every wireable value unknown (a preview before its source exists): each object is
    known but for the leaves those values reach; objects they do not reach are whole."""
    def program():
        o = {k: _unknown() for k in ("revision", "image", "clusterName", "nodeRoleArn",
                                     "subnetId", "securityGroupId")}
        K3ServingStack("kimi-k3", {**wired_args({**o, "password": "sk-1", "token": "hf_1"}),
                                   "receipt": load_receipt()})
    rec = record(program, preview=True)
    unknown = {r.name: _unknown_places(r) for r in rec.resources}
    vllm = "spec/template/spec/containers/vllm"
    assert unknown["kimi-k3-serving-statefulset"] == [
        "metadata/annotations/k3infra.dev/weights-revision",
        "spec/template/metadata/annotations/k3infra.dev/weights-revision",
        f"{vllm}/args/0",
        *(f"{vllm}/env/{e}/value" for e in ("K3_ENGINE_IMAGE", "K3_GATE_LOCK", "K3_LOCK",
                                            "K3_REVISION", "K3_TREE")),
        f"{vllm}/image"]
    prefetch = "spec/template/spec/containers/prefetch"
    assert unknown["kimi-k3-weights-job"] == [
        *(f"{prefetch}/env/{e}/value" for e in ("K3_LOCK", "K3_REVISION", "K3_TREE")),
        f"{prefetch}/image"]
    assert unknown["kimi-k3-serving-prepull"] == [
        "spec/template/spec/containers/engine-image/image"]
    assert unknown["kimi-k3-pool-nodegroup"] == [
        "clusterName", "launchTemplate/version", "nodeRoleArn", "subnetIds/0"]
    # Services, the disruption budget, NetworkPolicies, Secrets: nothing wired reaches them.
    untouched = [n for n in unknown if n.startswith(("kimi-k3-serving-svc", "kimi-k3-serving-pdb",
                                                     "kimi-k3-operations-netpol"))]
    assert len(untouched) == 6 and all(unknown[n] == [] for n in untouched)
    (sts,) = rec.of_type("kubernetes:apps/v1:StatefulSet")
    assert sts.inputs["spec"]["replicas"] == 1


def test_a_resolved_value_that_decides_more_than_its_fields_fails_naming_the_keys():
    """A builder whose output depends on the real value beyond the leaves the stand-ins
    showed (here: an extra key for one revision) cannot be previewed honestly: the update
    fails, naming the wired key, rather than apply what the preview did not show."""
    from k3infra.inputs import stack_inputs
    from k3infra.kube import apply_built

    def program():
        _, o = source("upstream", _values())
        inputs = stack_inputs({"weightsRevision": o["revision"], "apiKey": "x",
                               "engineImage": IMAGE}, load_receipt())

        def build(c):
            data = {"revision": c.weights_revision}
            if c.weights_revision.startswith(GOOD_REVISION[:4]):
                data["extra"] = "only for the real value"
            return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"},
                    "data": data}
        apply_built("probe", inputs, build)
    with pytest.raises(Exception) as err:
        record(program)
    assert ("k3:weightsRevision = '<Output>': the resolved value changes data beyond the "
            "fields it fills") in str(err.value)


def test_a_structural_key_refuses_an_output():
    def program():
        _, o = source("upstream", {"n": 2, **_values()})
        K3ServingStack("kimi-k3", {"weightsRevision": GOOD_REVISION, "apiKey": "x",
                                   "engineImage": IMAGE, "replicas": o["n"],
                                   "receipt": load_receipt()})
    with pytest.raises(ConfigError) as err:
        record(program)
    assert str(err.value).startswith("k3:replicas = '<Output>': must be a plain value")


# --- names -----------------------------------------------------------------------------

def _names(rec) -> set[tuple[str, str, str]]:
    return {(r.type, r.inputs["metadata"].get("namespace", ""), r.inputs["metadata"]["name"])
            for r in rec.kubernetes()}


@pytest.mark.parametrize("extra", [
    {},
    {"nodePool": {"provider": "coreweave", "localNvmeGB": 30000},
     "weights": {"mode": "node-local"},
     "engine": {"build": "in-cluster", "registry": "registry.example.com/k3/vllm",
                "registrySecret": "push"}, "engineImage": None},
], ids=["existing-shared-prebuilt", "coreweave-nodelocal-incluster"])
def test_two_instances_share_no_kubernetes_object(extra):
    extra = {k: v for k, v in extra.items() if v is not None}

    def program():
        for name in ("kimi-a", "kimi-b"):
            args = {"weightsRevision": GOOD_REVISION, "apiKey": "x", "acceptModelLicense": True,
                    "hfToken": "hf", "benchmark": {"enabled": True},
                    "monitoring": {"serviceMonitor": True, "prometheusRule": True,
                                   "dashboard": True}, **extra}
            if args.get("engine", {}).get("build", "prebuilt") == "prebuilt":
                args["engineImage"] = IMAGE
            K3ServingStack(name, {**args, "receipt": load_receipt(), "offlineRender": True})

    rec = record(program)
    a = {n for n in _names(rec) if "kimi-a" in (n[1] + n[2])}
    b = _names(rec) - a
    assert a and b and len(a) == len(b)
    assert not a & b
    # Each instance's objects sit in its own namespace, named after it.
    assert {ns for _, ns, _ in a} - {""} <= {"kimi-a", "kimi-a-build"}
    selectors = [r.inputs["spec"]["selector"]["matchLabels"]
                 for r in rec.of_type("kubernetes:apps/v1:StatefulSet")]
    assert sorted(s["app.kubernetes.io/instance"] for s in selectors) == ["kimi-a", "kimi-b"]


def test_pool_nodes_and_serving_affinity_carry_the_instance():
    def program():
        for name in ("kimi-a", "kimi-b"):
            K3ServingStack(name, {"weightsRevision": GOOD_REVISION, "apiKey": "x",
                                  "engineImage": IMAGE, "nodePool": {"provider": "coreweave"},
                                  "receipt": load_receipt()})
    rec = record(program, preview=True)
    pools = rec.of_type("kubernetes:compute.coreweave.com/v1alpha1:NodePool")
    assert sorted(p.inputs["spec"]["nodeLabels"]["k3infra.dev/pool"] for p in pools) == \
        ["kimi-a", "kimi-b"]
    for sts in rec.of_type("kubernetes:apps/v1:StatefulSet"):
        name = sts.inputs["metadata"]["name"]
        terms = sts.inputs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": "k3infra.dev/pool", "operator": "In", "values": [name]} in \
            terms[0]["matchExpressions"]


def test_the_longest_instance_name_fits_every_kubernetes_limit():
    name = "k" * naming.MAX_INSTANCE_LENGTH
    assert naming.MAX_INSTANCE_LENGTH == 37

    def program():
        K3ServingStack(name, {
            "weightsRevision": GOOD_REVISION, "apiKey": "x", "hfToken": "hf",
            "benchmark": {"enabled": True}, "monitoring": {"serviceMonitor": True,
                                                          "prometheusRule": True,
                                                          "dashboard": True},
            "engine": {"build": "in-cluster", "registry": "registry.example.com/k3/vllm",
                       "registrySecret": "push"}, "receipt": load_receipt(), "offlineRender": True})
    rec = record(program)
    longest = 0
    for r in rec.kubernetes():
        meta = r.inputs["metadata"]
        longest = max(longest, len(meta["name"]))
        assert len(meta["name"]) <= 63, meta["name"]
        for value in (meta.get("labels") or {}).values():
            assert len(value) <= 63, (meta["name"], value)
    assert longest == 63       # the engine's context ConfigMap: exactly at the limit


@pytest.mark.parametrize("name, why", [
    ("k" * 38, "is 38 characters; at most 37"),
    ("Kimi", "must be a DNS-1035 label"),
    ("9kimi", "must be a DNS-1035 label"),
])
def test_an_instance_name_that_cannot_prefix_every_name_is_refused(name, why):
    with pytest.raises(ConfigError) as err:
        naming.check_instance_name(name)
    assert str(err.value) == f"K3ServingStack name = {name!r}: " + str(err.value).split(": ", 1)[1]
    assert why in str(err.value)


# --- who owns the namespace --------------------------------------------------------------

def _shared_namespace_program(**per_instance):
    """The user's own Namespace `inference`, then one instance per entry of
    `per_instance` (name -> extra args) in it, each depending on the user's Namespace."""
    def program():
        user_ns = k8s.core.v1.Namespace("inference", metadata={"name": "inference"})
        for name, extra in per_instance.items():
            K3ServingStack(name, {"weightsRevision": GOOD_REVISION, "apiKey": "x",
                                  "engineImage": IMAGE, "acceptModelLicense": True,
                                  "namespace": "inference", **PINNED, **extra,
                                  "receipt": load_receipt()},
                           pulumi.ResourceOptions(depends_on=[user_ns]))
    return program


def test_two_instances_in_one_user_namespace_register_no_namespace():
    rec = record(_shared_namespace_program(**{"kimi-a": {"createNamespace": False},
                                              "kimi-b": {"createNamespace": False}}),
                 preview=True)
    # The one Namespace is the user's; neither instance registers one.
    # (The root stack's URN is whatever stack the SDK's mocks last set up in this process.)
    namespaces = rec.of_type("kubernetes:core/v1:Namespace")
    assert [r.name for r in namespaces] == ["inference"]
    assert namespaces[0].parent.split("::")[2] == "pulumi:pulumi:Stack"
    names = [(r.type, r.inputs["metadata"].get("namespace", ""), r.inputs["metadata"]["name"])
             for r in rec.kubernetes() if r.name != "inference"]
    assert len(names) == len(set(names)), "two instances registered the same object"
    assert {ns for _, ns, _ in names} == {"inference"}
    user_ns = rec.named("inference").urn
    # Every object of both instances waits for the user's Namespace (their depends_on).
    for r in rec.kubernetes():
        if r.name != "inference":
            assert user_ns in r.dependencies, r.name


def test_the_instance_that_creates_the_namespace_alone_owns_it():
    def program():
        for name, extra in (("kimi-a", {"createNamespace": True}),
                            ("kimi-b", {"createNamespace": False})):
            K3ServingStack(name, {"weightsRevision": GOOD_REVISION, "apiKey": "x",
                                  "engineImage": IMAGE, "namespace": "inference", **extra,
                                  "receipt": load_receipt()})
    rec = record(program, preview=True)
    (ns,) = rec.of_type("kubernetes:core/v1:Namespace")
    assert ns.name == "kimi-a-namespace"
    assert ns.inputs["metadata"] == {"name": "inference", "labels": {
        "app.kubernetes.io/name": "kimi-k3", "app.kubernetes.io/instance": "kimi-a",
        "app.kubernetes.io/component": "namespace", "app.kubernetes.io/part-of": "k3infra",
        "app.kubernetes.io/managed-by": "pulumi",
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/warn": "restricted"}}
    assert ns.urn in rec.urns_under(rec.named("kimi-a").urn)
    # The owner's objects wait for the Namespace; the other instance's record no edge to
    # an object it does not own (it deploys into a namespace it assumes exists).
    for name in ("kimi-a-serving-statefulset", "kimi-a-api-key", "kimi-a-weights-job",
                 "kimi-a-serving-svc-kimi-a", "kimi-a-operations-netpol-kimi-a-serving"):
        assert ns.urn in rec.named(name).dependencies, name
    for r in rec.kubernetes():
        if r.urn in rec.urns_under(rec.named("kimi-b").urn):
            assert ns.urn not in r.dependencies, r.name


@pytest.mark.parametrize("args, created", [
    ({}, ["kimi-a-namespace"]),                                   # the default: its own name
    ({"namespace": "kimi-a"}, ["kimi-a-namespace"]),               # its own name, explicit
    ({"createNamespace": False}, []),                             # its own name, existing
    ({"namespace": "inference", "createNamespace": True}, ["kimi-a-namespace"]),
])
def test_the_namespace_is_created_only_when_the_instance_owns_it(args, created):
    def program():
        K3ServingStack("kimi-a", {"weightsRevision": GOOD_REVISION, "apiKey": "x",
                                  "engineImage": IMAGE, **args, "receipt": load_receipt()})
    rec = record(program, preview=True)
    assert [r.name for r in rec.of_type("kubernetes:core/v1:Namespace")] == created
    sts = rec.named("kimi-a-serving-statefulset")
    assert sts.inputs["metadata"]["namespace"] == args.get("namespace", "kimi-a")


def test_a_named_namespace_without_create_namespace_is_refused_in_one_line():
    def program():
        K3ServingStack("kimi-a", {"weightsRevision": GOOD_REVISION, "apiKey": "x",
                                  "engineImage": IMAGE, "namespace": "inference",
                                  "receipt": load_receipt()})
    with pytest.raises(ConfigError) as err:
        record(program, preview=True)
    assert str(err.value) == (
        "k3:createNamespace = None: must be set when k3:namespace ('inference') is not the "
        "instance name ('kimi-a'): true to create and own the namespace (with its Pod "
        "Security labels), false to deploy into one that exists")


def test_an_in_cluster_build_in_a_shared_namespace_names_its_own_build_namespace():
    in_cluster = {"engine": {"build": "in-cluster", "registry": "registry.example.com/k3/vllm",
                             "registrySecret": "push"}}
    base = {"weightsRevision": GOOD_REVISION, "apiKey": "x", "namespace": "inference",
            "createNamespace": False}

    def refused():
        K3ServingStack("kimi-a", {**base, **in_cluster, "receipt": load_receipt(),
                                  "offlineRender": True})
    with pytest.raises(ConfigError) as err:
        record(refused, preview=True)
    assert str(err.value) == (
        "k3:engine.buildNamespace = None: must be set when k3:createNamespace is false: the "
        "default inference-build would be created by every instance in 'inference'; name "
        "one per instance, e.g. kimi-a-build")

    def program():
        for name in ("kimi-a", "kimi-b"):
            engine = {**in_cluster["engine"], "buildNamespace": f"{name}-build"}
            K3ServingStack(name, {**base, "engine": engine, "receipt": load_receipt(),
                                  "offlineRender": True})
    rec = record(program, preview=True)
    assert sorted(r.inputs["metadata"]["name"]
                  for r in rec.of_type("kubernetes:core/v1:Namespace")) == \
        ["kimi-a-build", "kimi-b-build"]
    assert len(_names(rec)) == len(rec.kubernetes())


def test_create_namespace_refuses_an_output():
    def program():
        _, o = source("upstream", {"create": True, **_values()})
        K3ServingStack("kimi-a", {"weightsRevision": GOOD_REVISION, "apiKey": "x",
                                  "engineImage": IMAGE, "namespace": "inference",
                                  "createNamespace": o["create"], "receipt": load_receipt()})
    with pytest.raises(ConfigError) as err:
        record(program)
    assert str(err.value).startswith("k3:createNamespace = '<Output>': must be a plain value")


# --- dependencies on the children ------------------------------------------------------

def test_children_record_the_dependencies_they_need():
    def program():
        addons = pulumi.CustomResource("test:index:ClusterWide", "cluster-addons", {})
        K3ServingStack("kimi-k3", {
            "weightsRevision": GOOD_REVISION, "apiKey": "x", "engineImage": IMAGE,
            "hfToken": "hf", "nodePool": {"provider": "coreweave"}, "receipt": load_receipt()},
            pulumi.ResourceOptions(depends_on=[addons]))
    rec = record(program, preview=True)
    addons = rec.named("cluster-addons").urn
    ns = rec.named("kimi-k3-namespace").urn
    pool = rec.named("kimi-k3-pool-cks-nodepool").urn
    job = rec.named("kimi-k3-weights-job")
    sts = rec.named("kimi-k3-serving-statefulset")
    secrets = {rec.named("kimi-k3-api-key").urn, rec.named("kimi-k3-hf-token").urn}
    # The prefetch waits for the nodes (replacing the pool re-runs it) and its secret.
    assert {addons, ns, pool, *secrets} <= set(job.dependencies)
    assert {addons, ns, pool, job.urn, *secrets} <= set(sts.dependencies)
    for name in ("kimi-k3-serving-svc-kimi-k3", "kimi-k3-serving-svc-kimi-k3-headless",
                 "kimi-k3-serving-pdb", "kimi-k3-operations-netpol-kimi-k3-serving"):
        assert {addons, ns} <= set(rec.named(name).dependencies), name
    # Every Kubernetes object of the instance waits for the cluster-wide add-ons.
    for r in rec.kubernetes():
        assert addons in r.dependencies, r.name


# --- the canary's await ------------------------------------------------------------------

def test_a_canary_rollout_awaits_ready_pods_not_a_finished_rollout():
    from k3infra.serving import manifests as m

    cfg = parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "x",
                              "engineImage": IMAGE, "replicas": 3,
                              "serving": {"updatePartition": 2}}, receipt=load_receipt())
    assert m.await_annotations(cfg) == {"pulumi.com/waitFor": json.dumps(
        ["jsonpath={$[?@.readyReplicas == 3 && @.updatedReplicas > 0]}"])}
    hold_all = cfg.model_copy(update={"serving": cfg.serving.model_copy(
        update={"update_partition": 3})})
    assert m.await_annotations(hold_all) == {"pulumi.com/waitFor": json.dumps(
        ["jsonpath={$[?@.readyReplicas == 3]}"])}
    # No manual canary and the benchmark gate off (k3:rollout.gate; on, it holds replicas
    # 0-1 itself: tests/test_rollout.py).
    no_canary = cfg.model_copy(update={"serving": cfg.serving.model_copy(
        update={"update_partition": 0}), "rollout": cfg.rollout.model_copy(update={"gate": False})})
    assert m.await_annotations(no_canary) == {}
    on_delete = cfg.model_copy(update={"serving": cfg.serving.model_copy(
        update={"update_strategy": "OnDelete"})})
    assert m.await_annotations(on_delete) == {}


def test_the_wait_for_expression_parses_as_pulumi_kubernetes_parses_it():
    """pulumi-kubernetes splits `jsonpath=` expressions on a single '=' (keeping '==')
    and reads the path between one pair of braces: the expression must survive both."""
    from k3infra.serving import manifests as m

    cfg = parse_stack_config({"weightsRevision": GOOD_REVISION, "apiKey": "x",
                              "engineImage": IMAGE, "replicas": 2,
                              "serving": {"updatePartition": 1}}, receipt=load_receipt())
    (expr,) = json.loads(m.await_annotations(cfg)["pulumi.com/waitFor"])
    body = expr[len("jsonpath="):]
    assert "=" not in body.replace("==", "")
    assert body.count("{") == body.count("}") == 1 and body.startswith("{$")


# --- the other clouds' ids, wired ---------------------------------------------------------

OCI_WIRED = {"clusterId": "ocid1.cluster.oc1.iad.aaaa", "compartmentId": "ocid1.compartment.oc1..bbbb",
             "imageId": "ocid1.image.oc1.iad.cccc", "subnetId": "ocid1.subnet.oc1.iad.dddd",
             "reservationId": "ocid1.capacityreservation.oc1.iad.eeee",
             "computeClusterId": "ocid1.computecluster.oc1.iad.ffff",
             "nsgId": "ocid1.networksecuritygroup.oc1.iad.gggg"}
NEBIUS_WIRED = {"clusterId": "mk8scluster-e00abc", "subnetId": "vpcsubnet-e00def",
                "gpuClusterId": "computegpucluster-e00ghi", "serviceAccountId": "serviceaccount-e00jkl"}


def _pool_program(pool: dict, values: dict):
    def program():
        _, o = source("upstream", values)
        wired = _wire(pool, o)        # "$key": the source resource's output `key`
        K3ServingStack("kimi-k3", {"weightsRevision": GOOD_REVISION, "apiKey": "x",
                                   "engineImage": IMAGE, "acceptModelLicense": True, **PINNED,
                                   "nodePool": {"provider": pool["_provider"],
                                                pool["_provider"]: {k: v for k, v in wired.items()
                                                                    if not k.startswith("_")}},
                                   "receipt": load_receipt()})
    return program


def _wire(item, o):
    if isinstance(item, dict):
        return {k: _wire(v, o) for k, v in item.items()}
    if isinstance(item, list):
        return [_wire(v, o) for v in item]
    return o[item[1:]] if isinstance(item, str) and item.startswith("$") else item


def test_oci_ids_take_outputs():
    pool = {"_provider": "oci", "clusterId": "$clusterId", "compartmentId": "$compartmentId",
            "kubernetesVersion": "v1.33.1", "imageId": "$imageId",
            "computeClusterId": "$computeClusterId", "nsgIds": ["$nsgId"],
            "placements": [{"availabilityDomain": "Uocm:US-ASHBURN-AD-1", "subnetId": "$subnetId",
                            "capacityReservationId": "$reservationId"}]}
    rec = record(_pool_program(pool, OCI_WIRED))
    (np,) = rec.of_type("oci:ContainerEngine/nodePool:NodePool")
    i = np.inputs
    assert (i["clusterId"], i["compartmentId"]) == (OCI_WIRED["clusterId"], OCI_WIRED["compartmentId"])
    assert i["nodeSourceDetails"]["imageId"] == OCI_WIRED["imageId"]
    details = i["nodeConfigDetails"]
    assert details["placementConfigs"][0]["subnetId"] == OCI_WIRED["subnetId"]
    assert details["placementConfigs"][0]["capacityReservationId"] == OCI_WIRED["reservationId"]
    assert details["computeClusterId"] == OCI_WIRED["computeClusterId"]
    assert details["nsgIds"] == [OCI_WIRED["nsgId"]]


def test_nebius_ids_take_outputs():
    pool = {"_provider": "nebius", "clusterId": "$clusterId", "subnetId": "$subnetId",
            "gpuClusterId": "$gpuClusterId", "serviceAccountId": "$serviceAccountId"}
    rec = record(_pool_program(pool, NEBIUS_WIRED))
    (group,) = rec.of_type("nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup")
    t = group.inputs["template"]
    assert group.inputs["parentId"] == NEBIUS_WIRED["clusterId"]
    assert t["networkInterfaces"] == [{"subnetId": NEBIUS_WIRED["subnetId"]}]
    assert t["gpuCluster"] == {"id": NEBIUS_WIRED["gpuClusterId"]}
    assert t["serviceAccountId"] == NEBIUS_WIRED["serviceAccountId"]


def test_aws_karpenter_role_reservation_and_a_whole_list_take_outputs():
    values = {**AWS_WIRED, "role": "eks-node", "reservation": "cr-0123456789abcdef0",
              "groups": ["sg-0123456789abcdef0", "sg-0fedcba9876543210"]}
    pool = {"_provider": "aws", "clusterName": "$clusterName", "mode": "karpenter",
            "nodeRoleName": "$role", "securityGroupIds": "$groups",
            "subnets": [{"id": "$subnetId", "availabilityZone": "us-east-1b"}],
            "capacityBlock": {"reservationId": "$reservation", "availabilityZone": "us-east-1b"}}
    rec = record(_pool_program(pool, values))
    (nc,) = rec.of_type("kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")
    spec = nc.inputs["spec"]
    assert spec["role"] == "eks-node"
    assert spec["capacityReservationSelectorTerms"] == [{"id": "cr-0123456789abcdef0"}]
    assert spec["securityGroupSelectorTerms"] == [{"id": g} for g in values["groups"]]
    assert spec["subnetSelectorTerms"] == [{"id": AWS_WIRED["subnetId"]}]


def test_the_stack_program_sends_every_object_to_the_pools_cluster():
    """The shipped aws stack: one explicit kubernetes.Provider built from the EKS cluster
    (endpoint and CA looked up, token from `aws eks get-token`), used by every object."""
    from conftest import render

    r = render("aws", f"weightsRevision={GOOD_REVISION}")
    (provider,) = r.by_type("pulumi:providers:kubernetes")
    assert provider["name"] == "kimi-k3-cluster"
    assert provider["inputs"]["kubeconfig"] == "[secret]"
    kube = [x for x in r.resources if x["type"].startswith("kubernetes:")
            and not x["type"].startswith("pulumi:providers")]
    assert kube
    for x in kube:
        assert (x["provider"] or "").startswith(provider["urn"] + "::"), x["name"]


def test_eks_kubeconfig_uses_the_aws_cli_token():
    from k3infra.nodepool.cluster_access import eks_kubeconfig

    cfg = json.loads(eks_kubeconfig("prod-eks", "https://ABC.gr7.us-east-1.eks.amazonaws.com",
                                    "Q0E="))
    (user,) = cfg["users"]
    assert user["user"]["exec"] == {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
        "args": ["eks", "get-token", "--cluster-name", "prod-eks", "--output", "json"],
        "interactiveMode": "Never"}
    assert cfg["clusters"][0]["cluster"] == {
        "server": "https://ABC.gr7.us-east-1.eks.amazonaws.com", "certificate-authority-data": "Q0E="}


def test_the_args_type_names_every_stack_key():
    """K3ServingStackArgs is derived from the config models (a hand-written twin had
    drifted: coldStart and host were missing): a TypedDict of every k3:* key and
    `offlineRender`; the plugin schema is inferred from the same keys without it
    (`shapes.StackKeys`)."""
    import typing

    import k3infra
    from k3infra.config import StackConfig
    from k3infra.plugin import shapes
    from k3infra.stack import K3ServingStackArgs

    assert k3infra.K3ServingStackArgs is K3ServingStackArgs is shapes.K3ServingStackArgs
    assert typing.is_typeddict(K3ServingStackArgs)

    keys = {field.alias or name for name, field in StackConfig.model_fields.items()}
    assert set(K3ServingStackArgs.__annotations__) == keys | {"offlineRender"}
    assert set(shapes.StackKeys.__annotations__) == keys
    assert shapes.SHAPES[shapes.ARGS_NAME].typed_dict is shapes.StackKeys
    # The receipt is required in a Python program (a Receipt, or a name the project
    # resolves), optional for the plugin (unset: the shipped default).
    assert "receipt" in K3ServingStackArgs.__required_keys__
    assert "receipt" not in shapes.StackKeys.__required_keys__
    # And `pulumi.Input` exactly where the component takes an Output at the top level
    # (the generated schema's rule, k3infra/plugin/shapes.py).
    from k3infra.config import SECRET_KEYS
    typed_input = {k for k, t in K3ServingStackArgs.__annotations__.items() if "Output[" in str(t)}
    assert typed_input == {k for k in keys if k in WIREABLE or k in SECRET_KEYS} == {
        "weightsRevision", "apiKey", "hfToken", "engineImage"}


def test_every_component_takes_name_args_opts_and_names_a_missing_key():
    """One shape (issue 47): `Component(name, args, opts=None)`; a missing args key is a
    TypeError naming the component and the key, before anything is registered."""
    import inspect

    from k3infra.accuracy.component import AccuracySmoke
    from k3infra.bench.component import Benchmark, RolloutGate
    from k3infra.engine import EngineBuild
    from k3infra.gateway.component import InferenceGateway
    from k3infra.host.component import K3HostStack
    from k3infra.nodepool.cluster_addons import ClusterAddons
    from k3infra.nodepool.component import B300NodePool
    from k3infra.operations.component import ServingOperations
    from k3infra.serving.component import VllmServing
    from k3infra.weights.component import WeightsPrefetch

    components = [K3ServingStack, K3HostStack, B300NodePool, ClusterAddons, InferenceGateway,
                  WeightsPrefetch, ServingOperations, VllmServing, Benchmark, RolloutGate,
                  AccuracySmoke, EngineBuild]
    for component in components:
        params = list(inspect.signature(component.__init__).parameters.values())
        assert [p.name for p in params] == ["self", "name", "args", "opts"], component
        assert params[3].default is None, component
    for component in components[2:-1]:
        first = ("config" if component in (B300NodePool, ClusterAddons, InferenceGateway)
                 else "receipt")
        with pytest.raises(TypeError, match=rf"{component.__name__}: args\['{first}'\] must be"):
            component("x", {})
