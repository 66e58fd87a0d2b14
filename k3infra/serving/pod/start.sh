# The start of the serving container (k3infra/serving/pod/start.sh), carried whole as
# its `sh -c` script; the argv of the engine follows the script ("$@").
# docs/coldstart.md says why each step is here.

# 1. Phase markers: one line per phase edge, read back by `k3infra startup`
#    (k3infra/serving/timeline.py), in milliseconds (GNU date %3N: the engine image is
#    Debian-based) to set beside the sub-second timestamps of the engine log.
k3_phase() { echo "k3-phase name=$1 event=$2 ts=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)"; }

# 2. The compile caches (torch.compile, Triton, FlashInfer JIT) hold for one engine image
#    on one driver and GPU, and only this node knows its driver: the key is
#    sha256("<image digest>|<driver version>, <GPU name>"), first 16 hex, and
#    /cache/current (where VLLM_CACHE_ROOT, TRITON_CACHE_DIR, XDG_CACHE_HOME and HOME
#    point) links to /cache/k3-<key>, whose KEY file names the inputs.
k3_gpu=$(nvidia-smi --query-gpu=driver_version,name --format=csv,noheader 2>/dev/null | head -n 1)
k3_image="${K3_ENGINE_IMAGE##*@}"
k3_key=$(printf '%s|%s' "$k3_image" "${k3_gpu:-unknown}" | sha256sum | cut -c1-16)
k3_dir="/cache/k3-$k3_key"
mkdir -p "$k3_dir/vllm" "$k3_dir/triton" "$k3_dir/xdg" "$k3_dir/home" || exit 1
printf 'image=%s\ngpu=%s\n' "$k3_image" "${k3_gpu:-unknown}" > "$k3_dir/KEY"
ln -sfn "k3-$k3_key" /cache/.current.new && mv -Tf /cache/.current.new /cache/current || exit 1
# No GPU seen: the key still works (image only), and the line says why it is unknown
# instead of passing for a keyed driver and GPU.
k3_note=
if [ -z "$k3_gpu" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    k3_note=' note="nvidia-smi printed no GPU: the key holds no driver or GPU"'
  else
    k3_note=' note="no nvidia-smi on PATH: the key holds no driver or GPU"'
  fi
fi
echo "k3-compile-cache key=$k3_key dir=$k3_dir gpu=\"${k3_gpu:-unknown}\" image=$k3_image$k3_note"

# 3. The weights gate, on every start of this container (restarts too): the bootstrap
#    checks the runtime files against K3_RUNTIME_SHA256, then the gate checks the tree
#    against its lock (k3:weights.gateMode). A refusal ends the start here.
k3_phase gate start
python3 -c "$K3_RUNTIME_BOOTSTRAP" gate "$K3_TREE" --lock "$K3_GATE_LOCK" --expect-digest "$K3_EXPECT_TREE_DIGEST" --repo "$K3_REPO" --revision "$K3_REVISION" --mode "$K3_GATE_MODE" --state-dir "$K3_GATE_STATE" --workers "$K3_HASH_WORKERS" || { k3_phase gate fail; exit 1; }
k3_phase gate end

# 4. The engine replaces this shell (exec), so the signals of the pod reach it.
k3_phase engine start
exec "$@"
