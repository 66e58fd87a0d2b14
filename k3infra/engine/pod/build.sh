#!/bin/sh
# The engine build, inside the rootless BuildKit image (busybox sh, no JSON tools).
#   pass 1: --target wheel-export -> $K3_OUT/wheel (the wheel + engine-wheel.{json,env})
#   pass 2: --target runtime with WHEEL_SHA256 / ENGINE_COMMIT_FULL from pass 1 as
#           labels -> pushed to $K3_IMAGE; BuildKit's metadata (the pushed digest) ->
#           $K3_OUT/metadata.json for the report container.
# Pass 2 reuses pass 1's layers from the local BuildKit state; with a registry cache
# ($K3_CACHE, its own repository) both read it and pass 2 writes it (mode=max).
# A failed pass leaves $K3_OUT/build.failed (the log's last lines) and exits 0: the
# `report` container then fails the Job with those lines as its termination message,
# which `pulumi up` prints (it reads the Job's containers, not its init containers).
set -eu

: "${K3_CONTEXT:?local or a Git context}"
: "${K3_IMAGE:?repository:tag to push}"
# K3_CACHE: the registry cache ref in its own repository, or empty for none.
K3_CACHE="${K3_CACHE:-}"
: "${K3_BUILD_ARGS_FILE:?file of KEY=VALUE build args}"
: "${K3_OUT:?output directory}"
K3_CONTEXT_DIR="${K3_CONTEXT_DIR:-/k3/context}"
K3_SCCACHE_ENV="${K3_SCCACHE_ENV:-/k3/sccache/env}"
BUILDCTL="${BUILDCTL:-buildctl-daemonless.sh}"

# Common options, collected in "$@" (the one array POSIX sh has).
set -- --frontend dockerfile.v0
if [ "$K3_CONTEXT" = "local" ]; then
    # A ConfigMap volume holds each key as a link into its hidden ..data directory, and
    # BuildKit sends links as links: every COPY from the context failed "not found" on the
    # node. The build reads a plain copy.
    context="$K3_OUT/context"
    rm -rf "$context"
    mkdir -p "$context"
    for f in "$K3_CONTEXT_DIR"/*; do
        cp -L "$f" "$context/"
    done
    set -- "$@" --local "context=$context" --local "dockerfile=$context"
else
    set -- "$@" --opt "context=$K3_CONTEXT"
fi
n=0
while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
        ''|'#'*) continue ;;
        *=*) set -- "$@" --opt "build-arg:$line"; n=$((n + 1)) ;;
        *) echo "k3-engine: bad build-arg line: $line" >&2; exit 2 ;;
    esac
done < "$K3_BUILD_ARGS_FILE"
if [ "$n" -eq 0 ]; then
    echo "k3-engine: no build args in $K3_BUILD_ARGS_FILE" >&2
    exit 2
fi
if [ "${K3_SCCACHE:-0}" = "1" ]; then
    set -- "$@" --secret "id=sccache,src=$K3_SCCACHE_ENV"
fi
if [ -n "$K3_CACHE" ]; then
    set -- "$@" --import-cache "type=registry,ref=$K3_CACHE"
fi

passes() {
    mkdir -p "$K3_OUT/wheel"
    t0=$(date +%s)
    echo "k3-engine: pass 1 (wheel) for $K3_IMAGE from $K3_CONTEXT"
    "$BUILDCTL" build "$@" --opt target=wheel-export \
        --output "type=local,dest=$K3_OUT/wheel"
    t1=$(date +%s)
    echo "k3-engine: pass 1 took $((t1 - t0)) s"

    if [ ! -s "$K3_OUT/wheel/engine-wheel.env" ]; then
        echo "k3-engine: pass 1 wrote no engine-wheel.env" >&2
        exit 1
    fi
    WHEEL_SHA256=""
    ENGINE_COMMIT_FULL=""
    # shellcheck disable=SC1091  # written by pass 1 (k3_engine_build.py wheel-record)
    . "$K3_OUT/wheel/engine-wheel.env"
    case "$WHEEL_SHA256" in
        *[!0-9a-f]*|'') echo "k3-engine: bad WHEEL_SHA256 '$WHEEL_SHA256'" >&2; exit 1 ;;
    esac
    if [ "${#WHEEL_SHA256}" -ne 64 ]; then
        echo "k3-engine: WHEEL_SHA256 is not 64 hex characters" >&2
        exit 1
    fi

    echo "k3-engine: pass 2 (runtime image) wheel sha256 $WHEEL_SHA256"
    if [ -n "$K3_CACHE" ]; then
        set -- "$@" --export-cache "type=registry,ref=$K3_CACHE,mode=max,ignore-error=true"
    fi
    "$BUILDCTL" build "$@" --opt target=runtime \
        --opt "build-arg:WHEEL_SHA256=$WHEEL_SHA256" \
        --opt "build-arg:ENGINE_COMMIT_FULL=$ENGINE_COMMIT_FULL" \
        --output "type=image,name=$K3_IMAGE,push=true" \
        --metadata-file "$K3_OUT/metadata.json"
    t2=$(date +%s)
    echo "k3-engine: pass 2 took $((t2 - t1)) s; total $((t2 - t0)) s"
}

rm -f "$K3_OUT/build.ok" "$K3_OUT/build.failed"
mkdir -p "$K3_OUT"
# set -e holds inside the group (it is not a tested command); the marker is written only
# if every step passed. tee keeps the log streaming to the pod's log.
{ passes "$@"; : > "$K3_OUT/build.ok"; } 2>&1 | tee "$K3_OUT/build.log"
if [ ! -e "$K3_OUT/build.ok" ]; then
    tail -n 40 "$K3_OUT/build.log" > "$K3_OUT/build.failed"
    echo "k3-engine: the build failed; the report container fails the Job with its last lines" >&2
fi
