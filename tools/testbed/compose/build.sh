#!/usr/bin/env bash
# Build compose-config (main.go: compose-go's loader, the one Docker Compose v2 uses) from
# the module pinned in go.mod:
#   tools/testbed/compose/build.sh OUTDIR   ->   OUTDIR/compose-config
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
go build -p 2 -trimpath -ldflags "-s -w" -o "$out/compose-config" .
echo "build.sh: compose-go $(go list -m -f '{{.Version}}' github.com/compose-spec/compose-go/v2)," \
     "$(go version | cut -d' ' -f3), $(( $(date +%s) - start )) s"
