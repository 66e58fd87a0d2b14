#!/usr/bin/env bash
# Build Pulumi YAML's language host from the module pinned in go.mod:
#   tools/testbed/yaml/build.sh OUTDIR   ->   OUTDIR/pulumi-language-yaml
# pulumi-yaml v1.25.0 (the newest the proxy serves) is built with the pkg/v3 and sdk/v3
# it requires (v3.206.0): it does not compile against the CLI's v3.274.1 (plugin.Context
# and schema.NewPluginLoader changed). go.sum must already be complete (-mod=readonly):
# a warm module cache builds offline.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")"
export GOFLAGS="-mod=readonly -buildvcs=false -gcflags=all=-dwarf=false"  # no DWARF: stripped anyway (-w)
module=github.com/pulumi/pulumi-yaml
v="$(go list -m -f '{{.Version}}' "$module")"
start=$(date +%s)
go build -ldflags "-s -w -X $module/pkg/version.Version=$v" \
    -o "$out/pulumi-language-yaml" "$module/cmd/pulumi-language-yaml"
echo "build.sh: $module $v, $(go version | cut -d' ' -f3), $(( $(date +%s) - start )) s"
