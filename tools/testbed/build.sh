#!/usr/bin/env bash
# Build (or reuse) the testbed: the real Pulumi CLI, a Kubernetes control plane and the
# other binaries the tests run, from Go modules, into a cache outside the work tree; print
# the bin directory as the last line.
#
#   tools/testbed/build.sh            # build what is missing, print the bin dir
#   tools/testbed/build.sh --keys     # print "NAME KEY" for each wanted part; build nothing
#   K3INFRA_TESTBED_CACHE=DIR ...     # cache root (default ~/.cache/k3infra/testbed)
#   K3INFRA_TESTBED_PARTS="pulumi kubernetes" ...   # only these parts (default: all)
#
# Each part is its own Go module with its own go.sum, cached under a key that hashes the
# part's sources (go.mod, go.sum, *.go, build.sh): a change to one part rebuilds only it.
#   .            pulumi (CLI) + pulumi-language-python (k3infra's host) + its exec script
#   kubernetes/  pulumi-resource-kubernetes
#   cluster/     etcd, kube-apiserver, kube-controller-manager
#   netpol/      kube-router-netpol (the e2e node's NetworkPolicy enforcement)
#   <dir>/       any other folder with a build.sh OUTDIR is a part too
# No binary is committed; nothing is downloaded but Go modules from the module proxy.
# The Go module paths (go.mod) keep the folder's old name (issue 47): they are linked into
# the binaries and hashed into the keys, so renaming them would rebuild every part.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
keys_only=0
if [[ "${1:-}" == --keys ]]; then keys_only=1; fi
root="${K3INFRA_TESTBED_CACHE:-$HOME/.cache/k3infra/testbed}"
# Migration (issue 47): until then this folder was tools/engine, its variables
# K3INFRA_ENGINE_CACHE and K3INFRA_ENGINE_PARTS (no longer read: said once here), and its
# cache the old root below. The first run with the default root moves the old root here
# (one rename, the same file system), so nothing rebuilds, and leaves a link in its place:
# a checkout from before the rename, or a test still running from one, keeps finding its
# parts and its bin dirs (absolute links through the old root's path).
if [[ -n "${K3INFRA_ENGINE_CACHE:-}${K3INFRA_ENGINE_PARTS:-}" ]]; then
  echo "testbed: K3INFRA_ENGINE_CACHE/K3INFRA_ENGINE_PARTS are not read: K3INFRA_TESTBED_*" >&2
fi
old_root="$HOME/.cache/k3infra/engine"
if [[ -z "${K3INFRA_TESTBED_CACHE:-}" && ! -e "$root" && -d "$old_root" && ! -L "$old_root" ]] \
    && (( ! keys_only )); then
  if mv -T "$old_root" "$root" 2>/dev/null; then
    ln -sfn testbed "$old_root"
    echo "testbed: moved the cache $old_root to $root" >&2
  fi  # else another run moved it first
fi
# Every part links with -s -w (no symbol table, no DWARF), so the compiler need not make
# DWARF either (-dwarf=false, in each part's GOFLAGS): CoreDNS from an empty build cache,
# four runs each, 2026-12-04: 160-182 CPU-s with it, 140-160 without (median 166 -> 155).
export GOFLAGS="-mod=readonly -buildvcs=false -gcflags=all=-dwarf=false"  # no DWARF: stripped anyway (-w)
(( keys_only )) || mkdir -p "$root"

# The Pulumi version linked into the CLI and the host: the sdk/v3 version go.mod pins.
pulumi_version() { (cd "$here" && go list -m -f '{{.Version}}' github.com/pulumi/pulumi/sdk/v3); }

part_key() {  # DIR [PATH...]: hash of the part's sources (default: everything in DIR)
  local dir="$1"; shift
  (cd "$dir" && find "${@:-.}" -type f \( -name go.mod -o -name go.sum -o -name '*.go' \
      -o -name '*.sh' -o -name '*.json' -o -name '*.yaml' \) -print \
    | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -c1-16
}

build_cli() {  # OUTDIR
  local out="$1" v; v="$(pulumi_version)"
  local ld="-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$v"
  (cd "$here" && go build -ldflags "$ld" -o "$out/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)
  (cd "$here" && go build -ldflags "$ld" -o "$out/pulumi-language-python" ./langhost)
  # The host runs the Python SDK's own entry script, shipped in the sdk/v3 module.
  local sdk; sdk="$(cd "$here" && go mod download -json github.com/pulumi/pulumi/sdk/v3 \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$out/"
}

# carry NAME KEY: a part built before the rename (issue 47) under the key its sources had
# then, taken over when carried-keys lists it for this key (the rename changed only names
# in comments and paths, not what is built): a hard-linked copy, so the old key's folder
# stays for checkouts from before the rename. Drop once no cache holds the old keys.
carry() {
  local old
  [[ ! -f "$root/$1-$2/.complete" ]] || return 0
  old="$(awk -v n="$1" -v k="$2" '$1 == n && $3 == k { print $2 }' "$here/carried-keys")"
  [[ -n "$old" && -f "$root/$1-$old/.complete" ]] || return 0
  rm -rf "$root/$1-$2.carry.$$"
  cp -al "$root/$1-$old" "$root/$1-$2.carry.$$"
  mv -T "$root/$1-$2.carry.$$" "$root/$1-$2" 2>/dev/null || rm -rf "$root/$1-$2.carry.$$"
  echo "testbed: $1 carried from its key before the rename ($1-$old)" >&2
}

# build_part NAME DIR BUILDER [PATH...]: build into ROOT/NAME-KEY unless already complete.
build_part() {
  local name="$1" dir="$2" builder="$3" key out start
  key="$(part_key "$dir" "${@:4}")"; out="$root/$name-$key"
  if (( keys_only )); then echo "$name $key"; return; fi
  # One build of a part at a time: two would share (and remove) each other's .tmp dir.
  # Per part, so `make test` (two small parts) never waits for CI's background build of
  # the others.
  exec 9>"$out.lock"
  flock 9
  carry "$name" "$key"
  if [[ -f "$out/.complete" ]]; then
    echo "testbed: $name reused ($out)" >&2
  else
    echo "testbed: building $name ..." >&2
    start=$(date +%s)
    rm -rf "$out.tmp"; mkdir -p "$out.tmp"
    "$builder" "$out.tmp" >&2
    rm -rf "$out"; mv "$out.tmp" "$out"
    echo "$(( $(date +%s) - start ))" > "$out/.build-seconds"
    touch "$out/.complete"
    echo "testbed: $name built in $(cat "$out/.build-seconds") s" >&2
  fi
  exec 9>&-
  parts+=("$out")
}

# Build order: pulumi and what the node lane of `make e2e` needs next (tests/e2e/tiers.sh
# starts that lane as soon as they are built, while the others still build), then the
# other parts by name.
node_lane=(cluster kubernetes coredns netpol buildkit)
subs=("${node_lane[@]}")
for f in "$here"/*/build.sh; do
  sub="$(basename "$(dirname "$f")")"
  [[ " ${node_lane[*]} " == *" $sub "* ]] || subs+=("$sub")
done
wanted=" ${K3INFRA_TESTBED_PARTS:-pulumi ${subs[*]}} "
parts=()
if [[ "$wanted" == *" pulumi "* ]]; then
  build_part pulumi "$here" build_cli go.mod go.sum build.sh langhost
fi
for sub in "${subs[@]}"; do
  if [[ "$wanted" == *" $sub "* && -x "$here/$sub/build.sh" ]]; then
    build_part "$sub" "$here/$sub" "$here/$sub/build.sh"
  fi
done

(( ! keys_only )) || exit 0

# One bin directory of links, keyed by the parts it joins. The links are relative
# (../PART-KEY/FILE), so the cache root can move; a bin dir with a dangling link (one
# made before they were) is made again.
bin="$root/bin-$(printf '%s\n' "${parts[@]##*/}" | sha256sum | cut -c1-16)"
if [[ -d "$bin" && -n "$(find "$bin" -maxdepth 1 -xtype l -print -quit)" ]]; then
  rm -rf "$bin"
fi
if [[ ! -d "$bin" ]]; then
  rm -rf "$bin.tmp.$$"; mkdir -p "$bin.tmp.$$"
  for p in "${parts[@]}"; do
    for f in "$p"/*; do ln -sf "../${p##*/}/${f##*/}" "$bin.tmp.$$/${f##*/}"; done
  done
  # Two runs joining the same parts: the first rename wins, the other's copy goes.
  mv -T "$bin.tmp.$$" "$bin" 2>/dev/null || rm -rf "$bin.tmp.$$"
fi
echo "$bin"
