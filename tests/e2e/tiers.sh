#!/usr/bin/env bash
# `make e2e`'s tests, in three lanes side by side (K3INFRA_TESTBED_BIN set by the caller):
#   tests/e2e/tiers.sh PYTHON
# Each lane first builds or reuses the testbed parts it runs (tools/testbed/build.sh, which
# builds the node lane's first): on a new machine the node lane starts while the parts
# only the others need are still being built (by CI's background build, or here).
# - control-plane: the tests marked e2e and not node, one session, on the machine's
#   loopback (its consumer tests fetch npm packages, which nothing inside a test's network
#   namespace can);
# - node: the modules that start a kubelet (node_fixture) under the machine's cgroup root,
#   each in its own session and its own network namespace (tests/e2e/netns.sh), one after
#   the other: two kubelets under one root share the kubepods cgroups, and two modules in
#   one session the node's name (409 AlreadyExists);
# - host: the other node-marked modules (Docker Compose on Debian's daemon, BuildKit under
#   runc, and kubelet modules with a cgroup root of their own: the node smoke module),
#   each in its own session and network namespace.
# They share nothing but the machine: in a row they took 2228 s here, most of it waiting
# for the CPU engine to start, a pod to turn Ready or a Job. Each lane's output is printed
# whole when it ends, with its time; the exit is 0 only if every session passed.
set -uo pipefail
py="$1"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.." || exit 1
logs=build/e2e
tmp=/tmp/k3e2e-tiers
rm -rf "$logs" "$tmp"; mkdir -p "$logs" "$tmp"
start=$(date +%s)
args=(-p no:cacheprovider -s -rs --durations=12)

node=(); host=()
for m in $(grep -l 'pytest.mark.node' tests/e2e/test_*.py | LC_ALL=C sort); do
  # A kubelet module with a cgroup root of its own (node_fixture's cgroup_root) can run
  # beside the node lane's kubelet: it joins the host lane, which ends long before.
  if grep -q node_fixture "$m" && ! grep -q 'cgroup_root=' "$m"; then node+=("$m"); else host+=("$m"); fi
done

testbed() {  # PARTS ("" for every part): export K3INFRA_TESTBED_BIN, their bin dir
  local out
  out="$(K3INFRA_TESTBED_PARTS="$1" tools/testbed/build.sh)" || return 1
  export K3INFRA_TESTBED_BIN="${out##*$'\n'}"
  echo "== testbed parts ${1:-(all)} ready at $(( $(date +%s) - start )) s: $K3INFRA_TESTBED_BIN"
}
control_plane() {
  testbed "" || return 1
  "$py" -m pytest -m "e2e and not node" "${args[@]}" --basetemp="$tmp/control-plane" tests/e2e
}
modules() {  # LANE PARTS MODULE...: each module in its own session and network namespace
  local lane="$1" rc=0 m; shift
  testbed "$1" || return 1; shift
  for m in "$@"; do
    echo "== $lane: $m at $(( $(date +%s) - start )) s"
    tests/e2e/netns.sh "$py" -m pytest -m "e2e and node" "${args[@]}" \
      --basetemp="$tmp/$(basename "$m" .py)" "$m" || rc=1
  done
  return "$rc"
}

# The node lane was the longest alone (the stack, about 13 minutes): the other two yield
# the CPU to it (nice). Side by side all three stretch (a cached CI here: control plane
# 1735 s, node 1638 s, host 929 s), still well under the 2228 s they took in a row.
# The parts each node lane runs: the CLI and the Kubernetes provider (every module's
# `pulumi`), the cluster; CoreDNS and the NetworkPolicy controller for the node; BuildKit (the build Job's image, the build
# scripts' test); the S3 server (versitygw) the node stack's weights come from; Docker
# Compose for the host's file.
node_lane() { modules node "pulumi cluster kubernetes coredns netpol buildkit s3server" "${node[@]}"; }
host_lane() { modules host "pulumi cluster kubernetes coredns netpol buildkit composecli" "${host[@]}"; }

# Disk: the node and host lanes each hold a copy of the images (the engine image is 3.4 GB
# packed, 6.7 GB unpacked: the registry's blobs, containerd's or Docker's store; the
# stack's two kubelets each have their own containerd). Measured at their largest: the
# stack on two nodes 26.3 GB (2026-12-06, `du` every 30 s), the host's compose file
# 10.4 GB, the control plane 1.5 GB (2026-12-04). Side by side they need 42 GB free
# under $tmp; with less, the host lane runs after the node lane (the same tests,
# longer), and with less than 28 GB a line says so before anything runs.
parallel_gb=42 serial_gb=28
free_gb=$(( $(df -Pk "$tmp" | awk 'NR == 2 { print $4 }') / 1048576 ))
declare -A lane_of
if (( free_gb >= parallel_gb )); then
  node_lane > "$logs/node.log" 2>&1 &
  lane_of[$!]=node
  ( renice -n 5 -p "$BASHPID" >/dev/null; host_lane ) > "$logs/host.log" 2>&1 &
  lane_of[$!]=host
else
  echo "e2e: $free_gb GB free under $tmp, under the $parallel_gb GB the node and host lanes" \
       "hold side by side: the host lane runs after the node lane"
  if (( free_gb < serial_gb )); then
    echo "e2e: warning: the stack on the node alone needs about $serial_gb GB free under $tmp;" \
         "with $free_gb GB its image stores may fill the disk" >&2
  fi
  ( rc=0; node_lane || rc=1; host_lane || rc=1; exit "$rc" ) > "$logs/node-then-host.log" 2>&1 &
  lane_of[$!]="node-then-host"
fi
( renice -n 5 -p "$BASHPID" >/dev/null; control_plane ) > "$logs/control-plane.log" 2>&1 &
lane_of[$!]=control-plane

rc=0
while (( ${#lane_of[@]} )); do
  wait -n -p finished "${!lane_of[@]}"; status=$?
  lane="${lane_of[$finished]}"; unset "lane_of[$finished]"
  echo "======== e2e lane $lane: exit $status at $(( $(date +%s) - start )) s ========"
  cat "$logs/$lane.log"
  (( status == 0 )) || rc=1
done
echo "e2e: every lane done in $(( $(date +%s) - start )) s (exit $rc)"
exit "$rc"
