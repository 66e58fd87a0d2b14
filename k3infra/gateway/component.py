"""`InferenceGateway`: registers the gateway's objects (k3:gateway) for one instance."""
from __future__ import annotations

from typing import Optional, Required, TypedDict, Union

import pulumi

from k3infra.componentargs import required
from k3infra.config import StackConfig
from k3infra.gateway import auth, picker, routes
from k3infra.gateway.names import GatewayNames
from k3infra.gateway.network import picker_policy
from k3infra.gateway.pool import inference_pool
from k3infra.inputs import StackInputs
from k3infra.kube import apply_built, apply_manifest, child_options


class InferenceGatewayArgs(TypedDict):
    config: Required[Union[StackConfig, StackInputs]]  # the validated stack config (k3:gateway)
    instance: Required[str]         # the instance the gateway fronts
    namespace: Required[str]        # its namespace
    apiKey: Required[pulumi.Input[str]]   # the k3:apiKey value (a secret Output)


class InferenceGateway(pulumi.ComponentResource):
    """The picker's NetworkPolicy first, then its RBAC, config, Deployment and Service,
    the InferencePool, the Gateway, (Envoy Gateway) the key policy with its keys Secret,
    and last the HTTPRoute. Every child records the component's `opts.depends_on`."""

    pool_name: pulumi.Output[str]
    gateway_name: pulumi.Output[str]

    def __init__(self, name: str, args: InferenceGatewayArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        inputs = StackInputs.of(required(args, "config", "InferenceGateway",
                                         (StackConfig, StackInputs), "the validated stack config"))
        instance = required(args, "instance", "InferenceGateway", str)
        namespace = required(args, "namespace", "InferenceGateway", str)
        api_key = required(args, "apiKey", "InferenceGateway", what="the k3:apiKey value")
        plain = inputs.plain
        names = GatewayNames(instance, namespace)
        super().__init__("k3infra:index:InferenceGateway", name, None, opts)

        def built(suffix: str, build, *deps: pulumi.Resource) -> pulumi.CustomResource:
            return apply_built(f"{name}-{suffix}", inputs, build,
                               child_options(self, opts, *deps))

        policy = built("netpol", lambda c: picker_policy(c, names, instance))
        account = built("sa", lambda c: picker.service_account(names, instance))
        role = built("role", lambda c: picker.role(names, instance))
        binding = built("rolebinding", lambda c: picker.role_binding(names, instance), account, role)
        config = built("epp-config", lambda c: picker.configmap(c, names, instance))
        built("epp", lambda c: picker.deployment(c, names, instance), policy, binding, config)
        built("epp-svc", lambda c: picker.service(names, instance))
        pool = built("pool", lambda c: inference_pool(c, names, instance))
        gw = built("gateway", lambda c: routes.gateway(c, names, instance))
        route_deps = [gw, pool]
        if auth.renders_key_policy(plain):
            keys = apply_manifest(f"{name}-keys", auth.keys_secret(names, instance, api_key),
                                  child_options(self, opts))
            # The route comes after its key policy: never a route without the key check.
            route_deps.append(built("key-policy", lambda c: auth.security_policy(names, instance),
                                    keys, gw))
        built("route", lambda c: routes.http_route(c, names, instance), *route_deps)
        self.pool_name = pulumi.Output.from_input(names.pool)
        self.gateway_name = pulumi.Output.from_input(names.gateway)
        self.register_outputs({"pool_name": self.pool_name, "gateway_name": self.gateway_name})
