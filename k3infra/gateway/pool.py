"""The InferencePool: the serving pods (by the StatefulSet's own selector) on the API
port, and the endpoint picker the gateway asks which pod serves each request."""
from __future__ import annotations

from k3infra import naming
from k3infra.config import StackConfig
from k3infra.gateway.names import GatewayNames
from k3infra.gateway.picker import EXT_PROC_PORT
from k3infra.gateway.versions import INFERENCE_GROUP


def inference_pool(cfg: StackConfig, names: GatewayNames, instance: str) -> dict:
    """Target port: the authenticating proxy's API port (vLLM listens on loopback only),
    so a request the gateway sends still passes the in-pod key check."""
    return {"apiVersion": f"{INFERENCE_GROUP}/v1", "kind": "InferencePool",
            "metadata": {"name": names.pool, "namespace": names.namespace,
                         "labels": naming.labels(instance, "gateway")},
            "spec": {"selector": {"matchLabels": naming.selector_labels(instance)},
                     "targetPorts": [{"number": cfg.serving.port}],
                     "endpointPickerRef": {"kind": "Service", "name": names.picker,
                                           "port": {"number": EXT_PROC_PORT},
                                           "failureMode": cfg.gateway.failure_mode}}}
