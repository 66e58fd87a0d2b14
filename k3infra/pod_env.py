"""The K3_* variables the serving container's own scripts read before `exec vllm serve`
(vLLM reads none of them): the weights gate's and the start script's. One low module,
because the builders that set them (weights/, serving/), the serve-flags policy, `k3infra
verify` and the receipt writer, which leave them out of the engine's env, all name them."""

# What the gate reads (k3infra/weights/pod/gate.py and the runtime bootstrap).
GATE_ENV_NAMES = ("K3_REPO", "K3_REVISION", "K3_TREE", "K3_LOCK", "K3_EXPECT_TREE_DIGEST",
                  "K3_HASH_WORKERS", "K3_RUNTIME_DIR", "K3_RUNTIME_SHA256",
                  "K3_RUNTIME_BOOTSTRAP", "K3_RUNTIME_COPY_DIR", "K3_GATE_LOCK",
                  "K3_GATE_MODE", "K3_GATE_STATE")
# What the start script reads: the engine image reference, with its digest (the
# compile-cache key, k3infra/serving/start.py).
IMAGE_ENV = "K3_ENGINE_IMAGE"
START_ENV_NAMES = (IMAGE_ENV,)
# Every variable read before the engine: the serve-flags policy lets exactly these
# through beside the engine's own surface.
PRE_ENGINE_ENV_NAMES = (*GATE_ENV_NAMES, *START_ENV_NAMES)
