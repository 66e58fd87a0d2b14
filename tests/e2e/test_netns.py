"""tests/e2e/netns.sh, which `make e2e` runs two of side by side (tests/e2e/tiers.sh): the
command's exit status comes back, the namespace goes, and of the pods' `cni-*` namespaces
only those its own mount namespace held are removed. Before, it removed every `cni-*`
made during its run, so a lane ending first would have taken the network of the other
lane's pods."""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e]

NETNS = Path(__file__).resolve().parent / "netns.sh"


@pytest.fixture
def root():
    if os.geteuid() != 0:
        pytest.skip("netns.sh needs root (ip netns add); CI runs as root")


def test_the_commands_exit_status_comes_back(root):
    assert subprocess.run([str(NETNS), "sh", "-c", "exit 7"]).returncode == 7
    assert subprocess.run([str(NETNS), "true"]).returncode == 0


def test_only_its_own_cni_namespaces_go(root):
    tag = uuid.uuid4().hex[:8]
    own, other = Path(f"/run/netns/cni-{tag}-own"), Path(f"/run/netns/cni-{tag}-other")
    before = set(os.listdir("/run/netns")) if Path("/run/netns").is_dir() else set()
    try:
        # As containerd does inside the lane: a file under /run/netns, a namespace bound
        # on it; `other` stands for another lane's pod (made meanwhile, mounted elsewhere).
        script = (f"touch {own} {other} && mount --bind /proc/self/ns/net {own} && "
                  f"grep -q ' {own} ' /proc/self/mountinfo")
        assert subprocess.run([str(NETNS), "sh", "-c", script]).returncode == 0
        assert not own.exists(), "its own cni namespace was left behind"
        assert other.exists(), "another run's cni namespace was removed"
        after = set(os.listdir("/run/netns")) - before - {other.name}
        assert not after, after       # its own k3e2e-* namespace went too
    finally:
        own.unlink(missing_ok=True)
        other.unlink(missing_ok=True)
