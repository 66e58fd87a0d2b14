"""Register a B300NodePool (or the whole stack) under the Pulumi SDK's mocks and return
what was registered: [(type, name, inputs)], inputs with wire (camelCase) names."""
from __future__ import annotations

import asyncio
from typing import Any, Callable

import pulumi

from k3infra.config import parse_stack_config
from k3infra.receipt import load_receipt

GOOD_REVISION = "3f1c2b4a5d6e7f8091a2b3c4d5e6f708192a3b4c"
IMAGE = "registry.example.com/k3/vllm-k3@sha256:" + "1" * 64
AWS = {"clusterName": "prod-eks",
       "nodeRoleArn": "arn:aws:iam::123456789012:role/eks-node",
       "subnets": [{"id": "subnet-0123456789abcdef0", "availabilityZone": "us-east-1b"}],
       "securityGroupIds": ["sg-0123456789abcdef0"]}
OCI = {"clusterId": "ocid1.cluster.oc1.iad.aaaa", "compartmentId": "ocid1.compartment.oc1..bbbb",
       "kubernetesVersion": "v1.33.1", "imageId": "ocid1.image.oc1.iad.cccc",
       "placements": [{"availabilityDomain": "Uocm:US-ASHBURN-AD-1",
                       "subnetId": "ocid1.subnet.oc1.iad.dddd"}]}
NEBIUS = {"clusterId": "mk8scluster-e00abc", "subnetId": "vpcsubnet-e00def"}


PROXY_IMAGE = "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:" + "cd" * 32


def stack_config(node_pool: dict, **keys: Any):
    raw = {"weightsRevision": GOOD_REVISION, "apiKey": "k", "engineImage": IMAGE,
           "nodePool": node_pool, **keys}
    # A pinned proxy image, so an update under mocks reaches what the test is about.
    raw["serving"] = {"proxyImage": PROXY_IMAGE, **keys.get("serving", {})}
    return parse_stack_config(raw, receipt=load_receipt())


class Recorder(pulumi.runtime.Mocks):
    def __init__(self):
        self.registered: list[tuple[str, str, dict]] = []

    def new_resource(self, args):
        self.registered.append((args.typ, args.name, dict(args.inputs)))
        outputs = dict(args.inputs)
        if args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            outputs["latestVersion"] = 3
        return f"{args.name}-id", outputs

    def call(self, args):
        return {}


def run(build: Callable[[], Any], mocks: Recorder | None = None) -> list[tuple[str, str, dict]]:
    """Run `build` (which registers resources) to completion under fresh mocks."""
    asyncio.set_event_loop(asyncio.new_event_loop())
    mocks = mocks or Recorder()
    pulumi.runtime.set_mocks(mocks, project="k3", stack="test", preview=False)

    @pulumi.runtime.test
    def program():
        built = build()
        urn = getattr(built, "urn", None)
        return urn if urn is not None else pulumi.Output.from_input(None)

    program()
    return mocks.registered


def register_pool(cfg, name: str = "k3-pool"):
    from k3infra.nodepool.component import B300NodePool
    return run(lambda: B300NodePool(name, {"config": cfg, "receipt": load_receipt()}))


def of_type(registered, typ: str) -> list[dict]:
    return [inputs for t, _, inputs in registered if t == typ]


def one(registered, typ: str) -> dict:
    found = of_type(registered, typ)
    assert len(found) == 1, f"expected one {typ}, got {len(found)}: {[t for t, _, _ in registered]}"
    return found[0]
