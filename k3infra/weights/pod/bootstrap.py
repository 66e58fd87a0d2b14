# The entrypoint of every weights container (prefetch Job, serving gate, audit), inlined
# by Pulumi into the pod spec as K3_RUNTIME_BOOTSTRAP, never shipped in the ConfigMap.
# Someone who can edit the runtime ConfigMap could otherwise change the verifier itself:
# each file is read once, its sha256 compared with the digest Pulumi rendered into
# K3_RUNTIME_SHA256 (so recorded in Pulumi state), and only the verified bytes, copied to
# a private directory, ever run.
#   python3 -c "$K3_RUNTIME_BOOTSTRAP" <k3weights command...>
#   python3 -c "$K3_RUNTIME_BOOTSTRAP" sh <script> [args...]
import hashlib
import json
import os
import runpy
import sys
import tempfile

src = os.environ["K3_RUNTIME_DIR"]
pins = json.loads(os.environ["K3_RUNTIME_SHA256"])
dst = tempfile.mkdtemp(prefix="k3-runtime-", dir=os.environ.get("K3_RUNTIME_COPY_DIR") or None)
for rel, want in sorted(pins.items()):
    try:
        with open(os.path.join(src, rel), "rb") as fh:
            data = fh.read()
    except OSError as exc:
        sys.exit(f"k3 runtime: cannot read {rel} from {src} ({exc.strerror}); refusing")
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        sys.exit(f"k3 runtime: {rel} has sha256 {got}, the stack pins {want}: the runtime "
                 "ConfigMap was changed outside Pulumi; refusing to run it")
    path = os.path.join(dst, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
os.environ["K3_RUNTIME_DIR"] = os.environ["PYTHONPATH"] = dst
if sys.argv[1:2] == ["sh"]:
    os.execvp("sh", ["sh", os.path.join(dst, sys.argv[2]), *sys.argv[3:]])
sys.path.insert(0, dst)
sys.argv = ["k3weights", *sys.argv[1:]]
runpy.run_module("k3weights", run_name="__main__", alter_sys=True)
