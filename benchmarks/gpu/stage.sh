#!/usr/bin/env bash
# Stage benchmarks/gpu_start.py for the `device` tool's H200 (no registry there). Run from
# the checkout the device tool sends (it sends that checkout, not a worktree):
#   bash <this repo>/benchmarks/gpu/stage.sh <this repo>
# It fills .gpu-extra/ (git-ignored through .git/info/exclude): this repo's k3infra and
# benchmark, the call scripts, and nginx with its libraries as Debian packages (unpacked
# there with `dpkg -x`). The vLLM 0.25.0 wheels come from ../shared/gpu/prepare.sh.
set -euo pipefail
src=${1:?the k3infra checkout to stage from}
grep -qxF /.gpu-extra/ .git/info/exclude || echo /.gpu-extra/ >> .git/info/exclude
rm -rf .gpu-extra/repo && mkdir -p .gpu-extra/repo/benchmarks .gpu-extra/debs
cp -r "$src/k3infra" .gpu-extra/repo/
cp "$src/benchmarks/gpu_start.py" .gpu-extra/repo/benchmarks/
cp "$src"/benchmarks/gpu/{env.sh,callA.sh,callB.sh,callC.sh,callL.sh,callM.sh,callX.sh,callY.sh} .gpu-extra/
find .gpu-extra/repo -name __pycache__ -prune -exec rm -rf {} +
# Debian 12's nginx (nginx-light is a metapackage there) and the libraries it links.
(cd .gpu-extra/debs && apt-get download nginx nginx-common libnginx-mod-http-echo nginx-light \
   libssl3 libpcre2-8-0 zlib1g libcrypt1)
du -sh .gpu-extra
