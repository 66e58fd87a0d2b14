"""Preflight: every check passes on the shipped stacks, and each failure is a clear
error naming key, value and what is accepted, raised before anything is created."""
import pytest

from k3infra.cli import main
from k3infra.config import ConfigError
from k3infra.receipt import load_receipt
from k3infra.preflight import (PreflightError, check_capacity_zone, check_hbm,
                               check_local_nvme, check_node_count, check_pool_gpu,
                               check_weights_volume, preflight_report)

from conftest import GOOD_REVISION
from nodepool_harness import AWS, OCI, Recorder, run, stack_config

BLOCK = {"reservationId": "cr-0123456789abcdef0", "availabilityZone": "us-east-1b"}


def test_report_lines_for_a_good_aws_stack(receipt):
    cfg = stack_config({"provider": "aws", "aws": {**AWS, "capacityBlock": BLOCK}},
                       weights={"mode": "node-local"})
    lines = preflight_report(cfg, receipt, lock_total_bytes=1_561_000_000_000)
    assert all(line.startswith("ok  ") for line in lines)
    text = "\n".join(lines)
    assert "headroom" in text and "p6-b300.48xlarge" in text
    assert "30400.0 GB per node >= 2 x 1561.0 GB (lock total)" in text
    assert "cr-0123456789abcdef0 in us-east-1b" in text


def test_b200_refused_by_the_hbm_check(receipt):
    cfg = stack_config({"provider": "existing"}, gpuProduct="NVIDIA-B200")
    with pytest.raises(PreflightError) as err:
        check_hbm(cfg, receipt)
    assert err.value.key == "k3:gpuProduct" and err.value.value == "NVIDIA-B200"
    assert "does not fit" in str(err.value) and "175.40" in str(err.value)


def test_b200_on_a_cloud_stack_is_refused_by_render(tmp_path, capsys):
    code = main(["render", "--stack", "aws", "--config", f"weightsRevision={GOOD_REVISION}",
                 "--config", "gpuProduct=NVIDIA-B200", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "k3:gpuProduct" in err and "does not fit" in err


def test_pool_gpu_mismatch_refused(receipt):
    cfg = stack_config({"provider": "oci", "oci": OCI}, gpuProduct="NVIDIA-H999",
                       gpuMemoryGib=400)
    with pytest.raises(PreflightError, match="BM.GPU.B300.8 nodes whose GPUs are "
                                             "NVIDIA-B300-SXM6-AC") as err:
        check_pool_gpu(cfg, receipt)
    assert err.value.key == "k3:gpuProduct"


def test_fewer_nodes_than_replicas_refused(receipt):
    cfg = stack_config({"provider": "aws", "aws": AWS, "nodeCount": 1}, replicas=2)
    with pytest.raises(PreflightError) as err:
        check_node_count(cfg, receipt)
    assert err.value.key == "k3:nodePool.nodeCount" and err.value.value == 1
    assert "one replica is one whole 8-GPU node" in str(err.value)


def test_spare_nodes_reported(receipt):
    cfg = stack_config({"provider": "aws", "aws": AWS, "nodeCount": 3}, replicas=2)
    assert "1 spare" in check_node_count(cfg, receipt).detail


def test_local_nvme_too_small_for_the_lock(receipt):
    cfg = stack_config({"provider": "aws", "aws": AWS}, weights={"mode": "node-local"})
    with pytest.raises(PreflightError) as err:
        check_local_nvme(cfg, receipt, lock_total_bytes=14_000_000_000_000)
    assert err.value.key == "k3:weights.mode"
    assert "30400.0 GB of local NVMe per node cannot hold 2 x 14000.0 GB" in str(err.value)


def test_stated_local_nvme_below_two_trees_plus_margin(receipt):
    # 3200 GB holds two of the receipt's 1561 GB trees but not the 10 % margin on top.
    cfg = stack_config({"provider": "oci", "oci": OCI, "localNvmeGB": 3200},
                       weights={"mode": "node-local"})
    with pytest.raises(PreflightError) as err:
        check_local_nvme(cfg, receipt)
    assert err.value.key == "k3:nodePool.localNvmeGB" and err.value.value == 3200
    assert "receipt size" in str(err.value)


def test_unknown_local_nvme_refused_for_created_pools(receipt):
    cfg = stack_config({"provider": "oci", "oci": OCI}, weights={"mode": "node-local"})
    with pytest.raises(PreflightError) as err:
        check_local_nvme(cfg, receipt)
    assert err.value.key == "k3:nodePool.localNvmeGB"
    assert "BM.GPU.B300.8" in str(err.value)


def test_default_weights_volume_holds_two_trees(receipt):
    cfg = stack_config({"provider": "existing"})
    assert check_weights_volume(cfg, receipt).detail == (
        "3200 Gi (3436.0 GB) per volume >= 2 x 1561.0 GB (receipt size (no lock file)): "
        "room to stage a new revision")


@pytest.mark.parametrize("mode", ["shared", "node-local"])
def test_weights_volume_for_one_tree_refused(receipt, mode):
    """Issue 33: 1700 Gi holds the served tree but not the next revision staged beside it."""
    cfg = stack_config({"provider": "existing"}, weights={"mode": mode, "sizeGi": 1700})
    with pytest.raises(PreflightError) as err:
        check_weights_volume(cfg, receipt)
    assert (err.value.key, err.value.value) == ("k3:weights.sizeGi", 1700)
    assert str(err.value) == (
        "k3:weights.sizeGi = 1700: a weights volume of 1700 Gi (1825.4 GB) cannot hold 2 x "
        "1561.0 GB of weights (receipt size (no lock file); a revision change stages the new "
        "tree beside the old one) = 3122.0 GB; accepted: at least 2908 (Gi)")


def test_weights_volume_is_held_to_the_lock_total(receipt):
    cfg = stack_config({"provider": "existing"})
    with pytest.raises(PreflightError, match=r"2 x 1800.0 GB of weights \(lock total"):
        check_weights_volume(cfg, receipt, lock_total_bytes=1_800_000_000_000)


def test_one_tree_volume_refused_by_render(tmp_path, capsys):
    code = main(["render", "--stack", "existing", "--config", "weights.sizeGi=1700",
                 "--out", str(tmp_path)])
    assert code == 2
    assert "k3:weights.sizeGi = 1700: a weights volume of 1700 Gi" in capsys.readouterr().err


def test_capacity_block_in_another_az_refused(receipt):
    settings = {**AWS, "capacityBlock": {**BLOCK, "availabilityZone": "us-east-1a"}}
    cfg = stack_config({"provider": "aws", "aws": settings})
    with pytest.raises(PreflightError) as err:
        check_capacity_zone(cfg, receipt)
    assert err.value.key == "k3:nodePool.aws.subnets"
    assert "subnet-0123456789abcdef0 (us-east-1b)" in str(err.value)
    assert "only subnets in us-east-1a" in str(err.value)


def test_preflight_error_is_a_config_error():
    assert issubclass(PreflightError, ConfigError)


def test_failed_preflight_registers_nothing():
    from k3infra.stack import K3ServingStack

    cfg = stack_config({"provider": "aws", "aws": AWS, "nodeCount": 1}, replicas=2,
                       acceptModelLicense=True)
    mocks = Recorder()
    with pytest.raises(Exception) as err:
        run(lambda: K3ServingStack("k3", {"config": cfg, "receipt": load_receipt()}), mocks)
    assert mocks.registered == []
    cause = err.value
    while not isinstance(cause, PreflightError) and (cause.__cause__ or cause.__context__):
        cause = cause.__cause__ or cause.__context__
    assert isinstance(cause, PreflightError)


def test_engine_cpu_below_its_workers_refused(receipt):
    """Issue 27: k3:serving.resources.cpu accepts a small CPU node's 1; the receipt's 8 workers
    still need 8 (the bound was a fixed ge=8)."""
    from k3infra.preflight import check_engine_cpu

    assert check_engine_cpu(stack_config({"provider": "existing"}), receipt).line() == (
        "ok  engine CPU: 96 CPU for 8 engine worker(s)")
    with pytest.raises(PreflightError) as err:
        check_engine_cpu(stack_config({"provider": "existing"}, serving={"resources": {"cpu": 4}}),
                         receipt)
    assert err.value.key == "k3:serving.resources.cpu" and "accepted: at least 8" in str(err.value)
