. "$(dirname "$0")/env.sh"
# Loaders on a fresh machine, part 1 (about 450 s): install, the 14.5 GB model, a first
# start whose stamps gate reads the tree, then auto cold and warm (the baseline, in the
# same run) and fastsafetensors warm. Each start ends at vLLM's load line.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; df -BG / | tail -1
L="timeout 150 $G start --gate-mode stamps --stop-after-load"
( set -o pipefail
$G prepare --shape 4096,32,14336 --mkmodel "$last/mkmodel.py" --engine-wheel "$(ls /root/.gpu-wheels/vllm-*.whl)" || exit 1
$L --restart new-node --label "auto, first start (the stamps gate reads the tree)"; pack L
$L --restart same-pod --drop-cache --label "auto, cold"; pack L
$L --restart same-pod --label "auto, warm"; pack L
$L --restart same-pod --load-format "--load-format fastsafetensors" --label "fastsafetensors, warm"; pack L
$G table > $OUT/tableL.txt 2>&1 ) 2>&1 | tee $OUT/callL.log
pack L
