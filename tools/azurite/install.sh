#!/usr/bin/env bash
# Install Azurite (the Azure Storage emulator) from package-lock.json into a cache outside
# the work tree, keyed by the lock's hash; print the directory of its `azurite-blob` as the
# last line. `npm ci` installs exactly the locked versions and checks each integrity hash.
#   tools/azurite/install.sh            (K3INFRA_AZURITE_CACHE=DIR: cache root)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="${K3INFRA_AZURITE_CACHE:-$HOME/.cache/k3infra}"
key="$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)"
out="$root/azurite-$key"
mkdir -p "$root"
exec 9>"$out.lock"
flock 9
if [[ ! -f "$out/.complete" ]]; then
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  cp "$here/package.json" "$here/package-lock.json" "$out.tmp/"
  start=$(date +%s)
  (cd "$out.tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  rm -rf "$out"; mv "$out.tmp" "$out"
  echo "$(( $(date +%s) - start ))" > "$out/.install-seconds"
  touch "$out/.complete"
  echo "azurite: installed in $(cat "$out/.install-seconds") s" >&2
fi
echo "$out/node_modules/.bin"
