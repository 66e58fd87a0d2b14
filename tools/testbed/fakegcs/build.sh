#!/usr/bin/env bash
# Build fake-gcs-server (the Google Cloud Storage emulator the weights store tests read
# from, tests/store_servers.py) from the module pinned in go.mod (a `tool` line):
#   tools/testbed/fakegcs/build.sh OUTDIR   ->   OUTDIR/fake-gcs-server
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
go build -trimpath -ldflags "-s -w" -o "$out/fake-gcs-server" github.com/fsouza/fake-gcs-server
echo "build.sh: fake-gcs-server $(go list -m -f '{{.Version}}' github.com/fsouza/fake-gcs-server)," \
     "$(go version | cut -d' ' -f3), $(( $(date +%s) - start )) s"
