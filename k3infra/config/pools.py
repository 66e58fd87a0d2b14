"""k3:nodePool: one section per provider. The pool's SKU (instance type / shape /
platform) is fixed by each adapter in k3infra/nodepool/: a "B300 node pool" cannot be
pointed at other hardware by config."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from k3infra.config.base import _Section, unset
from k3infra.fieldtypes import GB, pattern

SecurityGroupId, _ = pattern(r"sg-[0-9a-f]{8,17}", "must be a security group id (sg-<8-17 hex>)")


_AWS_AZ = r"^[a-z]{2}(-[a-z0-9]+)+-\d+[a-z]$"


class AwsSubnet(_Section):
    """One subnet of the node group, with its AZ so preflight can check capacity blocks."""

    id: str = Field(pattern=r"^subnet-[0-9a-f]{8,17}$", description="the subnet's id")
    availability_zone: str = Field(pattern=_AWS_AZ, alias="availabilityZone",
                                   description="the subnet's availability zone")


class AwsCapacityBlock(_Section):
    """An EC2 Capacity Block for ML: the nodes launch into this reservation only."""

    reservation_id: str = Field(pattern=r"^cr-[0-9a-f]{8,17}$", alias="reservationId",
                                description="the Capacity Block's reservation id")
    availability_zone: str = Field(pattern=_AWS_AZ, alias="availabilityZone",
                                   description="the availability zone it is in")


class AwsPoolConfig(_Section):
    """k3:nodePool.aws: a pool on an existing EKS cluster."""

    cluster_name: str = Field(min_length=1, max_length=100, alias="clusterName",
                              description="the existing EKS cluster")
    mode: Literal["managed-node-group", "karpenter"] = Field(
        default="managed-node-group",
        description="`managed-node-group`: an aws.eks.NodeGroup and its launch template; "
                    "`karpenter`: a Karpenter NodePool and EC2NodeClass (Karpenter must "
                    "already run in the cluster)")
    node_role_arn: Optional[str] = Field(default=None, alias="nodeRoleArn",
                                         pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$",
                                         description="the node IAM role's ARN; required with "
                                                     "`managed-node-group`")
    node_role_name: Optional[str] = Field(default=None, alias="nodeRoleName", min_length=1,
                                          description="the node IAM role's name (Karpenter's "
                                                      "EC2NodeClass takes it by name); required "
                                                      "with `karpenter`")
    subnets: list[AwsSubnet] = Field(min_length=1,
                                     description="the node subnets, each with its availability "
                                                 "zone (so preflight can check capacity blocks)")
    security_group_ids: list[SecurityGroupId] = Field(
        min_length=1, max_length=16, alias="securityGroupIds",
        description="put on every network interface of the launch template (EFA needs a group "
                    "that allows all traffic to and from itself); usually the cluster security "
                    "group")
    capacity_block: Optional[AwsCapacityBlock] = Field(
        default=None, alias="capacityBlock",
        description="an EC2 Capacity Block for ML: the nodes launch into this reservation only")
    efa_interfaces: int = Field(default=16, ge=0, le=31, alias="efaInterfaces",
                                description="EFA-only interfaces on network cards 1..N (card 0 "
                                            "keeps the ENA primary interface). One K3 replica "
                                            "is one node, so serving does not need EFA; 0 "
                                            "leaves it out")
    root_volume_gib: int = Field(default=200, ge=50, le=16384, alias="rootVolumeGiB",
                                 description="the root gp3 volume, GiB")

    @model_validator(mode="after")
    def _role_for_mode(self) -> "AwsPoolConfig":
        if self.mode == "managed-node-group" and self.node_role_arn is None:
            raise ValueError("nodeRoleArn is required with mode managed-node-group")
        if self.mode == "karpenter" and self.node_role_name is None:
            raise ValueError("nodeRoleName is required with mode karpenter")
        return self


class OciPlacement(_Section):
    """One placement of the OKE node pool: an availability domain and its subnet."""

    availability_domain: str = Field(min_length=1, alias="availabilityDomain",
                                     description="the availability domain")
    subnet_id: str = Field(pattern=r"^ocid1\.subnet\.", alias="subnetId",
                           description="the node subnet there")
    capacity_reservation_id: Optional[str] = Field(
        default=None, pattern=r"^ocid1\.capacityreservation\.", alias="capacityReservationId",
        description="a capacity reservation the nodes launch into")


class OciPoolConfig(_Section):
    """k3:nodePool.oci: an OKE node pool on an existing cluster."""

    cluster_id: str = Field(pattern=r"^ocid1\.cluster\.", alias="clusterId",
                            description="the existing OKE cluster")
    compartment_id: str = Field(pattern=r"^ocid1\.(compartment|tenancy)\.", alias="compartmentId",
                                description="the compartment of the node pool")
    kubernetes_version: str = Field(pattern=r"^v\d+\.\d+\.\d+$", alias="kubernetesVersion",
                                    description="the node pool's Kubernetes version")
    image_id: str = Field(pattern=r"^ocid1\.image\.", alias="imageId",
                          description="an OKE GPU worker image for the region (ships the NVIDIA "
                                      "driver and container toolkit)")
    placements: list[OciPlacement] = Field(min_length=1,
                                           description="where the nodes go: availability "
                                                       "domains, subnets, reservations")
    compute_cluster_id: Optional[str] = Field(
        default=None, pattern=r"^ocid1\.computecluster\.", alias="computeClusterId",
        description="the compute cluster the nodes join: RDMA between nodes needs one (not "
                    "needed by a single-node replica; recommended for more than one node)")
    nsg_ids: list[str] = Field(default_factory=list, alias="nsgIds",
                               description="network security groups of the nodes")
    boot_volume_gb: int = Field(default=200, ge=50, le=32768, alias="bootVolumeGB",
                                description="the boot volume, GB")
    ssh_public_key: Optional[str] = Field(default=None, alias="sshPublicKey",
                                          description="an SSH public key for the nodes")


class NebiusPoolConfig(_Section):
    """k3:nodePool.nebius: an MK8s node group on an existing cluster."""

    cluster_id: str = Field(pattern=r"^mk8scluster-[a-z0-9]+$", alias="clusterId",
                            description="the existing MK8s cluster")
    subnet_id: Optional[str] = Field(default=None, pattern=r"^vpcsubnet-[a-z0-9]+$",
                                     alias="subnetId", description="the node subnet")
    drivers_preset: Optional[str] = Field(
        default=None, min_length=1, alias="driversPreset",
        description="an image with the NVIDIA driver preinstalled (`nebius mk8s node-group "
                    "get-compatibility-matrix` lists them)",
        json_schema_extra=unset("unset: the GPU Operator installs the driver"))
    gpu_cluster_id: Optional[str] = Field(
        default=None, min_length=1, alias="gpuClusterId",
        description="the compute GPU cluster (InfiniBand fabric) the nodes join; optional "
                    "for one node")
    reservation_ids: list[str] = Field(default_factory=list, alias="reservationIds",
                                       description="capacity block groups, in order of "
                                                   "preference; empty means on-demand")
    boot_disk_gib: int = Field(default=200, ge=64, le=16384, alias="bootDiskGiB",
                               description="the boot disk, GiB")
    service_account_id: Optional[str] = Field(default=None, alias="serviceAccountId",
                                              description="the nodes' service account")


class CoreWeavePoolConfig(_Section):
    """k3:nodePool.coreweave: a CKS NodePool custom resource in the cluster."""

    instance_type: str = Field(default="b300-8x", pattern=r"^[a-z0-9][a-z0-9-]*$",
                               alias="instanceType",
                               description="the CoreWeave instance id of the 8x B300 node; "
                                           "check it against the CoreWeave instance list for "
                                           "your zone before the first run")


class ExistingPoolConfig(_Section):
    """k3:nodePool.existing: bring-your-own nodes; nothing is created."""


class NodePoolConfig(_Section):
    """The B300 node pool (k3:nodePool); `existing` creates nothing.

    `provider` picks the adapter; the section of the same name (`aws`, `oci`, `nebius`,
    `coreweave`) holds that cloud's settings and is the only one accepted."""

    page = "clouds.md"

    provider: Literal["existing", "aws", "oci", "nebius", "coreweave"] = Field(
        default="existing",
        description="the adapter; only the section of that name is accepted")
    node_count: Optional[int] = Field(
        default=None, ge=1, le=64, alias="nodeCount",
        description="nodes in the pool; preflight refuses fewer than `k3:replicas`",
        json_schema_extra=unset("`k3:replicas` (a replica is a whole node)"))
    local_nvme_gb: Optional[GB] = Field(
        default=None, alias="localNvmeGB",
        description="local NVMe per node in decimal GB, for the node-local weights check; "
                    "known for the AWS SKU, other clouds must state it to use "
                    "`k3:weights.mode` = `node-local`",
        json_schema_extra=unset("AWS: the SKU's; others: unset"))
    local_nvme_margin_pct: float = Field(
        default=10.0, ge=0, le=400, alias="localNvmeMarginPct",
        description="head-room on top of the weights in node-local mode (engine image, "
                    "compile cache), percent")
    gpu_operator: Literal["auto", "install", "skip"] = Field(
        default="auto", alias="gpuOperator",
        description="`auto` installs the NVIDIA GPU Operator on aws/oci/nebius, never on "
                    "coreweave (CKS manages the GPU stack; `install` is refused there), not on "
                    "existing clusters (they usually run their own); `install`; `skip`")
    aws: Optional[AwsPoolConfig] = Field(default=None,
                                         description="a pool on an existing EKS cluster")
    oci: Optional[OciPoolConfig] = Field(default=None,
                                         description="an OKE node pool on an existing cluster")
    nebius: Optional[NebiusPoolConfig] = Field(
        default=None, description="an MK8s node group on an existing cluster")
    coreweave: Optional[CoreWeavePoolConfig] = Field(
        default=None, description="a CKS NodePool custom resource in the cluster; every "
                                  "setting has a default")
    existing: Optional[ExistingPoolConfig] = Field(
        default=None, description="bring-your-own nodes; nothing is created (no settings)")

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
