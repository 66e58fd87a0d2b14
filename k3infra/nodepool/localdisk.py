"""Local NVMe for node-local weights on clouds whose node image does not do it (OKE,
Nebius): a boot-time script that stripes every unused NVMe disk into one RAID0 array and
mounts it at `k3:weights.nodeLocalRoot`. EKS does the same through nodeadm's
`localStorage` (see aws.py); CKS mounts local NVMe itself.

Pure: returns the script text. RAID0, not RAID10: the weights are a verified cache that
the prefetch Job re-fetches after a disk loss, so capacity and read speed win.
"""
from __future__ import annotations

import shlex

from k3infra.podsecurity import ENGINE_GID, ENGINE_UID

MD_NAME = "k3-local"

_SCRIPT = r"""# k3infra: local NVMe -> RAID0 -> @ROOT@ (node-local Kimi K3 weights)
k3_root=@ROOT@
mkdir -p "$k3_root"
if ! mountpoint -q "$k3_root"; then
  k3_devs=()
  for d in /dev/nvme*n1; do
    [ -b "$d" ] || continue
    # Skip any disk that has partitions or is mounted (the boot disk).
    [ "$(lsblk -nro NAME "$d" | wc -l)" -eq 1 ] || continue
    [ -z "$(lsblk -nro MOUNTPOINT "$d" | tr -d '[:space:]')" ] || continue
    k3_devs+=("$d")
  done
  if [ "${#k3_devs[@]}" -gt 0 ]; then
    if [ ! -e /dev/md/@MD@ ]; then
      mdadm --create /dev/md/@MD@ --level=0 --force --run \
        --raid-devices="${#k3_devs[@]}" "${k3_devs[@]}"
      mkfs.xfs -f /dev/md/@MD@
    fi
    mount -o noatime /dev/md/@MD@ "$k3_root"
  else
    echo "k3infra: no unused local NVMe disk found; $k3_root stays on the boot disk" >&2
  fi
fi
@OWN@"""


def own_root_script(root: str) -> str:
    """The weights root belongs to the engine image's user: the prefetch and the gate run
    as that uid, and the kubelet would create a missing hostPath root-owned."""
    q = shlex.quote(root)
    return f"mkdir -p {q}\nchown {ENGINE_UID}:{ENGINE_GID} {q}\nchmod 0750 {q}\n"


def raid0_mount_script(root: str) -> str:
    """Bash fragment (no shebang) that is safe to run on every boot."""
    if not root.startswith("/") or ".." in root.split("/"):
        raise ValueError(f"mount root must be an absolute path without '..': {root!r}")
    return (_SCRIPT.replace("@ROOT@", shlex.quote(root)).replace("@MD@", MD_NAME)
            .replace("@OWN@", own_root_script(root)))
