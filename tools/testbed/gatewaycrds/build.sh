#!/usr/bin/env bash
# The CRD schemas the inference gateway's objects are written against (k3infra/gateway,
# k3:autoscaling), for the e2e API server: Gateway API (standard channel), the Gateway
# API Inference Extension's InferencePool, Envoy Gateway's SecurityPolicy and KEDA's
# ScaledObject, copied into OUTDIR/gateway-crds/.
#
#   tools/testbed/gatewaycrds/build.sh OUTDIR
#
# Each file comes from its project's Go module at the pinned version (the module proxy:
# the one source this machine reaches, and what `go` verifies against the checksum
# database), and must have the SHA-256 below. Nothing is built; no file is committed.
# The versions are k3infra/gateway/versions.py's (tests/test_gateway.py holds them equal).
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1/gateway-crds"
out="$(cd "$1/gateway-crds" && pwd)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
# Outside any module: `go mod download module@version` fetches that module alone.
export GOFLAGS=
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

# module version path-in-module sha256
while read -r module version path sha; do
    [[ -z "$module" || "$module" == \#* ]] && continue
    dir="$(go mod download -json "$module@$version" \
        | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))')"
    got="$(sha256sum "$dir/$path" | cut -d' ' -f1)"
    if [[ "$got" != "$sha" ]]; then
        echo "gatewaycrds: $module@$version $path has sha256 $got, expected $sha" >&2
        exit 1
    fi
    install -m 0644 "$dir/$path" "$out/$(basename "$path")"
    echo "gatewaycrds: $module@$version $path"
done <<'PINS'
sigs.k8s.io/gateway-api v1.5.1 config/crd/standard/gateway.networking.k8s.io_gateways.yaml 7416e8300eb4d8c0a71a23445609075bbacbe8bc80104584b019cfe1ebe77c31
sigs.k8s.io/gateway-api v1.5.1 config/crd/standard/gateway.networking.k8s.io_httproutes.yaml 682203b109baecb18d38073a578f7bc2c17d22fe9b0c27bf030850abe014c370
sigs.k8s.io/gateway-api-inference-extension v1.5.0 config/crd/bases/inference.networking.k8s.io_inferencepools.yaml 0bc3ddd94db6f588a5cecc627c39e3d12b4343d51c48d47ffa68c50fa73c290c
github.com/envoyproxy/gateway v1.9.1 charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_securitypolicies.yaml 0eddd4bb2ac007b709433fec37669e79fd57b153fbfe7b42446d45ea384c0a74
github.com/kedacore/keda/v2 v2.21.0 config/crd/bases/keda.sh_scaledobjects.yaml af35555862a83933b074af14ad439c4b4ceabaf4daa3e9338e9b23e36d308d80
PINS
