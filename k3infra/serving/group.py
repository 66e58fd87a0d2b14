"""Pure builders of a multi-node replica (k3:topology = multi-node; NOT the measured
configuration, docs/multinode.md): per replica one LeaderWorkerSet of two 4-GPU pods
and one ComputeDomain that gives both trays shared IMEX channels (multi-node NVLink).

Both pods run the serving StatefulSet's container (k3infra/serving/manifests.py): the same
image, the weights gate before `vllm serve`, the receipt's flags and env, then the
multi-node arguments of vLLM's multiprocessing backend:

    leader:  ... --distributed-executor-backend mp --nnodes 2 --node-rank 0
                 --master-addr $(LWS_LEADER_ADDRESS) --master-port 29501
    worker:  ... the same with --node-rank 1 --headless

The TP8+EP world of the receipt spans both pods (4 ranks each); the worker runs no API
server. Only the leader carries the authenticating proxy and answers the Services.
`$(LWS_LEADER_ADDRESS)` is expanded by the kubelet from the env the LeaderWorkerSet
controller injects (the leader's DNS name in the group's headless Service).
"""
from __future__ import annotations

from typing import Any

from k3infra import origin, placement, topology
from k3infra.config import StackConfig
from k3infra.plan import ServingPlan
from k3infra.receipt import Receipt
from k3infra.serving import manifests as m
from k3infra.serving import proxy
from k3infra.serving.startup import BUDGET_ANNOTATION
from k3infra.weights.manifests import WeightsParts

IMEX_CLAIM = "imex-channel"          # the pod's claim on its ComputeDomain's channel
LEADER_RANK = 0


def group_name(names: m.ServingNames, replica: int) -> str:
    """The LeaderWorkerSet of replica `replica`; its pods are `<name>-0` (leader) and
    `<name>-0-1` (worker), its headless Service `<name>` (made by the controller)."""
    return f"{names.base}-r{replica}"


def compute_domain_name(names: m.ServingNames, replica: int) -> str:
    return f"{group_name(names, replica)}-domain"


def claim_template_name(names: m.ServingNames, replica: int) -> str:
    """The ResourceClaimTemplate the ComputeDomain controller creates for its channel."""
    return f"{group_name(names, replica)}-imex"


def multi_node_args(nodes: int, rank: int) -> list[str]:
    """vLLM's multi-node arguments (multiprocessing backend) for node `rank` of `nodes`:
    what the multi-node pods add after the receipt's and the surface's flags (the
    policy k3-serve-flags-multi-node holds them to exactly this)."""
    args = ["--distributed-executor-backend", "mp",
            "--nnodes", str(nodes),
            "--node-rank", str(rank),
            "--master-addr", f"$({topology.LWS_LEADER_ADDRESS_ENV})",
            "--master-port", str(topology.MASTER_PORT)]
    if rank != LEADER_RANK:
        args.append("--headless")
    return args


def _pod_template(plan: ServingPlan, cfg: StackConfig, image: Any, weights: WeightsParts,
                  names: m.ServingNames, instance: str, engine_pins: dict[str, str],
                  replica: int, rank: int) -> dict:
    receipt, budget = plan.receipt, plan.budget   # the group's (both pods' gates)
    leader = rank == LEADER_RANK
    domain = cfg.multi_node.domain_label
    group_args = origin.words(
        origin.k3infra(f"the multi-node group, rank {rank} of k3:multiNode.nodesPerReplica = "
                       f"{cfg.multi_node.nodes_per_replica} (k3:topology = {cfg.topology}: not "
                       "measured)"),
        *multi_node_args(cfg.multi_node.nodes_per_replica, rank))
    vllm = m.vllm_container(receipt, cfg, image, weights, names, budget, plan.drain_seconds,
                            extra_args=(group_args,),
                            gpus=cfg.multi_node.gpus_per_node, probes=leader,
                            claims=(IMEX_CLAIM,))
    affinity: dict[str, Any] = {
        "nodeAffinity": placement.node_affinity_in_domain(
            [cfg.gpu_product], placement.pool_of(cfg.node_pool.provider, instance), domain),
        # Leader and worker are serving pods too: one per node, as on one node.
        "podAntiAffinity": placement.one_replica_per_node(m.selector_labels(instance))}
    if not leader:
        affinity["podAffinity"] = placement.same_domain_as(
            {topology.LWS_NAME_LABEL: group_name(names, replica),
             topology.LWS_WORKER_INDEX_LABEL: str(LEADER_RANK)}, domain)
    containers = ([vllm, proxy.container(cfg, m.PROXY_CONF_VOLUME, plan.drain_seconds)]
                  if leader else [vllm])
    spec = m.serving_pod_spec(
        cfg, weights, names, containers, affinity, with_proxy=leader,
        resource_claims=({"name": IMEX_CLAIM,
                          "resourceClaimTemplateName": claim_template_name(names, replica)},))
    annotations = {**m.pin_annotations(receipt, cfg, engine_pins),
                   BUDGET_ANNOTATION: budget.annotation()}
    if leader:
        annotations["k3infra.dev/proxy-config"] = proxy.conf_digest(cfg)
    return {"metadata": {"labels": m.labels(instance), "annotations": annotations},
            "spec": spec}


def leader_worker_set(plan: ServingPlan, cfg: StackConfig, image: Any, weights: WeightsParts,
                      names: m.ServingNames, instance: str, engine_pins: dict[str, str],
                      replica: int) -> dict:
    """Replica `replica`: a group of `nodesPerReplica` pods, recreated together when any
    of them restarts (one rank gone stops the whole TP world)."""
    receipt = plan.receipt
    return {
        "apiVersion": topology.LWS_API_VERSION, "kind": "LeaderWorkerSet",
        "metadata": {"name": group_name(names, replica), "namespace": names.namespace,
                     "labels": m.labels(instance),
                     "annotations": {**m.pin_annotations(receipt, cfg, engine_pins),
                                     **m.workload_receipt(receipt), **m.RESTORE_DRIFT}},
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",     # both pods start together
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 1,
                                                               "maxSurge": 0}},
            "leaderWorkerTemplate": {
                "size": cfg.multi_node.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _pod_template(plan, cfg, image, weights, names, instance,
                                                engine_pins, replica, LEADER_RANK),
                "workerTemplate": _pod_template(plan, cfg, image, weights, names, instance,
                                                engine_pins, replica, LEADER_RANK + 1),
                "volumeClaimTemplates": [m.cache_claim_template(cfg)],
            },
        },
    }


def compute_domain(receipt: Receipt, cfg: StackConfig, names: m.ServingNames, instance: str,
                   engine_pins: dict[str, str], replica: int) -> dict:
    """The IMEX domain of replica `replica`'s trays. numNodes is the group size: with the
    driver's default (IMEXDaemonsWithDNSNames) it only sets when the status says Ready;
    without it, pods wait until that many IMEX daemons joined."""
    return {
        "apiVersion": topology.COMPUTE_DOMAIN_API_VERSION, "kind": "ComputeDomain",
        "metadata": {"name": compute_domain_name(names, replica), "namespace": names.namespace,
                     "labels": m.labels(instance),
                     "annotations": m.pin_annotations(receipt, cfg, engine_pins)},
        "spec": {"numNodes": cfg.multi_node.nodes_per_replica,
                 "channel": {"resourceClaimTemplate": {"name": claim_template_name(names, replica)},
                             "allocationMode": "Single"}},
    }


def group_objects(plan: ServingPlan, cfg: StackConfig, image: Any, weights: WeightsParts,
                  names: m.ServingNames, instance: str, engine_pins: dict[str, str]) -> list[dict]:
    """Every replica's ComputeDomain, then its LeaderWorkerSet."""
    out: list[dict] = []
    for replica in range(cfg.replicas):
        out.append(compute_domain(plan.receipt, cfg, names, instance, engine_pins, replica))
        out.append(leader_worker_set(plan, cfg, image, weights, names, instance,
                                     engine_pins, replica))
    return out
