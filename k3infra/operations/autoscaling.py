"""Scaling the serving StatefulSet on queue depth (k3:autoscaling): a KEDA ScaledObject
whose Prometheus trigger reads `vllm:num_requests_waiting` summed over the serving pods.

KEDA drives an HPA: desired replicas = ceil(sum(waiting) / waitingPerReplica), within
min..max. A replica is a whole 8-GPU node that takes its startup budget (the image
pull, then the startupProbe's allowance for the weights gate, the load and graph capture:
StartupBudget.pod_seconds, over an hour and a half with the defaults) before it serves, so

- scale-down is held for the startup budget: a replica removed and needed again costs a
  full cold start, so a drop in the queue must last at least that long. The HPA accepts
  at most 3600 s (autoscaling/v2 behavior), so a longer budget is capped and the render
  says so; and it removes one replica per period;
- scale-up adds one replica a minute: the queue the new replica is meant for is still
  there when it is ready, and adding several at once multiplies the cost of a spike;
- the floor is at least 2 (parse.py): the PodDisruptionBudget lets a node drain take
  one replica, and one must keep serving.

The StatefulSet then carries no `spec.replicas` (serving/manifests.py): the HPA owns it,
and `pulumi up` must not put k3:replicas back over it.

Pure: (plan, config, names) -> the ScaledObject, and the render's cost warning (the
startup budget is the plan's, k3infra.plan).
"""
from __future__ import annotations

from k3infra import naming
from k3infra.config import StackConfig
from k3infra.gates import Gate
from k3infra.operations.metric_names import series
from k3infra.operations.monitoring import selector
from k3infra.plan import ServingPlan

HPA_MAX_STABILIZATION_SECONDS = 3600     # autoscaling/v2: stabilizationWindowSeconds <= 3600
HPA_MAX_POLICY_PERIOD_SECONDS = 1800     # autoscaling/v2: a policy's periodSeconds <= 1800
SCALE_UP_PERIOD_SECONDS = 60


def scale_down_window_seconds(plan: ServingPlan, cfg: StackConfig) -> int:
    override = cfg.autoscaling.scale_down_stabilization_seconds
    if override is not None:
        return override
    return min(plan.budget.pod_seconds, HPA_MAX_STABILIZATION_SECONDS)


def waiting_query(names: naming.ServingNames) -> str:
    return f"sum({series('vllm:num_requests_waiting')}{selector(names)})"


def scaled_object(plan: ServingPlan, cfg: StackConfig, names: naming.ServingNames,
                  instance: str) -> dict:
    a = cfg.autoscaling
    window = scale_down_window_seconds(plan, cfg)
    down_period = min(max(window, SCALE_UP_PERIOD_SECONDS), HPA_MAX_POLICY_PERIOD_SECONDS)
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": names.base, "namespace": names.namespace,
                         "labels": naming.labels(instance, "autoscaling")},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                        "name": names.statefulset},
                     "minReplicaCount": a.min, "maxReplicaCount": a.max,
                     "pollingInterval": a.polling_interval_seconds,
                     "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                         "scaleDown": {"stabilizationWindowSeconds": window,
                                       "policies": [{"type": "Pods", "value": 1,
                                                     "periodSeconds": down_period}]},
                         "scaleUp": {"stabilizationWindowSeconds": 0,
                                     "policies": [{"type": "Pods", "value": 1,
                                                   "periodSeconds": SCALE_UP_PERIOD_SECONDS}]}}}},
                     "triggers": [{"type": "prometheus", "metadata": {
                         "serverAddress": a.prometheus_url, "query": waiting_query(names),
                         "threshold": str(a.waiting_per_replica)}}]}}


def scaling_warnings(plan: ServingPlan, cfg: StackConfig) -> list[Gate]:
    """Shown by a render and `pulumi up`, never refusing: what `max` can cost, and a
    scale-down window shorter than the startup budget."""
    a = cfg.autoscaling
    if not a.enabled or a.max is None:
        return []
    gpus = plan.receipt.measured_gpu.gpus_per_node
    budget = plan.budget.pod_seconds
    rate = cfg.monitoring.node_rate_usd_per_hour
    cost = (f", about {a.max * rate:,.0f} USD/hour at max (k3:monitoring.nodeRateUsdPerHour)"
            if rate else "")
    out = [Gate("k3:autoscaling.max",
                f"{a.max}: the autoscaler may run up to {a.max} replicas, each a whole "
                f"{gpus}-GPU node ({a.max * gpus} GPUs) billed while it runs{cost}; each "
                f"scale-up serves only after a cold start of up to {budget} s", refuses=False)]
    window = scale_down_window_seconds(plan, cfg)
    if window < budget:
        out.append(Gate("k3:autoscaling.scaleDownStabilizationSeconds",
                        f"{window} s is shorter than the startup budget ({budget} s)"
                        + (" (the HPA's maximum)" if window == HPA_MAX_STABILIZATION_SECONDS
                           else "")
                        + ": a replica removed and needed again within the budget is a cold "
                        "start", refuses=False))
    return out
