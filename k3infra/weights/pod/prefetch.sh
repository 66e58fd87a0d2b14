#!/bin/sh
# Fetch the pinned weights tree and verify it against the lock (the prefetch Job; run
# by the bootstrap from verified copies). Resumable: a rerun continues.
set -eu
lock_dir=$(dirname "$K3_LOCK")
if ! mkdir -p "$lock_dir" 2>/dev/null || [ ! -w "$lock_dir" ]; then
  echo "k3 weights: $lock_dir is not writable by uid $(id -u): the weights root must be" \
       "owned by the engine image's user (docs/weights.md, node-local mode)" >&2
  exit 1
fi
if [ -f "$K3_RUNTIME_DIR"/lock.json ]; then
  # The stack shipped a lock (k3:weights.lockFile): use exactly that one.
  cp "$K3_RUNTIME_DIR"/lock.json "$K3_LOCK.tmp" && mv "$K3_LOCK.tmp" "$K3_LOCK"
elif [ ! -f "$K3_LOCK" ]; then
  # No lock shipped: from the first source that has it, in K3_WEIGHTS_SOURCES order (an
  # in-cluster source's lock, or Hub metadata at the pinned revision; no shard download).
  # Whichever it is, check-lock.sh holds it to the pinned digest below.
  python3 -m k3weights lock --hub "$K3_REPO" --revision "$K3_REVISION" \
    --sources "${K3_WEIGHTS_SOURCES:-hub}" --out "$K3_LOCK.tmp"
  mv "$K3_LOCK.tmp" "$K3_LOCK"
fi
# Refuse another tree before a single shard is downloaded.
sh "$K3_RUNTIME_DIR"/check-lock.sh
exec python3 -m k3weights prefetch --lock "$K3_LOCK" --dest "$K3_TREE" --workers "$K3_HASH_WORKERS" \
  --expect-digest "$K3_EXPECT_TREE_DIGEST" --sources "${K3_WEIGHTS_SOURCES:-hub}"
