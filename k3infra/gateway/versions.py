"""The releases the gateway's objects are written against. The same versions pin the CRD
schemas the e2e tests install (tools/testbed/gatewaycrds/go.mod); tests/test_gateway.py
holds the two to each other."""
from __future__ import annotations

# Gateway API, standard channel: Gateway and HTTPRoute (gateway.networking.k8s.io/v1).
GATEWAY_API = ("sigs.k8s.io/gateway-api", "v1.5.1")
# Gateway API Inference Extension: InferencePool (inference.networking.k8s.io/v1, GA in
# v1.0). v1.5.0 is the version the pinned endpoint picker is built against.
INFERENCE_EXTENSION = ("sigs.k8s.io/gateway-api-inference-extension", "v1.5.0")
# The endpoint picker moved from the Inference Extension to llm-d-router (the
# extension keeps only a round-robin conformance picker); its config file format.
ENDPOINT_PICKER = ("github.com/llm-d/llm-d-router", "v0.10.0")
EPP_CONFIG_API_VERSION = "llm-d.ai/v1alpha1"
# Envoy Gateway's SecurityPolicy (apiKeyAuth), the key policy rendered for it.
ENVOY_GATEWAY = ("github.com/envoyproxy/gateway", "v1.9.1")
# KEDA's ScaledObject (k3:autoscaling).
KEDA = ("github.com/kedacore/keda/v2", "v2.21.0")

INFERENCE_GROUP = "inference.networking.k8s.io"
GATEWAY_GROUP = "gateway.networking.k8s.io"
