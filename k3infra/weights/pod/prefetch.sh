#!/bin/sh
# Fetch the pinned weights tree and verify it against the lock (k3infra prefetch Job,
# and the node-local gate when its node is missing files). Resumable: a rerun continues.
set -eu
mkdir -p "$K3_TREE"
if [ -f /etc/k3/weights/lock.json ]; then
  # The stack shipped a lock (k3:weights.lockFile): use exactly that one.
  cp /etc/k3/weights/lock.json "$K3_LOCK.tmp" && mv "$K3_LOCK.tmp" "$K3_LOCK"
elif [ ! -f "$K3_LOCK" ]; then
  # No lock shipped: derive it from Hub metadata at the pinned revision (no shard download).
  python3 -m k3weights lock --hub "$K3_REPO" --revision "$K3_REVISION" --out "$K3_LOCK.tmp"
  mv "$K3_LOCK.tmp" "$K3_LOCK"
fi
sh /etc/k3/weights/check-lock.sh
exec python3 -m k3weights prefetch --lock "$K3_LOCK" --dest "$K3_TREE" --workers "$K3_HASH_WORKERS"
