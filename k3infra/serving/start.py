"""The serving container's start script: phase markers, the keyed compile cache, the
weights gate, then `exec vllm serve` (docs/coldstart.md).

    k3-phase name=gate event=start ts=2026-12-01T02:00:00.123Z  one line per phase edge,
    k3-phase name=gate event=end ts=...                         read back by `k3infra startup`
    k3-phase name=engine event=start ts=...                     (k3infra/serving/timeline.py)
    k3-compile-cache key=<16 hex> dir=/cache/k3-<key> driver=... gpu=... image=sha256:...

The compile caches (vLLM's torch.compile cache under VLLM_CACHE_ROOT, Triton's, and
FlashInfer's JIT cache under $HOME/.cache/flashinfer) are only valid for one engine
build on one driver and GPU. The driver is only known on the node, so the key is
computed here from the engine image digest (K3_ENGINE_IMAGE) and `nvidia-smi`'s driver
version and GPU name, and /cache/current is a symlink to /cache/k3-<key>: the env the
pod spec shows (VLLM_CACHE_ROOT=/cache/current/vllm, ...) is what the engine reads, and
a new image or driver starts a new, empty directory instead of loading stale kernels.
"""
from __future__ import annotations

from k3infra.pod_env import IMAGE_ENV

CACHE_ROOT = "/cache"                      # the compile-cache volume (a per-replica PVC)
CURRENT = f"{CACHE_ROOT}/current"          # -> k3-<key>, set by the start script
ARGV0 = "k3-start"
PHASE_PREFIX = "k3-phase"
CACHE_PREFIX = "k3-compile-cache"

# The cache locations, every name on the receipt's surface allow-list. HOME is where
# FlashInfer puts its JIT cache ($HOME/.cache/flashinfer) when FLASHINFER_WORKSPACE_BASE
# is unset, which the allow-list does not name.
CACHE_ENV = {"VLLM_CACHE_ROOT": f"{CURRENT}/vllm",
             "TRITON_CACHE_DIR": f"{CURRENT}/triton",
             "XDG_CACHE_HOME": f"{CURRENT}/xdg",
             "HOME": f"{CURRENT}/home"}

# Milliseconds (GNU date's %3N: the engine image is Debian-based), to set beside vLLM's
# sub-second log timestamps; k3infra startup still reads older whole-second lines.
PHASE_DATE_FORMAT = "+%Y-%m-%dT%H:%M:%S.%3NZ"
_PHASE_FN = (f'k3_phase() {{ echo "{PHASE_PREFIX} name=$1 event=$2 '
             f'ts=$(date -u {PHASE_DATE_FORMAT})"; }}')

# The key: sha256 of "<image digest>|<driver version>, <GPU name>", first 16 hex. The
# directory holds a KEY file naming its inputs (the seeding recipe copies directories
# whose KEY matches).
_CACHE_KEY = (
    'k3_gpu=$(nvidia-smi --query-gpu=driver_version,name --format=csv,noheader 2>/dev/null '
    '| head -n 1); '
    f'k3_image="${{{IMAGE_ENV}##*@}}"; '
    "k3_key=$(printf '%s|%s' \"$k3_image\" \"${k3_gpu:-unknown}\" | sha256sum | cut -c1-16); "
    f'k3_dir="{CACHE_ROOT}/k3-$k3_key"; '
    'mkdir -p "$k3_dir/vllm" "$k3_dir/triton" "$k3_dir/xdg" "$k3_dir/home" || exit 1; '
    "printf 'image=%s\\ngpu=%s\\n' \"$k3_image\" \"${k3_gpu:-unknown}\" > \"$k3_dir/KEY\"; "
    f'ln -sfn "k3-$k3_key" {CACHE_ROOT}/.current.new && mv -Tf {CACHE_ROOT}/.current.new {CURRENT} '
    '|| exit 1; '
    # No GPU seen: the key still works (image only), but the line says why it is
    # "unknown" instead of passing for a keyed driver and GPU.
    'k3_note=; if [ -z "$k3_gpu" ]; then if command -v nvidia-smi >/dev/null 2>&1; '
    "then k3_note=' note=\"nvidia-smi printed no GPU: the key holds no driver or GPU\"'; "
    "else k3_note=' note=\"no nvidia-smi on PATH: the key holds no driver or GPU\"'; fi; fi; "
    f'echo "{CACHE_PREFIX} key=$k3_key dir=$k3_dir gpu=\\"${{k3_gpu:-unknown}}\\" '
    'image=$k3_image$k3_note"')


def script(gate_check: str) -> str:
    """The whole `sh -c` script: `gate_check` is the weights gate's command line
    (k3infra.weights.manifests.GATE_CHECK); the engine's argv follows as "$@"."""
    return "; ".join([
        _PHASE_FN,
        _CACHE_KEY,
        "k3_phase gate start",
        f"{gate_check} || {{ k3_phase gate fail; exit 1; }}",
        "k3_phase gate end",
        "k3_phase engine start",
        'exec "$@"'])


def command(gate_check: str) -> list[str]:
    """The container command up to the engine's argv (`vllm serve` follows)."""
    return ["sh", "-c", script(gate_check), ARGV0]


def env(image) -> list[dict]:
    return [{"name": IMAGE_ENV, "value": image}]

