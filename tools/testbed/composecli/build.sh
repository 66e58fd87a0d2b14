#!/usr/bin/env bash
# Build Docker Compose v2 (the module's own cmd/, as its Makefile builds it) from the
# module pinned in go.mod:
#   tools/testbed/composecli/build.sh OUTDIR   ->   OUTDIR/docker-compose
# Run standalone (`docker-compose ...`), it talks to the daemon DOCKER_HOST names.
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
module=github.com/docker/compose/v2
version="$(go list -m -f '{{.Version}}' "$module")"
go build -trimpath -ldflags "-s -w -X $module/internal.Version=$version" \
    -o "$out/docker-compose" "$module/cmd"
echo "build.sh: docker compose $version, $(go version | cut -d' ' -f3), $(( $(date +%s) - start )) s"
