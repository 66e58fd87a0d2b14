#!/usr/bin/env bash
# Build the Kubernetes resource provider plugin from the module pinned in go.mod:
#   tools/testbed/kubernetes/build.sh OUTDIR   ->   OUTDIR/pulumi-resource-kubernetes
#
# go.sum must already be complete (-mod=readonly): a warm module cache builds
# offline (GOPROXY=off works), a cold one fetches from the Go module proxy.
# The two embedded JSON files are generated from the module cache's copy of the
# provider into a staging folder removed on exit: nothing is written here.
#
# PROVIDER_VERSION is the version the plugin reports and is installed as: it is
# the version the Python SDK (pulumi-kubernetes==4.34.2) asks the engine for.
# The code built is the provider/v4 pseudo-version in go.mod (see README.md).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="${PROVIDER_VERSION:-4.34.2}"
provider_module=github.com/pulumi/pulumi-kubernetes/provider/v4

export GOFLAGS="-mod=readonly -buildvcs=false -gcflags=all=-dwarf=false"  # no DWARF: stripped anyway (-w)
export CGO_ENABLED=0

now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT

start=$(now)
cd "$here"
t=$(now)
go mod download "$provider_module"
module_dir="$(go list -m -f '{{.Dir}}' "$provider_module")"
module_version="$(go list -m -f '{{.Version}}' "$provider_module")"
echo "build.sh: $provider_module $module_version (download: $(took "$t"))"

t=$(now)
cp go.mod go.sum main.go "$stage/"
go run ./embedgen -module "$module_dir" -version "$version" -out "$stage"
echo "build.sh: schema for version $version generated ($(took "$t"))"

t=$(now)
cd "$stage"
go build -p 2 -trimpath \
    -ldflags "-s -w -X $provider_module/pkg/version.Version=$version" \
    -o "$out/pulumi-resource-kubernetes" .
echo "build.sh: go build ($(go version | cut -d' ' -f3)): $(took "$t")"

bin="$out/pulumi-resource-kubernetes"
echo "build.sh: $bin $(stat -c %s "$bin") bytes, sha256 $(sha256sum "$bin" | cut -d' ' -f1)"
echo "build.sh: total $(took "$start")"
