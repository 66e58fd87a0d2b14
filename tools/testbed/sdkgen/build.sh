#!/usr/bin/env bash
# Build sdkgen (main.go: Pulumi's Go and Node.js SDK generators over a schema file) from
# pkg/v3 at the CLI's version, so a cold build reuses the CLI's compiled packages:
#   tools/testbed/sdkgen/build.sh OUTDIR   ->   OUTDIR/sdkgen
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
start=$(date +%s)
go build -ldflags "-s -w" -o "$out/sdkgen" .
echo "build.sh: sdkgen on pkg/v3 $(go list -m -f '{{.Version}}' github.com/pulumi/pulumi/pkg/v3)," \
     "$(go version | cut -d' ' -f3), $(( $(date +%s) - start )) s"
