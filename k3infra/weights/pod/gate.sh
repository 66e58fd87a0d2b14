#!/bin/sh
# Init container of every serving pod: vLLM starts only on a tree verified against the
# lock. Fast path: the marker plus per-file stamps (O(files) stat calls, not 1.5 TB of
# reads). In node-local mode a node missing files fetches them first.
set -eu
if [ ! -f "$K3_LOCK" ] && [ "$K3_WEIGHTS_MODE" = "shared" ]; then
  echo "k3 gate: no lock at $K3_LOCK: the weights prefetch Job has not completed; refusing to serve" >&2
  exit 1
fi
if [ "$K3_WEIGHTS_MODE" = "node-local" ]; then
  if [ ! -f "$K3_LOCK" ] || ! python3 -m k3weights verify "$K3_TREE" --lock "$K3_LOCK" --require-marker; then
    echo "k3 gate: this node's weights are missing or unverified: fetching what is missing" >&2
    sh "$K3_RUNTIME_DIR"/prefetch.sh
  fi
fi
sh "$K3_RUNTIME_DIR"/check-lock.sh
if ! python3 -m k3weights verify "$K3_TREE" --lock "$K3_LOCK" --require-marker --workers "$K3_HASH_WORKERS"; then
  echo "k3 gate: weights at $K3_TREE are not verified against $K3_LOCK; refusing to serve" >&2
  exit 1
fi
echo "k3 gate: weights verified ($K3_TREE)"
