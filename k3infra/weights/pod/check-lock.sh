#!/bin/sh
# The lock must pin the configured revision and carry the digest the stack pins (its own
# lock's, or the receipt's): anything else is not the tree this stack serves.
set -eu
python3 - <<'PY'
import json, os, sys
lock = json.load(open(os.environ["K3_LOCK"]))
if lock.get("revision") != os.environ["K3_REVISION"]:
    sys.exit(f"k3 weights: lock {os.environ['K3_LOCK']} pins revision {lock.get('revision')!r}, "
             f"the stack pins {os.environ['K3_REVISION']!r}")
expected = os.environ["K3_EXPECT_TREE_DIGEST"]
if lock.get("tree_digest") != expected:
    sys.exit(f"k3 weights: not the measured tree: lock digest {lock.get('tree_digest')!r}, "
             f"the stack pins {expected!r} (another tree needs k3:profile custom and its "
             "own k3:weights.lockFile)")
PY
