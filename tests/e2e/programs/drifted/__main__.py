"""The shipped stack program, plus a test-only transform that changes one engine-path
flag of the serving StatefulSet (--block-size 128 -> 64): drift the policy pack refuses."""
import pulumi

from k3infra.program import run


def drift_block_size(args: pulumi.ResourceTransformArgs):
    if args.type_ != "kubernetes:apps/v1:StatefulSet":
        return None
    for container in args.props["spec"]["template"]["spec"]["containers"]:
        tokens = container.get("args") or []
        for i, token in enumerate(tokens[:-1]):
            if token == "--block-size":
                tokens[i + 1] = "64"
    return pulumi.ResourceTransformResult(args.props, args.opts)


pulumi.runtime.register_resource_transform(drift_block_size)
run()
