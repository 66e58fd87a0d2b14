#!/usr/bin/env bash
# Run a command inside a network namespace made for it, and remove the namespace after.
#   tests/e2e/netns.sh CMD [ARGS...]
# `make e2e` runs the node tier this way: its control plane, the node (kubelet,
# containerd, kube-proxy, CoreDNS), the registry and the loopback Hub listen only inside
# it, and nothing it sends leaves it. Inside there are `lo` and one veth pair whose far end
# has no address: NODE_IP (K3INFRA_E2E_NODE_IP) is the node's InternalIP, the default
# route points at the pair so Service addresses route, and a packet to anywhere else ends
# at the far end. Needs root (ip netns); the namespace goes whatever the command does.
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 CMD [ARGS...]" >&2
  exit 2
fi
if [[ "$(id -u)" != 0 ]]; then
  echo "$0: needs root (ip netns add); CI runs as root" >&2
  exit 2
fi
NODE_IP=10.200.0.1
ns="k3e2e-$$"
# The pods' own namespaces, which the CNI plugin names cni-*: this run's go with it (the
# kubelet does not tear its pods down when it stops). This run's are those mounted in its
# own mount namespace (listed as the command ends), not every cni-* made meanwhile: `make
# e2e` runs two of these side by side, and one must not remove the other's pods' network.
owned="$(mktemp)"
cleanup() {
  ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$ns"
  while read -r n; do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$n" 2>/dev/null || rm -f "/run/netns/$n"
  done < "$owned"
  rm -f "$owned"
}
ip netns add "$ns"
trap cleanup EXIT
ip netns exec "$ns" sh -euc "
  ip link set lo up
  ip link add k3n0 type veth peer name k3n1
  ip addr add $NODE_IP/24 dev k3n0
  ip link set k3n0 up
  ip link set k3n1 up
  ip route add default dev k3n0
  sysctl -qw net.ipv4.ip_forward=1
"
export K3INFRA_E2E_NODE_IP="$NODE_IP"
# nsenter, not `ip netns exec`: the latter mounts /sys anew, where the cgroup hierarchies
# the kubelet needs are gone. A private mount namespace of its own instead: the mounts
# the kubelet and containerd make (volumes, the kubelet's root, container root file
# systems) vanish with the command, whatever it leaves.
nsenter --net="/run/netns/$ns" -- unshare --mount --propagation private -- sh -c '
  owned="$1"; shift
  rc=0; "$@" || rc=$?
  awk '\''$5 ~ "^/run/netns/cni-" { sub("^/run/netns/", "", $5); print $5 }'\'' /proc/self/mountinfo > "$owned"
  exit "$rc"' netns "$owned" "$@"
