"""The stack configuration: every `k3:*` key as a pydantic model.

Loaded from Pulumi config by the stack program, and from `stacks/Pulumi.<stack>.yaml`
plus `--config KEY=VALUE` overrides by `k3infra render`. Invalid input raises
`ConfigError` naming the key, the value and what is accepted, before any resource is
registered. No Pulumi import here: the same parser serves both paths.

The receipt is an explicit argument of `parse_stack_config`: defaults that come from
it (k3:gpuProduct, k3:benchmark.concurrencies) and the surface allow-list are read from
the receipt the caller deploys, so a custom receipt validates against itself.

Modules: `base` (constants, error type, secret wrapper, shared checks), `pools` (the
per-cloud k3:nodePool schemas), `models` (the sections and StackConfig), `parse`
(validation against a receipt, the wire-form decoder), `stackfile` (stack files and
`--config`). Everything is importable from `k3infra.config` as before.
"""
from k3infra.config.base import (
    CONFIG_NAMESPACE,
    COMMIT_RE,
    DIGEST_IMAGE_RE,
    DNS_LABEL_RE,
    SECRET_PLACEHOLDER,
    API_KEY_RE,
    PROXY_IMAGE,
    ConfigError,
    Secret)
from k3infra.config.pools import (
    AwsSubnet,
    AwsCapacityBlock,
    AwsPoolConfig,
    OciPlacement,
    OciPoolConfig,
    NebiusPoolConfig,
    CoreWeavePoolConfig,
    ExistingPoolConfig,
    NodePoolConfig)
from k3infra.config.models import (
    SurfaceConfig,
    AccuracyConfig,
    ACCURACY_IMAGE,
    CustomConfig,
    ServingConfig,
    ColdStartConfig,
    StoreConfig,
    WeightsConfig,
    BaseImages,
    EngineConfig,
    BenchmarkConfig,
    MonitoringConfig,
    MultiNodeConfig,
    NetworkConfig,
    GatewayConfig,
    AutoscalingConfig,
    EPP_IMAGE,
    SECRET_KEYS,
    StackConfig)
from k3infra.config.parse import (
    chosen_receipt,
    decode_value,
    parse_stack_config)
from k3infra.config.stackfile import (
    STACK_DIR,
    STACK_TEMPLATES,
    stack_file,
    stack_names,
    read_stack_file,
    apply_override,
    to_pulumi_config)

__all__ = [
    "CONFIG_NAMESPACE",
    "COMMIT_RE",
    "DIGEST_IMAGE_RE",
    "DNS_LABEL_RE",
    "SECRET_PLACEHOLDER",
    "API_KEY_RE",
    "PROXY_IMAGE",
    "SECRET_KEYS",
    "ConfigError",
    "Secret",
    "AwsSubnet",
    "AwsCapacityBlock",
    "AwsPoolConfig",
    "OciPlacement",
    "OciPoolConfig",
    "NebiusPoolConfig",
    "CoreWeavePoolConfig",
    "ExistingPoolConfig",
    "NodePoolConfig",
    "SurfaceConfig",
    "CustomConfig",
    "ServingConfig",
    "ColdStartConfig",
    "StoreConfig",
    "WeightsConfig",
    "BaseImages",
    "EngineConfig",
    "BenchmarkConfig",
    "MonitoringConfig",
    "MultiNodeConfig",
    "NetworkConfig",
    "GatewayConfig",
    "AutoscalingConfig",
    "EPP_IMAGE",
    "StackConfig",
    "chosen_receipt",
    "decode_value",
    "parse_stack_config",
    "STACK_DIR",
    "STACK_TEMPLATES",
    "stack_file",
    "stack_names",
    "read_stack_file",
    "apply_override",
    "to_pulumi_config",
]
