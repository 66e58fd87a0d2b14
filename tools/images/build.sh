#!/usr/bin/env bash
# Build (or reuse) one of the e2e tier's container images from the project's own files,
# as an OCI image layout; print the layout directory as the last line (progress on stderr).
#
#   tools/images/build.sh NAME        # NAME: base, pause, proxy, engine-cpu, buildkit, accuracy
#   tools/images/build.sh --cached NAME   # print the layout if built, else fail; build nothing
#   K3INFRA_IMAGE_CACHE=DIR ...       # cache root (default ~/.cache/k3infra/images)
#
# Each layout is ROOT/NAME-KEY/ and holds one image, tagged `latest`; KEY hashes every
# input: this script, the image's folder here (recipe, package list, lock, config) and,
# for an image built on base, the base's key. A layout with .complete is reused.
#   base        debootstrap --variant=minbase bookworm (base/bootstrap.sh); the root file
#               system stays cached (ROOT/bootstrap-KEY/), so a change here re-packs only
#   pause       Kubernetes' own build/pause/linux/pause.c from the k8s.io/kubernetes module
#               tools/testbed/cluster pins, gcc -static, alone in the image (/pause)
#   proxy       base + Debian's nginx-light (the authenticating proxy, the weights source)
#   engine-cpu  base + python3 + /opt/vllm, a venv of engine-cpu/requirements.lock (the
#               community CPU build of vLLM, a test dependency only: docs/e2e.md)
#   accuracy    base + python3 + /opt/lm-eval, a venv of accuracy/requirements.lock
#               (lm-eval, requirements-accuracy.txt), and generated stand-ins of the
#               shipped tasks' two datasets in its HF cache (accuracy/stand_in_datasets.py)
#   buildkit    base + Debian's runc and uidmap + buildkitd, buildctl and rootlesskit
#               from tools/testbed/buildkit (its part key joins this image's key): the
#               rootless BuildKit image the engine build Job runs (buildkit/setup.sh)
# Images on base add one layer to base's (gzip). Needs root (debootstrap, chroot, mount
# namespaces), debootstrap, umoci, gcc, go, python3, and Debian's mirror in the machine's
# apt sources (/etc/apt/sources.list*). No `cmd | head` anywhere: under pipefail a
# writer killed by SIGPIPE fails the build by chance.
set -euo pipefail
# Parsed whole before it runs ({ ...; exit; }): a checkout or merge that rewrites this
# file during a 30-minute build cannot make bash read the rest from the new text.
{
here="$(cd "$(dirname "$0")" && pwd)"
root="${K3INFRA_IMAGE_CACHE:-$HOME/.cache/k3infra/images}"
TAG=latest
SYSTEM_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { echo "images: $*" >&2; }
die() { echo "images: $*" >&2; exit 1; }

cached=0
if [[ "${1:-}" == --cached ]]; then cached=1; shift; fi
name="${1:-}"
case "$name" in
  base | pause | proxy | engine-cpu | buildkit | accuracy) ;;
  *) die "usage: tools/images/build.sh NAME (NAME is base, pause, proxy, engine-cpu, buildkit or accuracy; got '${name}')" ;;
esac
[[ "$(id -u)" == 0 ]] || die "$name: needs root (debootstrap, chroot and mount namespaces)"
for tool in debootstrap umoci unshare chroot python3; do
  command -v "$tool" >/dev/null || die "$name: '$tool' is not installed (.ci/run installs it)"
done
mkdir -p "$root"

# One build of each output at a time (two would share, and remove, each other's .tmp
# directories); different images build side by side.
lock() {  # PATH: hold PATH.lock until the script exits
  local fd
  exec {fd}>"$1.lock"
  flock "$fd"
}

key() {  # STRING PATH...: hash of STRING and of every file under PATHs (relative to here)
  { printf '%s\n' "$1"; shift
    (cd "$here" && find "$@" -type f -print | LC_ALL=C sort | xargs sha256sum); } \
    | sha256sum | cut -c1-16
}

mirror_for() {  # SUITE: the first URI of the machine's apt sources that serves SUITE
  python3 - "$1" /etc/apt/sources.list /etc/apt/sources.list.d/* <<'EOF'
import pathlib, re, sys
want = sys.argv[1]
for f in sys.argv[2:]:
    p = pathlib.Path(f)
    if not p.is_file():
        continue
    text = p.read_text(errors="replace")
    if f.endswith(".sources"):  # deb822 paragraphs
        for para in re.split(r"\n\s*\n", text):
            fields = {}
            for line in para.splitlines():
                if ":" in line and not line.startswith("#"):
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.split()
            if "deb" in fields.get("types", []) and want in fields.get("suites", []) \
                    and fields.get("uris"):
                print(fields["uris"][0])
                sys.exit(0)
    elif f.endswith(".list"):  # deb [options] URI SUITE COMPONENT...
        for line in text.splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == want:
                print(words[1])
                sys.exit(0)
sys.exit(1)
EOF
}

# in_chroot ROOTFS CMD...: CMD inside ROOTFS in a private mount namespace (its /proc,
# /dev, /sys, /tmp and the BINDS go with the namespace, whatever happens), with the
# machine's DNS and a clean environment. BINDS: "SRC:DST[:rw]", read-only unless :rw.
BINDS=()
in_chroot() {
  local r="$1"; shift
  cp -L /etc/resolv.conf "$r/etc/resolv.conf"
  unshare --mount --propagation private --fork -- bash -euo pipefail -c '
    r="$1" n="$2"; shift 2
    mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev"
    mount -t sysfs sys "$r/sys"; mount -t tmpfs tmpfs "$r/tmp"
    for ((i = 0; i < n; i++)); do
      IFS=: read -r src dst mode <<< "$1"; dst="$r$dst"; shift
      mkdir -p "$dst"; mount --bind "$src" "$dst"
      if [[ "$mode" != rw ]]; then mount -o remount,bind,ro "$dst"; fi
    done
    exec chroot "$r" /usr/bin/env -i PATH="'"$SYSTEM_PATH"'" HOME=/root LC_ALL=C.UTF-8 \
      DEBIAN_FRONTEND=noninteractive "$@"
  ' in_chroot "$r" "${#BINDS[@]}" "${BINDS[@]}" "$@"
  : > "$r/etc/resolv.conf"
}

image_config() {  # LAYOUT DIR: apply DIR/image.conf (one umoci config flag a line)
  local flags=() line
  while IFS= read -r line; do
    [[ -z "$line" || "$line" == \#* ]] || flags+=("$line")
  done < "$2/image.conf"
  umoci config --image "$1:$TAG" --created "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${flags[@]}"
  umoci gc --layout "$1"
}

# carry NAME KEY: a layout built before tools/engine became tools/testbed (issue 47) under
# the key this script's text had then, taken over when carried-keys lists it for this key
# (the rename changed names in this script, not what it builds): a hard-linked copy, so
# the old key's layout stays for checkouts from before the rename. Drop once no cache
# holds the old keys.
carry() {
  local old
  [[ ! -f "$root/$1-$2/.complete" ]] || return 0
  old="$(awk -v n="$1" -v k="$2" '$1 == n && $3 == k { print $2 }' "$here/carried-keys")"
  [[ -n "$old" && -f "$root/$1-$old/.complete" ]] || return 0
  rm -rf "$root/$1-$2.carry.$$"
  cp -al "$root/$1-$old" "$root/$1-$2.carry.$$"
  mv -T "$root/$1-$2.carry.$$" "$root/$1-$2" 2>/dev/null || rm -rf "$root/$1-$2.carry.$$"
  log "$1 carried from its key before the rename ($1-$old)"
}

# build NAME KEY BUILDER: ROOT/NAME-KEY, built by BUILDER OUT unless already complete;
# sets $built to the layout.
build() {
  local n="$1" k="$2" builder="$3" out start
  out="$root/$n-$k"
  carry "$n" "$k"
  if [[ ! -f "$out/.complete" ]] && (( ! cached )); then lock "$out"; fi
  if [[ -f "$out/.complete" ]]; then
    log "$n reused ($out)"
  elif (( cached )); then
    die "$n is not built ($out has no .complete): tools/images/build.sh $n builds it"
  else
    log "building $n ..."
    start=$(date +%s)
    rm -rf "$out".tmp*
    # A failed build leaves nothing (its mounts went with their namespaces).
    trap 'rm -rf "$out".tmp*' EXIT
    "$builder" "$out.tmp" >&2
    trap - EXIT
    rm -rf "$out"; mv "$out.tmp" "$out"
    echo "$(( $(date +%s) - start ))" > "$out/.build-seconds"
    du -sb --exclude=.build-seconds "$out" | cut -f1 > "$out/.bytes"
    touch "$out/.complete"
    log "$n built in $(cat "$out/.build-seconds") s, $(( $(cat "$out/.bytes") / 1048576 )) MiB"
  fi
  built="$out"
}

# --- base --------------------------------------------------------------------------------

bootstrap_key="$(key bootstrap base/bootstrap.sh)"
bootstrap_dir="$root/bootstrap-$bootstrap_key"

bootstrap_rootfs() {  # the cached root file system debootstrap made
  [[ -f "$bootstrap_dir/.complete" ]] || lock "$bootstrap_dir"
  if [[ -f "$bootstrap_dir/.complete" ]]; then
    log "bootstrap reused ($bootstrap_dir)"; return
  fi
  local mirror security start=$(date +%s)
  mirror="$(mirror_for bookworm)" \
    || die "base: no apt source for bookworm in /etc/apt/sources.list* (debootstrap needs a Debian mirror)"
  security="$(mirror_for bookworm-security)" || security=""
  log "debootstrap bookworm from $mirror ..."
  rm -rf "$bootstrap_dir"; mkdir -p "$bootstrap_dir"
  "$here/base/bootstrap.sh" "$bootstrap_dir/rootfs" "$mirror" "$security" >&2
  echo "$(( $(date +%s) - start ))" > "$bootstrap_dir/.build-seconds"
  touch "$bootstrap_dir/.complete"
  log "debootstrap took $(cat "$bootstrap_dir/.build-seconds") s"
}

build_base() {  # OUT
  bootstrap_rootfs
  umoci init --layout "$1"
  umoci new --image "$1:$TAG"
  # unpack + repack, not `umoci insert DIR /`: that layer's first entry is "/".
  umoci unpack --image "$1:$TAG" "$1.work/bundle" >/dev/null
  cp -a "$bootstrap_dir/rootfs/." "$1.work/bundle/rootfs/"
  umoci repack --image "$1:$TAG" --history.created_by "debootstrap --variant=minbase bookworm" \
    "$1.work/bundle"
  rm -rf "$1.work"
  image_config "$1" "$here/base"
}
base_key="$(key "bootstrap $bootstrap_key" build.sh base)"

# --- images on base: one layer each ----------------------------------------------------

# build_on_base OUT DIR: base's layout plus DIR/packages (apt) and DIR/setup.sh (run in
# the image's own root, DIR mounted at /mnt/recipe), one new layer.
phase_start=0
phase() {  # WHAT: log the time since the last phase (what takes long, in each build log)
  local now; now=$(date +%s)
  if (( phase_start )); then log "$name: $1 took $(( now - phase_start )) s"; fi
  phase_start=$now
}

build_on_base() {
  local out="$1" dir="$2" work="$1.work" r packages=()
  phase start
  cp -a "$base_layout" "$out"
  rm -f "$out"/.complete "$out"/.build-seconds "$out"/.bytes
  umoci unpack --image "$out:$TAG" "$work/bundle" >/dev/null
  phase "unpacking base"
  r="$work/bundle/rootfs"
  # No daemon starts inside the build (nginx's postinst would try).
  printf '#!/bin/sh\nexit 101\n' > "$r/usr/sbin/policy-rc.d"; chmod 0755 "$r/usr/sbin/policy-rc.d"
  if [[ -f "$dir/packages" ]]; then
    while IFS= read -r line; do
      [[ -z "$line" || "$line" == \#* ]] || packages+=("$line")
    done < "$dir/packages"
    in_chroot "$r" apt-get update -qq
    in_chroot "$r" apt-get install -y -qq --no-install-recommends "${packages[@]}"
    in_chroot "$r" apt-get clean
    phase "apt-get install ${packages[*]}"
  fi
  if [[ -x "$dir/setup.sh" ]]; then
    BINDS+=("$dir:/mnt/recipe")
    in_chroot "$r" /mnt/recipe/setup.sh
    phase "setup.sh"
  fi
  rm -rf "$r"/usr/sbin/policy-rc.d "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin \
    "$r"/var/log/apt/* "$r"/var/log/dpkg.log "$r"/var/cache/debconf/*-old
  # The mount points of BINDS (rmdir: never the content of a mount that outlived its namespace).
  for line in "${BINDS[@]}"; do IFS=: read -r _ dst _ <<< "$line"; rmdir "$r$dst"; done
  umoci repack --image "$out:$TAG" --history.created_by "tools/images/build.sh $name" \
    "$work/bundle"
  phase "umoci repack (the new layer, gzip)"
  image_config "$out" "$dir"
  rm -rf "$work"
}

build_proxy() { build_on_base "$1" "$here/proxy"; }

# The venv's wheels, fetched by the image's own pip (for the image's own python) into a
# wheelhouse kept in the cache by the lock's hash, so a rebuild downloads nothing
# (pip's HTTP cache does not hold them here: the index's files come without
# Cache-Control). setup.sh installs from it with --no-index --require-hashes.
build_with_wheels() {  # OUT NAME: an image on base whose setup.sh installs NAME/requirements.lock
  local wheels
  wheels="$root/wheels-$(key wheels "$2/requirements.lock")"
  lock "$wheels"
  mkdir -p "$wheels"
  # The machine's trust for that download (its index may sit behind its own CA), never
  # the image's: bound for the build only.
  BINDS+=("$wheels:/mnt/wheels:rw" "/etc/ssl/certs:/mnt/host-certs")
  build_on_base "$1" "$here/$2"
  touch "$wheels/.complete"
}
build_engine_cpu() { build_with_wheels "$1" engine-cpu; }
build_accuracy() { build_with_wheels "$1" accuracy; }

# The testbed part's binaries (built or reused by tools/testbed/build.sh), bound read-only.
build_buildkit() {
  BINDS+=("$buildkit_part:/mnt/buildkit")
  build_on_base "$1" "$here/buildkit"
}

# --- pause -----------------------------------------------------------------------------

# Kubernetes' pause.c, from the module the control plane is built from.
pause_source() {
  local dir
  dir="$(cd "$here/../testbed/cluster" && go mod download -json k8s.io/kubernetes \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  echo "$dir/build/pause/linux/pause.c"
}

build_pause() {  # OUT
  local src="$1.src"
  mkdir -p "$src"
  gcc -Os -static -Wall -Werror -DVERSION="k3infra-$pause_version" -o "$src/pause" "$pause_c"
  strip "$src/pause"
  umoci init --layout "$1"
  umoci new --image "$1:$TAG"
  umoci insert --image "$1:$TAG" --history.created_by "gcc -static pause.c" "$src/pause" /pause
  rm -rf "$src"
  image_config "$1" "$here/pause"
}

case "$name" in
  base) build base "$base_key" build_base ;;
  pause)
    command -v gcc >/dev/null || die "pause: 'gcc' is not installed"
    pause_c="$(pause_source)"
    [[ -f "$pause_c" ]] || die "pause: no $pause_c in the k8s.io/kubernetes module"
    pause_version="$(cd "$here/../testbed/cluster" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
    build pause "$(key "pause.c $(sha256sum < "$pause_c") $pause_version $(gcc -dumpfullversion)" \
      build.sh pause)" build_pause ;;
  proxy | engine-cpu | buildkit | accuracy)
    base_layout="$root/base-$base_key"
    extra=""
    if [[ "$name" == buildkit ]]; then
      # The part's directory (its name carries the hash of its sources), from a link in
      # the bin directory the testbed build prints last.
      testbed_bin="$(K3INFRA_TESTBED_PARTS=buildkit "$here/../testbed/build.sh")"
      testbed_bin="${testbed_bin##*$'\n'}"
      buildkit_part="$(dirname "$(readlink -f "$testbed_bin/buildkitd")")"
      extra=" part $(basename "$buildkit_part")"
    fi
    if (( ! cached )); then build base "$base_key" build_base; fi
    build "$name" "$(key "base $base_key$extra" build.sh "$name")" "build_${name//-/_}" ;;
esac
echo "$built"
exit
}
