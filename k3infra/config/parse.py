"""Validating `k3:*` keys into a StackConfig against a receipt: the one decoder of
Pulumi's wire form, the error messages naming the key, the cross-field checks."""
from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from k3infra.config.base import CONFIG_NAMESPACE, SECRET_PLACEHOLDER, ConfigError, Secret
from k3infra.config.models import SECRET_KEYS, StackConfig
from k3infra.fieldtypes import CREDENTIALS_IN_URL, string_problem
from k3infra.podcommon import url_credentials
from k3infra.receipt import ChosenReceipt, Receipt, stack_receipt

# Past these a value is not a configuration: refused before pydantic sees it (a JSON
# `--config` or stack file value can nest or repeat without bound).
MAX_DEPTH = 16
MAX_ITEMS = 1024
# k3:nodePool.nodeCount's ceiling: node-local copies are one per node.
NODE_LOCAL_MAX_REPLICAS = 64
# Keys that moved, to the key that holds their value now (a stack file written before
# says where its value goes instead of only "not a known key").
MOVED_KEYS = {"serving.cpu": "serving.resources.cpu",
              "serving.memoryGi": "serving.resources.memoryGi"}




def _misspelt_namespace(ns: str) -> bool:
    """`K3`, `k3s`, `k3infra`, `k4`: a misspelling of `k3`, not another provider's
    namespace (kubernetes:, aws:, pulumi: keys of a stack file are theirs and pass)."""
    n = ns.lower()
    if n.startswith(CONFIG_NAMESPACE) or n.endswith(CONFIG_NAMESPACE):
        return True
    a, b = n, CONFIG_NAMESPACE      # one edit away (substitution, insertion, deletion)
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) <= 1
    short, long_ = sorted((a, b), key=len)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def _error_key(loc: tuple) -> str:
    """pydantic location -> the config key a user typed (`k3:serving.shmSizeGi`)."""
    parts = [str(p) for p in loc if not isinstance(p, int)]
    return f"{CONFIG_NAMESPACE}:" + ".".join(parts) if parts else CONFIG_NAMESPACE


def _accepted(err: dict) -> str:
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if err["type"] == "missing":
        return "is required"
    if err["type"] == "extra_forbidden":
        moved = MOVED_KEYS.get(_error_key(err["loc"]).split(":", 1)[1])
        return (f"is not a known key: it moved to {CONFIG_NAMESPACE}:{moved}" if moved
                else "is not a known key")
    return msg


def decode_value(key: str, value: Any) -> Any:
    """The one decoder of Pulumi's wire form (stack program, `--config`, policy pack):
    "true"/"false" are booleans, objects and lists are JSON, anything else is as given.
    Invalid JSON raises ConfigError naming `key`."""
    if not isinstance(value, str):
        return value
    if value in ("true", "false"):
        return value == "true"
    if value.startswith(("{", "[")):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(key, value, f"is not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise ConfigError(key, value[:80] + "...", "is not valid JSON (nested too deep)") from None
    return value


def check_values(key: str, value: Any, depth: int = 0) -> None:
    """Refuse, naming the key path, what no key accepts: a string with a control
    character or past MAX_STRING (a secret's value is checked, never printed), nesting past
    MAX_DEPTH, a list or object past MAX_ITEMS, a non-string object key, a value that is
    not JSON data (YAML's binary or timestamps)."""
    if depth > MAX_DEPTH:
        raise ConfigError(key, "...", f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, Secret):
        inner = value.reveal()
        problem = string_problem(inner) if isinstance(inner, str) else None
        if problem:
            raise ConfigError(key, value, problem)
        return
    if isinstance(value, str):
        problem = string_problem(value)
        if problem:
            raise ConfigError(key, value if len(value) <= 200 else value[:200] + "...", problem)
        masked = url_credentials(value)     # any key: a URL never carries credentials
        if masked is not None:
            raise ConfigError(key, masked if len(masked) <= 200 else masked[:200] + "...",
                              CREDENTIALS_IN_URL)
    elif isinstance(value, (dict, list)):
        if len(value) > MAX_ITEMS:
            raise ConfigError(key, f"<{len(value)} items>", f"holds more than {MAX_ITEMS} items")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for sub, item in items:
            if isinstance(value, dict):
                if not isinstance(sub, str):
                    raise ConfigError(key, sub, "object keys must be strings")
                check_values(key, sub, depth + 1)
            check_values(f"{key}.{sub}" if isinstance(value, dict) else f"{key}[{sub}]", item,
                         depth + 1)
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise ConfigError(key, f"<{type(value).__name__}>",
                          "must be a string, number, boolean, list or object")


def chosen_receipt(raw: dict[str, Any], root=None) -> ChosenReceipt:
    """The receipt the `k3:*` keys in `raw` name (k3:receipt), resolved in the project at
    `root`: read before the rest of the config, which is judged against it. A bad name or
    file raises ReceiptError, one line naming the key or the file."""
    name = raw.get(f"{CONFIG_NAMESPACE}:receipt", raw.get("receipt"))
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"{CONFIG_NAMESPACE}:receipt", name,
                          "a shipped receipt's id or a .yaml file inside the Pulumi project")
    return stack_receipt(name, root)


def parse_stack_config(raw: dict[str, Any], secret_keys: tuple[str, ...] = (), *,
                       receipt: Receipt) -> StackConfig:
    """Validate `k3:*` keys (full `k3:name` or bare `name`) into a StackConfig, against
    `receipt` (its defaults and allow-lists).

    Unknown keys are refused (a typo must not silently fall back to a default). Values
    of secret keys are wrapped before validation so no error message can print them.
    """
    data: dict[str, Any] = {}
    for full_key, value in raw.items():
        if not isinstance(full_key, str):
            raise ConfigError(str(full_key), value, "config keys are strings (k3:name)")
        ns, _, key = full_key.rpartition(":")
        if ns and ns != CONFIG_NAMESPACE:
            if _misspelt_namespace(ns):
                raise ConfigError(full_key, value, f"the namespace {ns!r} is not {CONFIG_NAMESPACE!r}:"
                                  f" did you mean {CONFIG_NAMESPACE}:{key}? (keys of other "
                                  "namespaces are ignored, so this one would have been)")
            continue
        if key in SECRET_KEYS or full_key in secret_keys or key in secret_keys:
            value = Secret(value) if value not in (None, "") else value
        else:
            value = decode_value(f"{CONFIG_NAMESPACE}:{key}", value)
        check_values(f"{CONFIG_NAMESPACE}:{key}", value)
        data[key] = value
    known = {f.alias or n for n, f in StackConfig.model_fields.items()}
    for key in data:
        if key not in known:
            raise ConfigError(f"{CONFIG_NAMESPACE}:{key}", data[key],
                              f"is not a known key; known keys: {', '.join(sorted(known))}")
    try:
        cfg = StackConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        value = None if err["type"] == "missing" else err.get("input")
        key = _error_key(err["loc"])
        if value is not None and key.split(":", 1)[1].split(".")[0] in SECRET_KEYS:
            value = Secret(value)
        raise ConfigError(key, value, _accepted(err)) from None
    cfg = _receipt_defaults(cfg, receipt)
    _check_cross_fields(cfg, receipt)
    return cfg


def _engine_build(cfg: StackConfig, receipt: Receipt) -> str:
    """k3:engine.build when unset: run the image given, or build the receipt's engine in
    the cluster. What cannot be derived is refused here, naming k3:engineImage."""
    if cfg.engine_image is not None:
        return "prebuilt"
    if receipt.engine.image is not None:
        raise ConfigError("k3:engineImage", None,
                          f"is required with receipt {receipt.id}: its engine is the released "
                          f"image {receipt.engine.image}, run by digest ({receipt.engine.image}"
                          "@sha256:<64 hex>; `k3infra pins --stack <stack> --write` resolves "
                          "the tag); nothing is built")
    if cfg.profile == "upstream":
        raise ConfigError("k3:engineImage", None,
                          "is required with k3:profile = upstream: a released vLLM image "
                          "pinned by digest, <repository>@sha256:<64 hex> (k3:engine.build "
                          "is then prebuilt)")
    if cfg.host is not None:
        raise ConfigError("k3:engineImage", None,
                          "is required on a Docker host (k3:host): <repository>@sha256:<64 hex>, "
                          "or k3:engine.build = local with k3:engine.registry")
    if cfg.engine.registry is None:
        raise ConfigError("k3:engineImage", None,
                          "is required unless the engine is built: <repository>@sha256:<64 hex>, "
                          "or k3:engine.registry and k3:engine.registrySecret to build the "
                          "receipt's engine in the cluster (k3:engine.build unset = in-cluster "
                          "without k3:engineImage)")
    return "in-cluster"


def _receipt_defaults(cfg: StackConfig, receipt: Receipt) -> StackConfig:
    update: dict[str, Any] = {}
    if cfg.engine.build is None:
        update["engine"] = cfg.engine.model_copy(update={"build": _engine_build(cfg, receipt)})
    if cfg.gpu_product is None:
        update["gpu_product"] = receipt.hardware.gpu_product_label
    if cfg.benchmark.concurrencies is None:
        update["benchmark"] = cfg.benchmark.model_copy(
            update={"concurrencies": list(receipt.workload_a.concurrencies)})
    return cfg.model_copy(update=update) if update else cfg


def _check_rollout(cfg: StackConfig) -> None:
    """The gate owns the partition (k3infra/serving/rollout.py): refused where it cannot."""
    if cfg.rollout.gate is not True:
        return
    for key, value, why in (
            ("k3:topology", cfg.topology, cfg.topology == "multi-node",),
            ("k3:autoscaling.enabled", True, cfg.autoscaling.enabled),
            ("k3:serving.updateStrategy", cfg.serving.update_strategy,
             cfg.serving.update_strategy != "RollingUpdate"),
            ("k3:serving.updatePartition", cfg.serving.update_partition,
             cfg.serving.update_partition != 0)):
        if why:
            raise ConfigError("k3:rollout.gate", True,
                              f"cannot gate with {key} = {value}: the gate holds one canary "
                              "replica of one StatefulSet with its partition (RollingUpdate, "
                              "a fixed k3:replicas, one node per replica); unset one of the two")


def _check_cross_fields(cfg: StackConfig, receipt: Receipt) -> None:
    # Here, not at the top: an import cycle. k3infra.topology imports ConfigError from
    # k3infra.config.base, and loading it runs k3infra.config's __init__, which imports
    # this module: at the top, `import k3infra.topology` first fails.
    from k3infra.topology import check_config as check_topology

    check_topology(cfg, receipt)
    _check_gateway(cfg)
    _check_autoscaling(cfg)
    if cfg.weights.store is not None and cfg.weights.hub_endpoint is not None:
        raise ConfigError("k3:weights.hubEndpoint", cfg.weights.hub_endpoint,
                          "has no effect with k3:weights.store: the store is the weights' "
                          "origin and no pod reads the Hub; unset one of the two")
    if cfg.weights.store is not None and cfg.host is not None:
        raise ConfigError("k3:weights.store", cfg.weights.store.url,
                          "is for clusters: a Docker host (k3:host) fills its weights from the "
                          "Hub (k3:weights.hubEndpoint for a mirror of it)")
    if cfg.weights.mode == "node-local" and cfg.replicas > NODE_LOCAL_MAX_REPLICAS:
        raise ConfigError("k3:replicas", cfg.replicas,
                          f"must be at most {NODE_LOCAL_MAX_REPLICAS} with k3:weights.mode = "
                          "node-local: each replica's node holds its own copy, filled through "
                          "the fan-out, and a node pool holds at most that many nodes")
    _check_rollout(cfg)
    if cfg.serving.update_partition > cfg.replicas:
        raise ConfigError("k3:serving.updatePartition", cfg.serving.update_partition,
                          f"must be at most k3:replicas ({cfg.replicas}); equal holds every pod")
    if cfg.profile != "custom" and (cfg.custom.args or cfg.custom.env):
        raise ConfigError("k3:custom", cfg.custom.model_dump(),
                          "engine-path changes need k3:profile = custom (the render is then "
                          "labelled as not the measured configuration)")
    for flag, value in cfg.surface.args.items():
        if flag in ("--host", "--port"):
            raise ConfigError(f"k3:surface.args.{flag}", value,
                              "is set by k3infra: vLLM listens on 127.0.0.1:"
                              "k3:serving.enginePort behind the authenticating proxy; the "
                              "client port is k3:serving.port")
        allowed = receipt.serve.surface_flag(flag)
        if allowed is None:
            accepted = ", ".join(a.flag for a in receipt.serve.surface.args)
            raise ConfigError(f"k3:surface.args.{flag}", value,
                              f"is not an allow-listed surface flag ({accepted}); engine-path "
                              "flags need k3:profile = custom and k3:custom.args")
        if allowed.takes_value is isinstance(value, bool):
            raise ConfigError(f"k3:surface.args.{flag}", value,
                              "takes a string value" if allowed.takes_value
                              else "is a switch: true or false")
    for name, value in cfg.surface.env.items():
        if name not in receipt.serve.surface.env:
            raise ConfigError(f"k3:surface.env.{name}", value,
                              f"is not an allow-listed surface variable "
                              f"({', '.join(receipt.serve.surface.env)})")
        if name == "VLLM_API_KEY":
            raise ConfigError(f"k3:surface.env.{name}", SECRET_PLACEHOLDER,
                              "the API key comes from the k3:apiKey secret only")
    if cfg.engine.build == "prebuilt" and cfg.engine_image is None:
        raise ConfigError("k3:engineImage", None,
                          "is required with k3:engine.build = prebuilt: "
                          "<repository>@sha256:<64 hex>")
    if cfg.profile == "upstream" and cfg.engine.build != "prebuilt":
        raise ConfigError("k3:engine.build", cfg.engine.build,
                          "the upstream profile runs a released image: prebuilt only (or leave "
                          "k3:engine.build unset) with k3:engineImage = that image by digest")


# GatewayClass names the implementations' own install docs use, for the message.
_CLASS_EXAMPLES = ("Envoy Gateway's quickstart: eg; kgateway: kgateway; Istio: istio; "
                   "GKE: gke-l7-rilb")


def _check_gateway(cfg: StackConfig) -> None:
    gw = cfg.gateway
    if not gw.enabled:
        return
    if cfg.host is not None:
        raise ConfigError("k3:gateway.enabled", True,
                          "is for clusters; a Docker host (k3:host) has no Gateway API")
    if gw.class_name is None:
        raise ConfigError("k3:gateway.className", None,
                          "is required with k3:gateway.enabled = true: the GatewayClass of an "
                          f"installed implementation ({_CLASS_EXAMPLES}), e.g. "
                          "--config gateway.className=eg")
    net = cfg.network
    for key, value in (("allowFromNamespaces", net.allow_from_namespaces),
                       ("allowFromPodLabels", net.allow_from_pod_labels)):
        if value:
            raise ConfigError(f"k3:network.{key}", value,
                              "must be empty with k3:gateway.enabled = true: clients reach the "
                              "serving pods only through the gateway; let them call the "
                              "Gateway instead (docs/gateway.md)")
    if gw.implementation == "gke" and not gw.proxy_cidrs:
        raise ConfigError("k3:gateway.proxyCidrs", [],
                          "is required with k3:gateway.implementation = gke: the proxy-only "
                          "subnet's CIDRs, where GKE's gateway proxies connect from")
    if gw.implementation == "gke" and (gw.proxy_namespace or gw.proxy_pod_labels):
        raise ConfigError("k3:gateway.proxyNamespace", gw.proxy_namespace,
                          "GKE's gateway proxies are not pods: name them by "
                          "k3:gateway.proxyCidrs only")


def _check_autoscaling(cfg: StackConfig) -> None:
    a = cfg.autoscaling
    if not a.enabled:
        return
    if cfg.host is not None:
        raise ConfigError("k3:autoscaling.enabled", True,
                          "is for clusters; a Docker host (k3:host) runs one replica")
    if a.max is None:
        raise ConfigError("k3:autoscaling.max", None,
                          "is required with k3:autoscaling.enabled = true: the most replicas "
                          "the autoscaler may run, each a whole 8-GPU node you pay for")
    if a.prometheus_url is None:
        raise ConfigError("k3:autoscaling.prometheusUrl", None,
                          "is required with k3:autoscaling.enabled = true: the Prometheus "
                          "that scrapes vllm:num_requests_waiting from the serving pods")
    # The PodDisruptionBudget lets a drain take one replica (maxUnavailable 1); one
    # must keep serving while it does.
    if a.min < 2:
        raise ConfigError("k3:autoscaling.min", a.min,
                          "must be at least 2: the PodDisruptionBudget lets a node drain take "
                          "one replica, and one must keep serving")
    if a.min > a.max:
        raise ConfigError("k3:autoscaling.min", a.min,
                          f"must be at most k3:autoscaling.max ({a.max})")
    if not a.min <= cfg.replicas <= a.max:
        raise ConfigError("k3:replicas", cfg.replicas,
                          f"must lie within k3:autoscaling.min..max ({a.min}..{a.max}): it "
                          "sizes the node pool and the weights copies")
    if cfg.weights.mode == "node-local" and cfg.replicas != a.max:
        raise ConfigError("k3:replicas", cfg.replicas,
                          f"must equal k3:autoscaling.max ({a.max}) with node-local weights: "
                          "each replica needs its node's prefetched copy")
    if cfg.serving.update_partition:
        raise ConfigError("k3:serving.updatePartition", cfg.serving.update_partition,
                          "must be 0 with k3:autoscaling.enabled: a canary holds a fixed "
                          "replica count, the autoscaler changes it")
