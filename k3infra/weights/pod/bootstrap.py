# The entrypoint of every weights container (prefetch Job, serving gate, audit), inlined
# by Pulumi into the pod spec as K3_RUNTIME_BOOTSTRAP, never shipped in the ConfigMap.
# Someone who can edit the runtime ConfigMap could otherwise change the verifier itself:
# each file is read once, its sha256 compared with the digest Pulumi rendered into
# K3_RUNTIME_SHA256 (so recorded in Pulumi state), and only the verified bytes, copied to
# a private directory, ever run.
#   python3 -c "$K3_RUNTIME_BOOTSTRAP" <k3weights command...>
#   python3 -c "$K3_RUNTIME_BOOTSTRAP" sh <script> [args...]
# Each copy holds an flock on its .lock for as long as its user lives (the fd survives
# exec), so a start removes the copies no live process holds: a container restarted
# N times leaves at most one in its /tmp (an emptyDir, kept across restarts), never N.
import fcntl
import hashlib
import json
import os
import runpy
import shutil
import stat
import sys
import tempfile

PREFIX = "k3-runtime-"
LOCK = ".lock"


def remove_dead_copies(parent):
    """Earlier copies in `parent` whose holder is gone: only real directories of this
    uid with a lock file nobody holds (another writer of /tmp cannot make us delete
    anything of its choosing: a symlink, another uid's directory or a directory without
    a lock is left alone; rmtree does not follow symlinks inside)."""
    for name in os.listdir(parent):
        if not name.startswith(PREFIX):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                lfd = os.open(LOCK, os.O_RDWR | os.O_NOFOLLOW, dir_fd=dfd)
            finally:
                os.close(dfd)
        except OSError:
            continue
        try:
            fcntl.flock(lfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue                    # in use
        finally:
            os.close(lfd)
        shutil.rmtree(path, ignore_errors=True)


src = os.environ["K3_RUNTIME_DIR"]
pins = json.loads(os.environ["K3_RUNTIME_SHA256"])
parent = os.environ.get("K3_RUNTIME_COPY_DIR") or tempfile.gettempdir()
remove_dead_copies(parent)
dst = tempfile.mkdtemp(prefix=PREFIX, dir=parent)          # 0700, unpredictable name
# Locked before it gets the name a cleaner looks for: no start can see it unheld.
held = os.open(os.path.join(dst, LOCK + ".new"),
               os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
fcntl.flock(held, fcntl.LOCK_EX)
os.rename(os.path.join(dst, LOCK + ".new"), os.path.join(dst, LOCK))
os.set_inheritable(held, True)                             # held by the exec'd program too
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
try:
    runpy.run_module("k3weights", run_name="__main__", alter_sys=True)
finally:
    shutil.rmtree(dst, ignore_errors=True)     # in-process: nothing runs from it after this
