"""Helm add-ons: pins in charts/ loaded and validated, and the GPU Operator release each
pool gets (or does not get)."""
import shutil
import subprocess

import pytest
import yaml

from k3infra import placement
from k3infra.nodepool.addons import (GPU_OPERATOR_MIN, AddonError, addon_releases,
                                     charts_dir, gpu_operator_release, load_pins)
from k3infra.nodepool.base import pool_spec
from k3infra.nodepool.localdisk import raid0_mount_script

from conftest import GOOD_REVISION, render
from nodepool_harness import AWS, NEBIUS, OCI, of_type, one, register_pool, run, stack_config

PIN = f"weightsRevision={GOOD_REVISION}"


@pytest.fixture
def charts(tmp_path):
    """A writable copy of charts/ to break on purpose."""
    dst = tmp_path / "charts"
    shutil.copytree(charts_dir(), dst)
    return dst


def _edit(path, change):
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc))


def test_shipped_pins_load_and_know_b300():
    pin = load_pins().gpu_operator
    assert pin.chart == "gpu-operator" and pin.repo.startswith("https://")
    assert pin.version_tuple() >= GPU_OPERATOR_MIN
    assert "coreweave" not in pin.provider_values


@pytest.mark.parametrize("stack", ["aws", "oci", "nebius"])
def test_rendered_chart_carries_the_pinned_version(stack):
    pin = load_pins().gpu_operator
    (chart,) = render(stack, PIN).by_type("kubernetes:helm.sh/v4:Chart")
    inputs = chart["inputs"]
    assert (inputs["chart"], inputs["version"]) == (pin.chart, pin.version)
    assert inputs["repositoryOpts"] == {"repo": pin.repo}
    assert inputs["namespace"] == pin.namespace
    assert inputs["values"]["daemonsets"]["tolerations"] == placement.tolerations()
    assert inputs["values"]["gfd"] == {"enabled": True}


@pytest.mark.parametrize("stack", ["coreweave", "existing"])
def test_no_gpu_operator_where_the_platform_owns_the_gpu_stack(stack):
    assert render(stack, PIN).by_type("kubernetes:helm.sh/v4:Chart") == []


def test_driver_and_toolkit_follow_the_node_image(receipt):
    aws = gpu_operator_release(pool_spec(stack_config({"provider": "aws", "aws": AWS}), receipt))
    assert aws.values["driver"] == {"enabled": False}        # EKS NVIDIA AMI ships them
    assert aws.values["toolkit"] == {"enabled": False}
    assert aws.values["operator"]["defaultRuntime"] == "containerd"
    oci = gpu_operator_release(pool_spec(stack_config({"provider": "oci", "oci": OCI}), receipt))
    assert oci.values["driver"] == {"enabled": False}
    assert oci.values["operator"]["defaultRuntime"] == "crio"
    bare = gpu_operator_release(pool_spec(stack_config({"provider": "nebius", "nebius": NEBIUS}),
                                          receipt))
    assert bare.values["driver"] == {"enabled": True}         # no drivers preset: operator's
    preset = gpu_operator_release(pool_spec(stack_config(
        {"provider": "nebius", "nebius": {**NEBIUS, "driversPreset": "cuda13.0"}}), receipt))
    assert preset.values["driver"] == {"enabled": False}


def test_gpu_operator_switch(receipt):
    skip = stack_config({"provider": "aws", "aws": AWS, "gpuOperator": "skip"})
    assert addon_releases(pool_spec(skip, receipt)) == []
    byo = stack_config({"provider": "existing", "gpuOperator": "install"})
    (release,) = addon_releases(pool_spec(byo, receipt))
    assert release.values["driver"] == {"enabled": False}
    # Cluster-wide: ClusterAddons installs it, once per cluster; the pool does not.
    assert not of_type(register_pool(byo), "kubernetes:helm.sh/v4:Chart")
    from k3infra.nodepool.cluster_addons import ClusterAddons
    reg = run(lambda: ClusterAddons("cluster-addons", {"config": byo, "receipt": receipt}))
    ns = one(reg, "kubernetes:core/v1:Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert one(reg, "kubernetes:helm.sh/v4:Chart")["version"] == load_pins().gpu_operator.version


def test_gpu_operator_refused_on_coreweave():
    from k3infra.config import ConfigError
    with pytest.raises(ConfigError, match="coreweave"):
        stack_config({"provider": "coreweave", "gpuOperator": "install"})


def test_version_range_refused(charts):
    _edit(charts / "addons.yaml", lambda d: d["gpuOperator"].update(version="^25.10"))
    with pytest.raises(AddonError, match="exact version"):
        load_pins(charts)


def test_version_older_than_b300_support_refused(charts):
    _edit(charts / "addons.yaml", lambda d: d["gpuOperator"].update(version="v25.3.4"))
    with pytest.raises(AddonError, match="HGX B300 needs GPU Operator v25.10.0"):
        load_pins(charts)


def test_values_typo_refused(charts, receipt):
    _edit(charts / "values" / "gpu-operator-aws.yaml",
          lambda d: d.update(dcgmExporer={"enabled": True}))
    with pytest.raises(AddonError, match="dcgmExporer.*not a known key"):
        gpu_operator_release(pool_spec(stack_config({"provider": "aws", "aws": AWS}), receipt),
                             charts)


def test_values_may_not_own_the_driver(charts, receipt):
    _edit(charts / "values" / "gpu-operator.yaml", lambda d: d.update(driver={"enabled": True}))
    with pytest.raises(AddonError, match="driver"):
        gpu_operator_release(pool_spec(stack_config({"provider": "aws", "aws": AWS}), receipt),
                             charts)


def test_missing_values_file_refused(charts, receipt):
    (charts / "values" / "gpu-operator-oci.yaml").unlink()
    with pytest.raises(AddonError, match="gpu-operator-oci.yaml: cannot be read"):
        gpu_operator_release(pool_spec(stack_config({"provider": "oci", "oci": OCI}), receipt),
                             charts)


def test_missing_provider_values_entry_refused(charts, receipt):
    _edit(charts / "addons.yaml", lambda d: d["gpuOperator"]["providerValues"].pop("nebius"))
    with pytest.raises(AddonError, match="no 'nebius' entry"):
        gpu_operator_release(pool_spec(stack_config({"provider": "nebius", "nebius": NEBIUS}),
                                       receipt), charts)


def test_broken_yaml_refused(charts):
    (charts / "addons.yaml").write_text("gpuOperator: [unclosed\n")
    with pytest.raises(AddonError, match="not valid YAML"):
        load_pins(charts)


def test_raid_script_is_valid_bash_and_quotes_the_root(tmp_path):
    script = raid0_mount_script("/mnt/k3 weights")
    assert "k3_root='/mnt/k3 weights'" in script
    path = tmp_path / "raid.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    with pytest.raises(ValueError):
        raid0_mount_script("relative/path")
