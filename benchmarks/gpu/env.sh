# Sourced by each call's script on the device: vLLM (installed once per machine), k3infra
# from this folder, the `vllm` shim, nginx unpacked from its Debian packages.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
last=$(ls -d .gpu[0-9]* 2>/dev/null | sort -V | tail -1)
if [ ! -f /root/site/.installed ]; then . "$last/install.sh"; fi
set +e
export PYTHONPATH=$here/repo:/root/site HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p /root/bin
# The rendered command says `vllm serve`; vLLM 0.25.0's entry point is this module.
printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' > /root/bin/vllm && chmod +x /root/bin/vllm
export PATH=/root/bin:$PATH
if [ ! -x /root/nginx/usr/sbin/nginx ]; then for f in "$here"/debs/*.deb; do dpkg -x "$f" /root/nginx; done; fi
/root/nginx/usr/sbin/nginx -v 2>&1 || export LD_LIBRARY_PATH=/root/nginx/usr/lib/x86_64-linux-gnu:/root/nginx/lib/x86_64-linux-gnu
G="python3 $here/repo/benchmarks/gpu_start.py"
pack() {  # what comes back: the work dir without the key, the tree stays
  python3 -c "import json; s=json.load(open('/root/k3gpu/state.json')); s.pop('key',None); json.dump(s,open('/root/k3gpu/state-public.json','w'),indent=1)" 2>/dev/null
  tar czf "$OUT/$1.tgz" -C /root/k3gpu --exclude=state.json --exclude=render.json --exclude='proxy/keys.map' . 2>/dev/null
}
