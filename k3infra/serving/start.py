"""The serving container's start: the script `pod/start.sh` (phase markers, the keyed
compile cache, the weights gate, then `exec "$@"`: docs/coldstart.md), and what the pod
spec around it names (the cache volume's paths, the image variable, the markers).

    k3-phase name=gate event=start ts=2026-12-01T02:00:00.123Z  one line per phase edge,
    k3-phase name=gate event=end ts=...                         read back by `k3infra startup`
    k3-phase name=engine event=start ts=...                     (k3infra/serving/timeline.py)
    k3-compile-cache key=<16 hex> dir=/cache/k3-<key> gpu="..." image=sha256:...

The script is a file of this package, read like every pod file (k3infra/podfiles.py), and
carried whole as the container's `sh -c` argument rather than in the weights runtime
ConfigMap: it is the program that runs the bootstrap (in its gate step) and then becomes
vLLM, so from the ConfigMap it would have to run through the bootstrap, whose private
copy, PYTHONPATH and held lock would then reach the engine's process. In the pod spec it
is recorded in Pulumi state with the rest of the container, and the policy pack holds the
rendered command to `engine_command()` byte for byte (k3-engine-command). Every byte of
it, a comment's too, is in the pod template: an edit rolls the serving pods, as any change
of their command does.
"""
from __future__ import annotations

import functools

from k3infra import podfiles
from k3infra.origin import Origin, Tagged, argv, k3infra, words
from k3infra.pod_env import IMAGE_ENV

CACHE_ROOT = "/cache"                      # the compile-cache volume (a per-replica PVC)
CURRENT = f"{CACHE_ROOT}/current"          # -> k3-<key>, set by the start script
ARGV0 = "k3-start"
PHASE_PREFIX = "k3-phase"
CACHE_PREFIX = "k3-compile-cache"
SCRIPT_FILE = "start.sh"                   # k3infra/serving/pod/start.sh
SCRIPT_PATH = f"k3infra/serving/pod/{SCRIPT_FILE}"

# The cache locations, every name on the receipt's surface allow-list. HOME is where
# FlashInfer puts its JIT cache ($HOME/.cache/flashinfer) when FLASHINFER_WORKSPACE_BASE
# is unset, which the allow-list does not name.
CACHE_ENV = {"VLLM_CACHE_ROOT": f"{CURRENT}/vllm",
             "TRITON_CACHE_DIR": f"{CURRENT}/triton",
             "XDG_CACHE_HOME": f"{CURRENT}/xdg",
             "HOME": f"{CURRENT}/home"}
CACHE_ORIGIN = k3infra(f"the compile cache under {CURRENT}, the directory the start script "
                       "keys by image, driver and GPU")


@functools.lru_cache(maxsize=1)
def script() -> str:
    """The whole `sh -c` script, as the file holds it."""
    return podfiles.package_files("k3infra.serving", [SCRIPT_FILE], "pod")[SCRIPT_FILE]


def command_parts() -> list[Tagged]:
    """The container command up to the engine's argv (`vllm serve` follows), tagged."""
    return [words(k3infra(f"the start script {SCRIPT_PATH}, run by sh; the engine's argv "
                          "follows it as \"$@\""), "sh", "-c", script(), ARGV0)]


def command() -> list[str]:
    return argv(command_parts())


def env(image) -> list[dict]:
    """What the script reads: the engine image reference, whose digest keys the cache."""
    return [{"name": IMAGE_ENV, "value": image}]


def env_parts(image, image_origin: Origin) -> list[Tagged]:
    why = Origin(image_origin.kind, f"{image_origin.detail}; the start script keys the "
                 "compile cache by its digest")
    return [Tagged(e, why) for e in env(image)]
