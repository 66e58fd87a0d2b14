#!/usr/bin/env bash
# Build the weights tests' S3 server (main.go: versitygw's posix backend, embedded) from
# the module pinned in go.mod:
#   tools/testbed/s3server/build.sh OUTDIR   ->   OUTDIR/s3server
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
go build -trimpath -ldflags "-s -w" -o "$out/s3server" .
echo "build.sh: s3server (versitygw $(go list -m -f '{{.Version}}' github.com/versity/versitygw))," \
     "$(go version | cut -d' ' -f3), $(( $(date +%s) - start )) s"
