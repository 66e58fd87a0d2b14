#!/bin/sh
# The lock must pin the configured revision and, unless the stack is `profile: custom`,
# carry the receipt's tree digest: anything else is not the measured tree.
set -eu
python3 - <<'PY'
import json, os, sys
lock = json.load(open(os.environ["K3_LOCK"]))
if lock.get("revision") != os.environ["K3_REVISION"]:
    sys.exit(f"k3 weights: lock {os.environ['K3_LOCK']} pins revision {lock.get('revision')!r}, "
             f"the stack pins {os.environ['K3_REVISION']!r}")
expected = os.environ.get("K3_EXPECT_TREE_DIGEST")
if expected and lock.get("tree_digest") != expected:
    sys.exit(f"k3 weights: not the measured tree: lock digest {lock.get('tree_digest')!r}, "
             f"receipt {expected!r} (set k3:profile custom to serve another tree)")
PY
