#!/usr/bin/env bash
# The base image's root file system: Debian bookworm, debootstrap's minbase variant.
#   bootstrap.sh ROOTFS MIRROR [SECURITY_MIRROR]
# The mirrors are the machine's own apt sources (tools/images/build.sh finds them).
set -euo pipefail
rootfs="$1" mirror="$2" security="${3:-}"
suite=bookworm
variant=minbase

debootstrap --variant="$variant" --components=main "$suite" "$rootfs" "$mirror"

# apt for the images built on this one: the same mirror, security updates where the
# machine has a source for them, never recommends (a package list means what it says).
{
  echo "deb $mirror $suite main"
  echo "deb $mirror $suite-updates main"
  if [[ -n "$security" ]]; then echo "deb $security $suite-security main"; fi
} > "$rootfs/etc/apt/sources.list"
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
  > "$rootfs/etc/apt/apt.conf.d/90k3infra"

# Nothing of the build machine in the image: debootstrap copies its DNS and host name
# (the runtime mounts its own), and leaves its logs and package lists.
: > "$rootfs/etc/resolv.conf"
rm -f "$rootfs/etc/hostname"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
  "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/bootstrap.log \
  "$rootfs"/var/log/dpkg.log "$rootfs"/var/log/apt/*
