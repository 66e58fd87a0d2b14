#!/usr/bin/env bash
# The LeaderWorkerSet CRD of the multi-node render (k3infra/topology.py), exactly as
# kubernetes-sigs/lws v0.8.0 publishes it, taken out of that release's Go module
# (pins.json: module, version, go.sum hash, file). Nothing is generated or edited;
# `go mod download` verifies the module against its pinned hash (and the checksum
# database), so the bytes are the release's.
#
# NVIDIA's ComputeDomain CRD is not here: the module proxy refuses
# github.com/NVIDIA/k8s-dra-driver-gpu (403 "This module version is not available"), so
# its schema is k3infra's own statement of the v25.8.1 API (tests/workload_crds.py).
#
#   tools/testbed/workload-crds/build.sh OUTDIR   ->   OUTDIR/workload-crds/<file>.yaml
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1/workload-crds"
out="$(cd "$1/workload-crds" && pwd)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Outside any module: `go mod download MODULE@VERSION` fetches exactly that module.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod GO111MODULE=on
python3 - "$here/pins.json" "$out" <<'PY'
import json, shutil, subprocess, sys
from pathlib import Path

pins, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
for crd in pins["crds"]:
    ref = f"{crd['module']}@{crd['version']}"
    got = json.loads(subprocess.run(["go", "mod", "download", "-json", ref], check=True,
                                    capture_output=True, text=True).stdout)
    if got.get("Error"):
        sys.exit(f"build.sh: {ref}: {got['Error']}")
    if got["Sum"] != crd["sum"]:
        sys.exit(f"build.sh: {ref} has hash {got['Sum']}, pins.json pins {crd['sum']}")
    src = Path(got["Dir"]) / crd["file"]
    shutil.copyfile(src, out / src.name)
    print(f"build.sh: {crd['kind']} CRD from {ref} ({crd['release']}): {src.name}")
PY
