#!/usr/bin/env bash
# Build BuildKit (buildkitd, buildctl) and rootlesskit from the modules pinned in go.mod:
#   tools/testbed/buildkit/build.sh OUTDIR   ->   OUTDIR/{buildkitd,buildctl,rootlesskit}
# Static (no cgo), as BuildKit's own release images build them; buildkitd runs Debian's
# runc (.ci/run installs it for the node; the rootless image carries its own).
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
bk=github.com/moby/buildkit
rk=github.com/rootless-containers/rootlesskit/v2
bkv="$(go list -m -f '{{.Version}}' "$bk")"
rkv="$(go list -m -f '{{.Version}}' "$rk")"
go build -trimpath -ldflags "-s -w -X $bk/version.Version=$bkv -X $bk/version.Package=$bk" \
    -o "$out/" "$bk/cmd/buildkitd" "$bk/cmd/buildctl"
go build -trimpath -ldflags "-s -w -X $rk/pkg/version.Version=$rkv" -o "$out/rootlesskit" "$rk/cmd/rootlesskit"
echo "build.sh: buildkit $bkv, rootlesskit $rkv, $(go version | cut -d' ' -f3), $(( $(date +%s) - start )) s"
