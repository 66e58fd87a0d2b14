"""A change of the serving pods reaches production behind a benchmark gate (k3:rollout).

Inside Pulumi's own model, three objects in a chain (docs/receipts.md):

1. the StatefulSet, registered with `partition: replicas - 1`: a change of its pod
   template (a new receipt, engine, flag, runtime) replaces only the canary, the highest
   ordinal; pulumi-kubernetes waits for it Ready (`pulumi.com/waitFor`, manifests.py);
2. the gate Job, depending on it and named by the template's digest (a new template is a
   new Job): the benchmark runner measures the canary pod alone, through its own DNS
   name, not the Service, and judges the run against the stack's receipt
   (k3infra/bench/verdict.py); a refusal fails the Job, and `pulumi up` exits non-zero
   with the table (the container's termination message);
3. the promotion, a StatefulSetPatch of `partition: 0` depending on the Job (the same
   digest in its annotation, so each template is promoted once); pulumi-kubernetes then
   waits for every replica on the new template.

A candidate receipt has no figures to judge: its gate Job records the canary's run and
nothing is promoted until the stack names the measured receipt. With one replica there
is no spare to hold the old template: the gate, when asked for, benchmarks the only pod
after the roll and fails loudly. Pure: no Pulumi.
"""
from __future__ import annotations

import hashlib
import json
from k3infra import naming
from k3infra.config import StackConfig
from k3infra.naming import ServingNames
from k3infra.receipt import Receipt
from k3infra.topology import is_multi_node

GATE_KIND = "gate"                      # JobNames kind: <base>-gate-runtime, -results
GATE_SELECTOR = f"app.kubernetes.io/component={naming.ROLLOUT_GATE_COMPONENT}"
TEMPLATE_ANNOTATION = "k3infra.dev/template"
PROMOTED_ANNOTATION = "k3infra.dev/promoted-template"
WAIT_FOR_ANNOTATION = "pulumi.com/waitFor"      # pulumi-kubernetes' await of an object
DIGEST_CHARS = 12


def gated(cfg: StackConfig) -> bool:
    """k3:rollout.gate, or its default: on with two or more single-node replicas that a
    RollingUpdate moves and no autoscaler or manual partition owns."""
    if cfg.rollout.gate is not None:
        return cfg.rollout.gate
    return (cfg.replicas >= 2 and not is_multi_node(cfg) and not cfg.autoscaling.enabled
            and cfg.serving.update_strategy == "RollingUpdate"
            and cfg.serving.update_partition == 0)


def partition(cfg: StackConfig) -> int:
    """The partition the StatefulSet is registered with: every replica below the canary
    (the highest ordinal) holds the old template until the gate promotes the new one."""
    return cfg.replicas - 1 if gated(cfg) else cfg.serving.update_partition


def canary_pod(cfg: StackConfig, names: ServingNames) -> str:
    return f"{names.statefulset}-{cfg.replicas - 1}"


def canary_url(cfg: StackConfig, names: ServingNames) -> str:
    """The canary pod alone, by its own DNS name under the headless Service (the proxy's
    port, the key check included): the Service would spread the load over both templates."""
    return (f"http://{canary_pod(cfg, names)}.{names.headless}.{names.namespace}"
            f".svc.cluster.local:{cfg.serving.port}")


def template_digest(template: dict) -> str:
    """The pod template's identity: any change the StatefulSet controller rolls is a new
    digest (canonical JSON, so key order does not count)."""
    doc = json.dumps(template, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:DIGEST_CHARS]


def gate_job_name(base: str, digest: str) -> str:
    return f"{base}-{GATE_KIND}-{digest}"


def judge_spec(receipt: Receipt, cfg: StackConfig) -> dict:
    """What the gate's runner judges against (`--gate`): the receipt's e2el figures and
    k3:benchmark.tolerancePct; a candidate's run is recorded, never judged."""
    if receipt.is_candidate:
        return {"receipt": receipt.id, "candidate": True}
    return {"receipt": receipt.id, "tolerance_pct": cfg.benchmark.tolerance_pct,
            "figures": [{"concurrency": m.concurrency, "p50_ms": m.p50_ms, "p99_ms": m.p99_ms}
                        for m in receipt.measured if m.metric == "e2el"]}


def promotion_patch(names: ServingNames, digest: str, replicas: int) -> dict:
    """`partition: 0` once the gate passed: the other replicas take the new template. The
    digest says which template this promotes (a new one is a new apply).

    pulumi-kubernetes awaits a patch by the live object's `pulumi.com/waitFor`: left to
    the StatefulSet's own (the canary's: one replica on the new template), `pulumi up`
    returned while replica 0 still ran the old receipt (found by the node tier with two
    replicas). The patch carries its own: every replica ready on the new template."""
    done = f"jsonpath={{$[?@.readyReplicas == {replicas} && @.updatedReplicas == {replicas}]}}"
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": names.statefulset, "namespace": names.namespace,
                         "annotations": {PROMOTED_ANNOTATION: digest,
                                         WAIT_FOR_ANNOTATION: json.dumps([done]),
                                         # The StatefulSet's own registration sets the
                                         # partition and its await back at the next
                                         # change: both force.
                                         "pulumi.com/patchForce": "true"}},
            "spec": {"updateStrategy": {"type": "RollingUpdate",
                                        "rollingUpdate": {"partition": 0}}}}


def what_happens(receipt: Receipt, cfg: StackConfig) -> str:
    """One line for the render: what a change of the serving pods does on this stack."""
    if not gated(cfg):
        return ("ungated: a change rolls every replica, one at a time from the highest ordinal "
                "(k3:rollout.gate)")
    judged = (f"a benchmark against receipt {receipt.id} (+-{cfg.benchmark.tolerance_pct:g} %)"
              if not receipt.is_candidate else
              f"a benchmark recorded, not judged (receipt {receipt.id} is a candidate): no promotion")
    if cfg.replicas == 1:
        return (f"gated after the roll: the one replica rolls, then {judged}; a refusal fails "
                "`pulumi up` with the pod already replaced (no spare replica: with a spare node, "
                "surge to k3:replicas 2 for the roll, docs/receipts.md)")
    return (f"gated: the canary {cfg.replicas - 1} rolls first, then {judged}, then replicas "
            f"0-{cfg.replicas - 2} roll only if it passes")
