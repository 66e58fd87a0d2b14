"""k3:nodePool: one section per provider. The pool's SKU (instance type / shape /
platform) is fixed by each adapter in k3infra/nodepool/: a "B300 node pool" cannot be
pointed at other hardware by config."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from k3infra.config.base import (_Section)
from k3infra.fieldtypes import GB, pattern

SecurityGroupId, _ = pattern(r"sg-[0-9a-f]{8,17}", "must be a security group id (sg-<8-17 hex>)")


_AWS_AZ = r"^[a-z]{2}(-[a-z0-9]+)+-\d+[a-z]$"


class AwsSubnet(_Section):
    """One subnet of the node group, with its AZ so preflight can check capacity blocks."""

    id: str = Field(pattern=r"^subnet-[0-9a-f]{8,17}$")
    availability_zone: str = Field(pattern=_AWS_AZ, alias="availabilityZone")


class AwsCapacityBlock(_Section):
    """An EC2 Capacity Block for ML: the nodes launch into this reservation only."""

    reservation_id: str = Field(pattern=r"^cr-[0-9a-f]{8,17}$", alias="reservationId")
    availability_zone: str = Field(pattern=_AWS_AZ, alias="availabilityZone")


class AwsPoolConfig(_Section):
    """k3:nodePool.aws: a pool on an existing EKS cluster."""

    cluster_name: str = Field(min_length=1, max_length=100, alias="clusterName")
    # "managed-node-group": aws.eks.NodeGroup + launch template. "karpenter": a Karpenter
    # NodePool + EC2NodeClass (Karpenter must already run in the cluster).
    mode: Literal["managed-node-group", "karpenter"] = "managed-node-group"
    node_role_arn: Optional[str] = Field(default=None, alias="nodeRoleArn",
                                         pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
    # Karpenter's EC2NodeClass takes the node role by name.
    node_role_name: Optional[str] = Field(default=None, alias="nodeRoleName", min_length=1)
    subnets: list[AwsSubnet] = Field(min_length=1)
    # Put on every network interface of the launch template (EFA needs a group that
    # allows all traffic to and from itself); usually the cluster security group.
    security_group_ids: list[SecurityGroupId] = Field(min_length=1, max_length=16,
                                                      alias="securityGroupIds")
    capacity_block: Optional[AwsCapacityBlock] = Field(default=None, alias="capacityBlock")
    # EFA-only interfaces on network cards 1..N (card 0 keeps the ENA primary interface).
    # One K3 replica is one node, so serving does not need EFA; 0 leaves it out.
    efa_interfaces: int = Field(default=16, ge=0, le=31, alias="efaInterfaces")
    root_volume_gib: int = Field(default=200, ge=50, le=16384, alias="rootVolumeGiB")

    @model_validator(mode="after")
    def _role_for_mode(self) -> "AwsPoolConfig":
        if self.mode == "managed-node-group" and self.node_role_arn is None:
            raise ValueError("nodeRoleArn is required with mode managed-node-group")
        if self.mode == "karpenter" and self.node_role_name is None:
            raise ValueError("nodeRoleName is required with mode karpenter")
        return self


class OciPlacement(_Section):
    availability_domain: str = Field(min_length=1, alias="availabilityDomain")
    subnet_id: str = Field(pattern=r"^ocid1\.subnet\.", alias="subnetId")
    capacity_reservation_id: Optional[str] = Field(
        default=None, pattern=r"^ocid1\.capacityreservation\.", alias="capacityReservationId")


class OciPoolConfig(_Section):
    """k3:nodePool.oci: an OKE node pool on an existing cluster."""

    cluster_id: str = Field(pattern=r"^ocid1\.cluster\.", alias="clusterId")
    compartment_id: str = Field(pattern=r"^ocid1\.(compartment|tenancy)\.", alias="compartmentId")
    kubernetes_version: str = Field(pattern=r"^v\d+\.\d+\.\d+$", alias="kubernetesVersion")
    # An OKE GPU worker image for the region (ships the NVIDIA driver and container toolkit).
    image_id: str = Field(pattern=r"^ocid1\.image\.", alias="imageId")
    placements: list[OciPlacement] = Field(min_length=1)
    # RDMA between nodes needs the nodes inside one compute cluster (not needed by a
    # single-node replica; recommended for more than one node).
    compute_cluster_id: Optional[str] = Field(default=None, pattern=r"^ocid1\.computecluster\.",
                                              alias="computeClusterId")
    nsg_ids: list[str] = Field(default_factory=list, alias="nsgIds")
    boot_volume_gb: int = Field(default=200, ge=50, le=32768, alias="bootVolumeGB")
    ssh_public_key: Optional[str] = Field(default=None, alias="sshPublicKey")


class NebiusPoolConfig(_Section):
    """k3:nodePool.nebius: an MK8s node group on an existing cluster."""

    cluster_id: str = Field(pattern=r"^mk8scluster-[a-z0-9]+$", alias="clusterId")
    subnet_id: Optional[str] = Field(default=None, pattern=r"^vpcsubnet-[a-z0-9]+$",
                                     alias="subnetId")
    # Image with the NVIDIA driver preinstalled (`nebius mk8s node-group
    # get-compatibility-matrix` lists them); unset, the GPU Operator installs the driver.
    drivers_preset: Optional[str] = Field(default=None, min_length=1, alias="driversPreset")
    # Compute GPU cluster (InfiniBand fabric) the nodes join; optional for one node.
    gpu_cluster_id: Optional[str] = Field(default=None, min_length=1, alias="gpuClusterId")
    # Capacity block groups, in order of preference; empty means on-demand.
    reservation_ids: list[str] = Field(default_factory=list, alias="reservationIds")
    boot_disk_gib: int = Field(default=200, ge=64, le=16384, alias="bootDiskGiB")
    service_account_id: Optional[str] = Field(default=None, alias="serviceAccountId")


class CoreWeavePoolConfig(_Section):
    """k3:nodePool.coreweave: a CKS NodePool custom resource in the cluster."""

    # CoreWeave instance id of the 8x B300 node; check it against the CoreWeave
    # instance list for your zone before the first run.
    instance_type: str = Field(default="b300-8x", pattern=r"^[a-z0-9][a-z0-9-]*$",
                               alias="instanceType")


class ExistingPoolConfig(_Section):
    """k3:nodePool.existing: bring-your-own nodes; nothing is created."""


class NodePoolConfig(_Section):
    """The B300 node pool (k3:nodePool); `existing` creates nothing.

    `provider` picks the adapter; the section of the same name (`aws`, `oci`, `nebius`,
    `coreweave`) holds that cloud's settings and is the only one accepted."""

    provider: Literal["existing", "aws", "oci", "nebius", "coreweave"] = "existing"
    # Nodes in the pool; unset means one per serving replica (a replica is a whole node).
    node_count: Optional[int] = Field(default=None, ge=1, le=64, alias="nodeCount")
    # Local NVMe per node in decimal GB, for the node-local weights check. Known for
    # the AWS SKU; other clouds must state it to use k3:weights.mode = node-local.
    local_nvme_gb: Optional[GB] = Field(default=None, alias="localNvmeGB")
    # Head-room on top of the weights in node-local mode (engine image, compile cache).
    local_nvme_margin_pct: float = Field(default=10.0, ge=0, le=400, alias="localNvmeMarginPct")
    # auto: install the NVIDIA GPU Operator on aws/oci/nebius, never on coreweave (CKS
    # manages the GPU stack), not on existing clusters (they usually run their own).
    gpu_operator: Literal["auto", "install", "skip"] = Field(default="auto", alias="gpuOperator")
    aws: Optional[AwsPoolConfig] = None
    oci: Optional[OciPoolConfig] = None
    nebius: Optional[NebiusPoolConfig] = None
    coreweave: Optional[CoreWeavePoolConfig] = None
    existing: Optional[ExistingPoolConfig] = None

    @model_validator(mode="before")
    @classmethod
    def _coreweave_defaults(cls, data: Any) -> Any:
        # Every CoreWeave setting has a default: an empty section is implied.
        if isinstance(data, dict) and data.get("provider") == "coreweave":
            data = {"coreweave": {}, **data}
        return data

    @model_validator(mode="after")
    def _one_provider_section(self) -> "NodePoolConfig":
        sections = ("aws", "oci", "nebius", "coreweave", "existing")
        others = [s for s in sections if s != self.provider and getattr(self, s) is not None]
        if others:
            raise ValueError(f"section {others[0]!r} does not belong to provider "
                             f"{self.provider!r}; only k3:nodePool.{self.provider} is accepted")
        if self.provider in ("aws", "oci", "nebius") and getattr(self, self.provider) is None:
            raise ValueError(f"provider {self.provider!r} needs the k3:nodePool.{self.provider} "
                             "section (cluster, network and capacity settings)")
        if self.provider == "coreweave" and self.gpu_operator == "install":
            raise ValueError("gpuOperator = 'install' is refused on coreweave: CKS manages the "
                             "NVIDIA driver and device plugin; accepted: auto or skip")
        return self

    @property
    def settings(self) -> Optional[_Section]:
        """The provider's own section (None for `existing` without one)."""
        return getattr(self, self.provider)
