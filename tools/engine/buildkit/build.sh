#!/usr/bin/env bash
# Build BuildKit (buildkitd, buildctl) from the module pinned in go.mod:
#   tools/engine/buildkit/build.sh OUTDIR   ->   OUTDIR/{buildkitd,buildctl}
# Static (no cgo), as BuildKit's own release images build them; buildkitd runs
# Debian's runc (.ci/run installs it for the node).
# go.sum must already be complete (-mod=readonly): a warm module cache builds offline.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")"
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0
start=$(date +%s)
bk=github.com/moby/buildkit
bkv="$(go list -m -f '{{.Version}}' "$bk")"
go build -trimpath -ldflags "-s -w -X $bk/version.Version=$bkv -X $bk/version.Package=$bk" \
    -o "$out/" "$bk/cmd/buildkitd" "$bk/cmd/buildctl"
echo "build.sh: buildkit $bkv, $(go version | cut -d' ' -f3), $(( $(date +%s) - start )) s"
