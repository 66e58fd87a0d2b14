#!/usr/bin/env bash
# Build the e2e node's NetworkPolicy enforcement (main.go: kube-router's network policy
# controller alone) from the module pinned in go.mod:
#   tools/testbed/netpol/build.sh OUTDIR   ->   OUTDIR/kube-router-netpol
# go.sum must already be complete (-mod=readonly): a warm module cache builds offline.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")"
export GOFLAGS="-mod=readonly -buildvcs=false -gcflags=all=-dwarf=false"  # no DWARF: stripped anyway (-w)
export CGO_ENABLED=0
start=$(date +%s)
go build -trimpath -ldflags "-s -w" -o "$out/kube-router-netpol" .
echo "build.sh: kube-router-netpol $(go list -m -f '{{.Version}}' github.com/cloudnativelabs/kube-router/v2)," \
     "$(go version | cut -d' ' -f3), $(( $(date +%s) - start )) s"
