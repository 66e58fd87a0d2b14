"""How the Kubernetes names of one K3ServingStack derive from its instance name.

The rule (docs/configuration.md, "Names"):

- the instance name is the component's Pulumi name (`K3ServingStack("kimi-k3", ...)`);
  it must be a DNS-1035 label of at most MAX_INSTANCE_LENGTH characters;
- every namespaced object is `<instance>` or `<instance>-<suffix>` (StatefulSet and
  Service `<instance>`, `<instance>-headless`, `<instance>-api-key`,
  `<instance>-weights-prefetch`, `<instance>-engine-build-<hash>`, ...);
- the namespace is k3:namespace, or the instance name when unset; the instance creates
  it only when it is its own name or k3:createNamespace says so (`creates_namespace`);
  the in-cluster build's namespace is k3:engine.buildNamespace, or `<namespace>-build`;
- labels: `app.kubernetes.io/name: kimi-k3` (what runs) and
  `app.kubernetes.io/instance: <instance>` (which copy); every selector includes the
  instance, so two instances never select each other's pods;
- node pools label their nodes `k3infra.dev/pool: <instance>`, and the serving pods
  of k3infra-created pools require that label.

Two instances with different names therefore share no Kubernetes object. Cluster-wide
add-ons (the GPU Operator) are not part of an instance: `k3infra.nodepool.addons`'
`GpuOperator` component is created once per cluster.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from k3infra.config import ConfigError


# The instance name of the stack program's K3ServingStack (`__main__.py`); with
# k3:namespace unset it is also the namespace the CLI reads (verify, fetch).
PROGRAM_INSTANCE = "kimi-k3"

APP = "kimi-k3"                      # app.kubernetes.io/name of every instance
# app.kubernetes.io/component values that selectors of one module match on pods another
# module builds (NetworkPolicies select the prefetch and benchmark pods).
PREFETCH_COMPONENT = "weights-prefetch"
PREPULL_COMPONENT = "image-prepull"
SOURCE_COMPONENT = "weights-source"      # in-cluster sources of verified weights copies
BENCHMARK_COMPONENT = "benchmark"
ROLLOUT_GATE_COMPONENT = "rollout-gate"     # the gate's benchmark Job (serving/rollout.py)
BENCHMARK_RESULTS_COMPONENT = "benchmark-results"
BENCHMARK_READER_COMPONENT = "benchmark-reader"
ACCURACY_COMPONENT = "accuracy-smoke"
# The inference gateway's endpoint picker (k3infra/gateway): the serving pods' policy
# admits it to their metrics port.
EPP_COMPONENT = "endpoint-picker"
LABEL_MAX = 63                       # Kubernetes label values and DNS labels
# The longest derived name is the in-cluster build's context ConfigMap,
# `<instance>-engine-context-<10 hex>` (26 characters on top of the instance); every
# derived name, label value and Job pod label must fit in LABEL_MAX.
LONGEST_SUFFIX = len("-engine-context-") + 10
MAX_INSTANCE_LENGTH = LABEL_MAX - LONGEST_SUFFIX          # 37
_DNS_1035 = re.compile(r"\A[a-z]([-a-z0-9]*[a-z0-9])?\Z")


def check_instance_name(name: str, what: str = "K3ServingStack name") -> str:
    """Refuse an instance name that cannot prefix every derived Kubernetes name (`what`:
    the component whose name it is, for the message)."""
    if not isinstance(name, str) or not _DNS_1035.match(name):
        raise ConfigError(what, name,
                          "must be a DNS-1035 label (lowercase letters, digits and '-', "
                          "starting with a letter): it prefixes every Kubernetes name")
    if len(name) > MAX_INSTANCE_LENGTH:
        raise ConfigError(what, name,
                          f"is {len(name)} characters; at most {MAX_INSTANCE_LENGTH}, so the "
                          f"longest derived name (<name>-engine-context-<hash>) fits the "
                          f"{LABEL_MAX}-character label limit")
    return name



def creates_namespace(namespace: str, create: Optional[bool], instance: str) -> bool:
    """Whether the instance creates (owns, deletes on destroy) its namespace. A component
    owns only what it creates: the namespace named after the instance is its own unless
    k3:createNamespace is false; any other name may be shared by several instances or
    be the user's, so it must say which (two creators of one Namespace collide on
    create, and destroying either deletes it under the other)."""
    if create is not None:
        return create
    if namespace == instance:
        return True
    raise ConfigError("k3:createNamespace", None,
                      f"must be set when k3:namespace ({namespace!r}) is not the instance "
                      f"name ({instance!r}): true to create and own the namespace (with its "
                      "Pod Security labels), false to deploy into one that exists")


@dataclass(frozen=True)
class ServingNames:
    base: str
    namespace: str
    # True for a multi-node stack: the serving pods are LeaderWorkerSet groups
    # (k3infra/serving/group.py), `<base>-r<replica>-0` and `<base>-r<replica>-0-<worker>`.
    groups: bool = False

    @property
    def statefulset(self) -> str:
        return self.base

    @property
    def service(self) -> str:
        return self.base

    @property
    def headless(self) -> str:
        return f"{self.base}-headless"

    @property
    def api_key_secret(self) -> str:
        return f"{self.base}-api-key"

    @property
    def proxy_config(self) -> str:
        return f"{self.base}-proxy"

    @property
    def hf_token_secret(self) -> str:
        return f"{self.base}-hf-token"

    @property
    def pdb(self) -> str:
        return self.base


def labels(instance: str, component: str = "serving") -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/component": component, "app.kubernetes.io/part-of": "k3infra",
            "app.kubernetes.io/managed-by": "pulumi"}


def selector_labels(instance: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/component": "serving"}
