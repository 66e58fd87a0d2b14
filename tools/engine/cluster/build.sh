#!/usr/bin/env bash
# Build the e2e control plane (etcd, kube-apiserver, kube-controller-manager) into OUTDIR
# from the versions pinned in this folder's go.mod/go.sum.
#
#   tools/engine/cluster/build.sh OUTDIR
#
# Reproducible: -trimpath, -mod=readonly (go.sum must already hold every module),
# CGO off (static binaries, as Kubernetes releases them), and link-time version
# values taken from the module versions themselves (the build date is the release's
# module time, not now). Without the version linked in, kube-apiserver reports
# v0.0.0-master and the Pulumi Kubernetes provider refuses the server as too old.
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
cd "$here"

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
# A go.mod that needs a newer toolchain must fail here, not download one.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

mod_field() { go list -m -f "{{.$2}}" "$1"; }

kube_version="$(mod_field k8s.io/kubernetes Version)"
# The release's module time, in the format Kubernetes links its build date in.
kube_time="$(mod_field k8s.io/kubernetes 'Time.UTC.Format "2006-01-02T15:04:05Z"')"
if [[ ! "$kube_version" =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]]; then
    echo "build.sh: k8s.io/kubernetes version '$kube_version' is not a release vX.Y.Z" >&2
    exit 1
fi
kube_major="${BASH_REMATCH[1]}"
kube_minor="${BASH_REMATCH[2]}"
etcd_version="$(mod_field go.etcd.io/etcd/server/v3 Version)"

# The same keys Kubernetes' own hack/lib/version.sh links, for both version packages.
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X $pkg.gitVersion=$kube_version"
    kube_ldflags+=" -X $pkg.gitMajor=$kube_major"
    kube_ldflags+=" -X $pkg.gitMinor=$kube_minor"
    kube_ldflags+=" -X $pkg.gitTreeState=clean"
    kube_ldflags+=" -X $pkg.buildDate=$kube_time"
done

build() {  # build NAME PACKAGE LDFLAGS
    local start=$SECONDS
    echo "build.sh: building $1 ($2)"
    go build -trimpath -ldflags "$3" -o "$out/$1" "$2"
    echo "build.sh: built $1 in $((SECONDS - start)) s"
}

total=$SECONDS
# etcd's version is a constant of go.etcd.io/etcd/api/v3/version: nothing to link.
build etcd go.etcd.io/etcd/server/v3 "-s -w"
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
echo "build.sh: control plane built in $((SECONDS - total)) s into $out"

"$out/etcd" --version | head -1
"$out/kube-apiserver" --version
"$out/kube-controller-manager" --version
echo "build.sh: expected etcd $etcd_version, Kubernetes $kube_version"
