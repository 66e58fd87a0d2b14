"""B300 node pools: what each adapter registers (type, SKU, image, labels, taints),
that the serving pods' placement matches the pool, and that `existing` creates nothing."""
import base64
import subprocess
import sys

import pytest
import yaml

from k3infra import placement
from k3infra.nodepool import aws as aws_adapter
from k3infra.nodepool.base import load_adapter, pool_spec

from conftest import GOOD_REVISION, ROOT, STACKS, render
from nodepool_harness import AWS, NEBIUS, OCI, of_type, one, register_pool, stack_config

PIN = f"weightsRevision={GOOD_REVISION}"
CLOUD_PREFIXES = ("aws:", "oci:", "nebius:")
TAINT_ENUM = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]


def _decoded_user_data(b64: str) -> str:
    return base64.b64decode(b64).decode()


# --- every shipped stack ---------------------------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_renders_with_a_pool(stack):
    r = render(stack, PIN)
    pools = r.by_type("k3infra:index:B300NodePool")
    assert len(pools) == 1
    pool_urn = pools[0]["urn"]
    children = [res for res in r.resources if res["parent"] == pool_urn]
    if stack == "existing":
        assert children == []
    else:
        assert children, f"{stack}: the pool registered nothing"


def test_shipped_cloud_stacks_are_the_expected_ones():
    assert {"aws", "oci", "nebius", "coreweave", "existing"} <= set(STACKS)


def test_existing_creates_no_cloud_resources():
    r = render("existing", PIN)
    types = [res["type"] for res in r.resources]
    assert not [t for t in types if t.startswith(CLOUD_PREFIXES)]
    assert "kubernetes:helm.sh/v4:Chart" not in types
    assert not [m for m in r.manifests() if m["apiVersion"].startswith(
        ("compute.coreweave.com", "karpenter"))]


def test_aws_stack_registers_an_eks_node_group_of_p6_b300():
    r = render("aws", PIN)
    (group,) = r.by_type("aws:eks/nodeGroup:NodeGroup")
    inputs = group["inputs"]
    assert inputs["instanceTypes"] == ["p6-b300.48xlarge"]
    assert inputs["amiType"] == "AL2023_x86_64_NVIDIA"
    assert inputs["capacityType"] == "CAPACITY_BLOCK"          # the shipped stack has one
    assert inputs["labels"] == placement.node_labels("kimi-k3")     # the instance's pool
    assert inputs["taints"] == TAINT_ENUM
    (template,) = r.by_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert template["urn"] in group["dependsOn"]


def test_oci_stack_registers_an_oke_node_pool_of_bm_gpu_b300_8():
    r = render("oci", PIN)
    (pool,) = r.by_type("oci:ContainerEngine/nodePool:NodePool")
    assert pool["inputs"]["nodeShape"] == "BM.GPU.B300.8"
    assert pool["inputs"]["nodeConfigDetails"]["size"] == 1


def test_serving_and_weights_wait_for_the_pool_and_the_cluster_addons():
    """Recorded on the child objects themselves (what the state keeps), not only on
    their components."""
    r = render("aws", PIN)
    by_name = {res["name"]: res for res in r.resources}
    group_urn = by_name["kimi-k3-pool-nodegroup"]["urn"]
    chart_urn = by_name["cluster-addons-gpu-operator"]["urn"]
    assert {group_urn, chart_urn} <= set(by_name["kimi-k3-serving-statefulset"]["dependsOn"])
    # node-local (the aws stack): one prefetch Job per replica
    assert {group_urn, chart_urn} <= set(by_name["kimi-k3-weights-job-0"]["dependsOn"])
    # The GPU Operator is cluster-wide: its own component, not the instance's pool.
    assert by_name["cluster-addons-gpu-operator"]["parent"] == by_name["cluster-addons"]["urn"]


# --- placement: pods match the pool ----------------------------------------------------

def _matches(affinity: dict, labels: dict) -> bool:
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for term in terms:
        ok = True
        for expr in term["matchExpressions"]:
            value = labels.get(expr["key"])
            if expr["operator"] == "In":
                ok &= value in expr["values"]
            elif expr["operator"] == "Exists":
                ok &= expr["key"] in labels
            else:
                raise AssertionError(f"operator {expr['operator']} not handled")
        if ok:
            return True
    return False


def _tolerated(tolerations: list, taint: dict) -> bool:
    return any(t["key"] == taint["key"] and t.get("effect") in (None, taint["effect"])
               and (t["operator"] == "Exists" or t.get("value") == taint["value"])
               for t in tolerations)


def _pool_node_labels(stack: str, r) -> dict:
    """Labels a node of the stack's pool ends up with: what the pool sets, plus the GFD
    product label where GPU feature discovery runs."""
    if stack == "aws":
        labels = dict(r.by_type("aws:eks/nodeGroup:NodeGroup")[0]["inputs"]["labels"])
    elif stack == "oci":
        labels = {l["key"]: l["value"] for l in
                  r.by_type("oci:ContainerEngine/nodePool:NodePool")[0]["inputs"]["initialNodeLabels"]}
    elif stack == "nebius":
        labels = dict(r.by_type("nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup")[0]
                      ["inputs"]["template"]["metadata"]["labels"])
    elif stack == "coreweave":
        labels = dict(next(m for m in r.manifests() if m["kind"] == "NodePool")
                      ["spec"]["nodeLabels"])
        return labels                       # no GFD we install: the pool labels the product
    else:
        labels = {}
    return {**labels, placement.GPU_PRODUCT_LABEL: "NVIDIA-B300-SXM6-AC"}


@pytest.mark.parametrize("stack", STACKS)
def test_serving_affinity_matches_the_pool_nodes(stack):
    r = render(stack, PIN)
    sts = next(m for m in r.manifests() if m["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    labels = _pool_node_labels(stack, r)
    assert _matches(pod["affinity"]["nodeAffinity"], labels)
    for taint in placement.node_taints():
        assert _tolerated(pod["tolerations"], taint)
    # A GPU node of another pool (GFD label only) is not chosen when k3infra made a pool.
    other = {placement.GPU_PRODUCT_LABEL: "NVIDIA-B300-SXM6-AC"}
    assert _matches(pod["affinity"]["nodeAffinity"], other) is (stack == "existing")
    # A B200 node is never chosen.
    b200 = {**labels, placement.GPU_PRODUCT_LABEL: "NVIDIA-B200"}
    assert not _matches(pod["affinity"]["nodeAffinity"], b200)


# --- adapters, registered under mocks --------------------------------------------------

def test_aws_managed_node_group_on_demand_without_capacity_block():
    reg = register_pool(stack_config({"provider": "aws", "aws": AWS, "nodeCount": 2},
                                     replicas=2))
    group = one(reg, "aws:eks/nodeGroup:NodeGroup")
    assert group["capacityType"] == "ON_DEMAND"
    assert group["scalingConfig"] == {"desiredSize": 2, "minSize": 2, "maxSize": 2}
    assert group["clusterName"] == "prod-eks"
    assert group["subnetIds"] == ["subnet-0123456789abcdef0"]
    assert group["launchTemplate"] == {"id": "k3-pool-lt-id", "version": "3"}
    lt = one(reg, "aws:ec2/launchTemplate:LaunchTemplate")
    assert "instanceMarketOptions" not in lt and "capacityReservationSpecification" not in lt


def test_aws_launch_template_capacity_block_efa_and_local_nvme():
    settings = {**AWS, "capacityBlock": {"reservationId": "cr-0123456789abcdef0",
                                         "availabilityZone": "us-east-1b"}}
    cfg = stack_config({"provider": "aws", "aws": settings},
                       weights={"mode": "node-local", "nodeLocalRoot": "/mnt/nvme/k3"})
    reg = register_pool(cfg)
    lt = one(reg, "aws:ec2/launchTemplate:LaunchTemplate")
    assert lt["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert lt["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}}
    nics = lt["networkInterfaces"]
    assert nics[0]["networkCardIndex"] == 0 and nics[0]["interfaceType"] == "interface"
    efa = nics[1:]
    assert [n["networkCardIndex"] for n in efa] == list(range(1, 17))
    assert {n["interfaceType"] for n in efa} == {"efa-only"}
    assert all(n["securityGroups"] == ["sg-0123456789abcdef0"] for n in nics)
    assert "vpcSecurityGroupIds" not in lt       # groups live on the interfaces
    text = _decoded_user_data(lt["userData"])
    assert "Content-Type: application/node.eks.aws" in text
    doc = yaml.safe_load(text.split("---\n", 1)[1].split("\n--", 1)[0])
    assert doc["kind"] == "NodeConfig"
    assert doc["spec"]["instance"]["localStorage"] == {"strategy": "RAID0",
                                                       "mountPath": "/mnt/nvme/k3"}
    # the mounted root belongs to the engine image's user (the prefetch runs as it)
    shell = text.split("Content-Type: text/x-shellscript", 1)[1]
    assert "chown 1000:1000 /mnt/nvme/k3" in shell
    assert one(reg, "aws:eks/nodeGroup:NodeGroup")["capacityType"] == "CAPACITY_BLOCK"


def test_aws_nodes_answer_instance_metadata_to_the_node_only():
    """Issue 21: IMDSv2 with a hop limit of 1, so no pod reaches the node role."""
    lt = one(register_pool(stack_config({"provider": "aws", "aws": AWS})),
             "aws:ec2/launchTemplate:LaunchTemplate")
    assert lt["metadataOptions"] == {"httpEndpoint": "enabled", "httpTokens": "required",
                                     "httpPutResponseHopLimit": 1}


def test_aws_without_efa_uses_plain_security_groups():
    reg = register_pool(stack_config({"provider": "aws", "aws": {**AWS, "efaInterfaces": 0}}))
    lt = one(reg, "aws:ec2/launchTemplate:LaunchTemplate")
    assert "networkInterfaces" not in lt
    assert lt["vpcSecurityGroupIds"] == ["sg-0123456789abcdef0"]
    local = yaml.safe_load(_decoded_user_data(lt["userData"]).split("---\n", 1)[1]
                           .split("\n--", 1)[0])["spec"]["instance"]["localStorage"]
    assert local == {"strategy": "RAID0"}        # shared weights: nodeadm's default mount


def test_aws_karpenter_mode_registers_nodepool_and_ec2nodeclass():
    settings = {k: v for k, v in AWS.items() if k != "nodeRoleArn"}
    settings.update(mode="karpenter", nodeRoleName="eks-node",
                    capacityBlock={"reservationId": "cr-0123456789abcdef0",
                                   "availabilityZone": "us-east-1b"})
    reg = register_pool(stack_config({"provider": "aws", "aws": settings, "nodeCount": 2},
                                     replicas=2))
    assert not of_type(reg, "aws:eks/nodeGroup:NodeGroup")
    node_class = one(reg, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")
    assert node_class["spec"]["role"] == "eks-node"
    assert node_class["spec"]["capacityReservationSelectorTerms"] == [
        {"id": "cr-0123456789abcdef0"}]
    assert node_class["spec"]["amiSelectorTerms"] == [{"alias": "al2023@latest"}]
    assert node_class["spec"]["metadataOptions"]["httpPutResponseHopLimit"] == 1
    pool = one(reg, "kubernetes:karpenter.sh/v1:NodePool")["spec"]
    assert pool["template"]["metadata"]["labels"] == placement.node_labels("k3-pool")
    assert pool["template"]["spec"]["taints"] == placement.node_taints()
    reqs = {r["key"]: r["values"] for r in pool["template"]["spec"]["requirements"]}
    assert reqs["node.kubernetes.io/instance-type"] == ["p6-b300.48xlarge"]
    assert reqs["karpenter.sh/capacity-type"] == ["reserved"]
    assert pool["limits"] == {"nvidia.com/gpu": 16}


def test_oci_node_pool_shape_image_labels_and_taints():
    settings = {**OCI, "computeClusterId": "ocid1.computecluster.oc1.iad.eeee"}
    reg = register_pool(stack_config({"provider": "oci", "oci": settings}))
    pool = one(reg, "oci:ContainerEngine/nodePool:NodePool")
    assert pool["nodeShape"] == "BM.GPU.B300.8"
    assert pool["nodeSourceDetails"] == {"sourceType": "IMAGE",
                                         "imageId": "ocid1.image.oc1.iad.cccc",
                                         "bootVolumeSizeInGbs": "200"}
    assert pool["nodeConfigDetails"]["computeClusterId"] == "ocid1.computecluster.oc1.iad.eeee"
    assert {l["key"]: l["value"] for l in pool["initialNodeLabels"]} == placement.node_labels("k3-pool")
    init = _decoded_user_data(pool["nodeMetadata"]["user_data"])
    assert f"--register-with-taints={placement.kubelet_taints()}" in init
    assert "oke_init_script" in init and "mdadm" not in init   # shared weights: no RAID


def test_oci_node_local_weights_stripe_the_nvme(tmp_path):
    cfg = stack_config({"provider": "oci", "oci": OCI, "localNvmeGB": 30000},
                       weights={"mode": "node-local", "nodeLocalRoot": "/mnt/k3-weights"})
    pool = one(register_pool(cfg), "oci:ContainerEngine/nodePool:NodePool")
    init = _decoded_user_data(pool["nodeMetadata"]["user_data"])
    assert "mdadm --create" in init and "/mnt/k3-weights" in init
    assert init.index("mdadm") < init.index("oke-init.sh")    # mounted before kubelet starts
    assert init.index("mount -o noatime") < init.index("chown 1000:1000 /mnt/k3-weights")
    script = tmp_path / "init.sh"
    script.write_text(init)
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_nebius_node_group_platform_preset_labels_and_taints():
    settings = {**NEBIUS, "driversPreset": "cuda13.0", "reservationIds": ["cbg-1"]}
    reg = register_pool(stack_config({"provider": "nebius", "nebius": settings}))
    group = one(reg, "nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup")
    assert group["parentId"] == "mk8scluster-e00abc"
    assert group["fixedNodeCount"] == 1
    template = group["template"]
    assert template["resources"] == {"platform": "gpu-b300-sxm", "preset": "8gpu-192vcpu-2768gb"}
    assert template["metadata"]["labels"] == placement.node_labels("k3-pool")
    assert template["taints"] == TAINT_ENUM
    assert template["gpuSettings"] == {"driversPreset": "cuda13.0"}
    assert template["reservationPolicy"] == {"policy": "STRICT", "reservationIds": ["cbg-1"]}
    assert template["networkInterfaces"] == [{"subnetId": "vpcsubnet-e00def"}]
    assert "localDisks" not in template


def test_nebius_node_local_requests_passthrough_disks():
    cfg = stack_config({"provider": "nebius", "nebius": NEBIUS, "localNvmeGB": 20000},
                       weights={"mode": "node-local"})
    template = one(register_pool(cfg), "nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup")["template"]
    assert template["localDisks"] == {"passthroughGroup": {"requested": True},
                                      "config": {"none": True}}
    init = template["cloudInitUserData"]
    assert init.startswith("#cloud-config\n")
    assert "mdadm --create" in yaml.safe_load(init)["runcmd"][0][2]


def test_coreweave_nodepool_custom_resource():
    reg = register_pool(stack_config({"provider": "coreweave", "nodeCount": 3}, replicas=3))
    cr = one(reg, "kubernetes:compute.coreweave.com/v1alpha1:NodePool")
    assert cr["apiVersion"] == "compute.coreweave.com/v1alpha1" and cr["kind"] == "NodePool"
    spec = cr["spec"]
    assert spec["instanceType"] == "b300-8x"
    assert spec["targetNodes"] == 3
    assert spec["nodeLabels"] == placement.node_labels("k3-pool", "NVIDIA-B300-SXM6-AC")
    assert spec["nodeTaints"] == placement.node_taints()
    assert not of_type(reg, "kubernetes:helm.sh/v4:Chart")      # CKS: no GPU Operator


def test_existing_pool_registers_only_the_component():
    reg = register_pool(stack_config({"provider": "existing"}))
    assert [t for t, _, _ in reg] == ["k3infra:index:B300NodePool"]


# --- SDK isolation ---------------------------------------------------------------------

def test_existing_render_imports_no_cloud_sdk():
    code = ("import sys\n"
            "from k3infra.render import render_stack\n"
            f"render_stack('existing', ['weightsRevision={GOOD_REVISION}'])\n"
            "loaded = [m for m in ('pulumi_aws', 'pulumi_oci', 'pulumi_nebius') if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_missing_sdk_names_the_extra(monkeypatch):
    monkeypatch.delitem(sys.modules, "k3infra.nodepool.oci", raising=False)
    monkeypatch.setitem(sys.modules, "pulumi_oci", None)     # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r"\.\[oci\]"):
        load_adapter("oci")


def test_pool_spec_node_count_defaults_to_replicas(receipt):
    spec = pool_spec(stack_config({"provider": "aws", "aws": AWS}, replicas=3), receipt)
    assert spec.node_count == 3 and spec.gpus == 3 * receipt.measured_gpu.gpus_per_node
    assert aws_adapter.eks_taints(spec) == TAINT_ENUM


@pytest.mark.parametrize("stack,needles", [
    ("aws", ["aws:eks/nodeGroup:NodeGroup", "gpu-operator v25.10.1", "p6-b300.48xlarge"]),
    ("oci", ["oci:ContainerEngine/nodePool:NodePool", "BM.GPU.B300.8"]),
    ("existing", ["nothing created"]),
])
def test_cli_render_lists_pool_resources_addons_and_preflight(stack, needles, tmp_path, capsys):
    from k3infra.cli import main
    assert main(["render", "--stack", stack, "--config", PIN, "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "preflight ok HBM fit per node" in out
    for needle in needles:
        assert needle in out, needle
    if stack == "existing":
        assert "node pool:" not in out
