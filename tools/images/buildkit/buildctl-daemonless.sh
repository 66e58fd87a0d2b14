#!/bin/sh
# buildctl with a buildkitd of its own for one command, as moby/buildkit's rootless
# image provides under this name (k3infra's own script): starts `rootlesskit buildkitd
# $BUILDKITD_FLAGS`, waits until it answers, runs `buildctl "$@"`, stops the daemon.
# The state (~/.local/share/buildkit) outlives it: the next call reuses the layers.
set -eu
: "${XDG_RUNTIME_DIR:=/run/user/$(id -u)}"
export XDG_RUNTIME_DIR
addr="unix://$XDG_RUNTIME_DIR/buildkit/buildkitd.sock"
log="$(mktemp "${TMPDIR:-/tmp}/buildkitd.XXXXXX")"
# shellcheck disable=SC2086  # BUILDKITD_FLAGS is a list of flags
rootlesskit buildkitd --addr "$addr" ${BUILDKITD_FLAGS:-} > "$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
tries=0
until buildctl --addr "$addr" debug workers > /dev/null 2>&1; do
    if ! kill -0 "$pid" 2> /dev/null; then
        cat "$log" >&2
        echo "buildctl-daemonless.sh: buildkitd exited before it answered" >&2
        exit 1
    fi
    tries=$((tries + 1))
    if [ "$tries" -ge 300 ]; then
        cat "$log" >&2
        echo "buildctl-daemonless.sh: buildkitd did not answer within 60 s" >&2
        exit 1
    fi
    sleep 0.2
done
buildctl --addr "$addr" "$@"
