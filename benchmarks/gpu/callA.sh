. "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; free -g | head -2; df -BG / /root | tail -2
python3 -c "import vllm,torch; print('vllm', vllm.__version__, vllm.__commit_id__, 'torch', torch.__version__)"
free=$(df --output=avail -BG / | tail -1 | tr -dc 0-9)
if [ "$free" -ge 48 ]; then SHAPE=5120,48,13824; else SHAPE=4096,32,14336; fi
echo "disk free ${free}G -> shape $SHAPE"
( set -o pipefail
$G prepare --shape $SHAPE --mkmodel "$last/mkmodel.py" --engine-wheel "$(ls /root/.gpu-wheels/vllm-*.whl)" || exit 1
timeout 300 $G start --restart new-node --label "new node: page cache and compile cache cold" ; pack A
$G proxy
timeout 200 $G bench; pack A
$G table > $OUT/tableA.txt 2>&1
$G stop ) 2>&1 | tee $OUT/callA.log
pack A; df -BG / | tail -1; du -sh /cache /root/site 2>/dev/null
