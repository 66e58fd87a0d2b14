"""Every HTTP route vLLM's OpenAI-compatible server can register, as (method, path).

Compiled by hand from the FastAPI routers of vLLM's `vllm serve` app (the OpenAI,
tokenizer, SageMaker, Anthropic, pooling, speech, render, disaggregation, elastic-EP,
LoRA, profiler and dev-mode routers, plus FastAPI's own docs routes), read in vLLM's
public source. The receipt's engine (PR 50000 head f68f4fdd) could not be fetched on
this machine, so the table is a superset of what one build registers: a route that
only some versions or flags (VLLM_SERVER_DEV_MODE, --enable-tokenizer-info-endpoint,
pooling tasks...) add is listed anyway. The proxy is an allow-list, so a route this
table misses is refused too; tests/test_serving_proxy.py also drives unlisted paths.

Path parameters carry a sample value.
"""
from __future__ import annotations

VLLM_ROUTES: tuple[tuple[str, str], ...] = (
    # health, metrics, server info (instrumentator)
    ("GET", "/health"),
    ("GET", "/load"),
    ("GET", "/ping"),
    ("POST", "/ping"),
    ("GET", "/version"),
    ("GET", "/metrics"),
    ("GET", "/server_info"),
    # FastAPI's own
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
    ("GET", "/openapi.json"),
    # OpenAI
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/resp_0"),
    ("POST", "/v1/responses/resp_0/cancel"),
    ("POST", "/v1/chat/completions/render"),
    ("POST", "/v1/completions/render"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/audio/transcriptions"),
    ("POST", "/v1/audio/translations"),
    ("GET", "/v1/realtime"),
    # Anthropic messages
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    # tokenizer (no /v1 prefix: not covered by vLLM's own --api-key)
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/tokenizer_info"),
    # SageMaker: the same inference as /v1 (vLLM's --api-key help warns it stays open)
    ("POST", "/invocations"),
    ("POST", "/adapters"),
    ("DELETE", "/adapters/lora0"),
    # token-in/token-out generation, disaggregated serving
    ("POST", "/inference/v1/generate"),
    # pooling and scoring
    ("POST", "/pooling"),
    ("POST", "/classify"),
    ("POST", "/v1/classify"),
    ("POST", "/score"),
    ("POST", "/v1/score"),
    ("POST", "/rerank"),
    ("POST", "/v1/rerank"),
    ("POST", "/v2/rerank"),
    ("POST", "/v2/embed"),
    ("POST", "/v2/chat"),
    ("POST", "/cohere/v2/chat"),
    # runtime LoRA, profiler
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/start_profile"),
    ("POST", "/stop_profile"),
    # dev mode and elastic expert parallelism
    ("POST", "/reset_prefix_cache"),
    ("POST", "/reset_mm_cache"),
    ("POST", "/reset_encoder_cache"),
    ("POST", "/sleep"),
    ("POST", "/wake_up"),
    ("GET", "/is_sleeping"),
    ("POST", "/collective_rpc"),
    ("POST", "/pause"),
    ("POST", "/resume"),
    ("GET", "/is_paused"),
    ("POST", "/update_weights"),
    ("POST", "/scale_elastic_ep"),
    ("POST", "/is_scaling_elastic_ep"),
)

# Paths no route has, and variants of allowed ones that must not match them.
TRICK_PATHS: tuple[str, ...] = (
    "/", "/v1", "/v1/", "/v1/chat/completions/", "/V1/models", "/v1/models/kimi-k3",
    "/v1/models/../../invocations", "/v1/models%2F..%2F..%2Finvocations",
    "/v1/chat/completions;/invocations", "/%761/models/../../detokenize", "/nonexistent",
)
