. "$(dirname "$0")/env.sh"
# One call for a fresh machine with little device time left: install, the 14.5 GB model,
# the new-node start, the proxy, Workload A at concurrency 8 (the receipt's point).
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; df -BG / | tail -1
( set -o pipefail
$G prepare --shape 4096,32,14336 --mkmodel "$last/mkmodel.py" --engine-wheel "$(ls /root/.gpu-wheels/vllm-*.whl)" || exit 1
timeout 240 $G start --restart new-node --label "new node: page cache and compile cache cold"; pack X
$G proxy
timeout 260 $G bench --concurrencies 8; pack X
$G table > $OUT/tableX.txt 2>&1 ) 2>&1 | tee $OUT/callX.log
pack X
