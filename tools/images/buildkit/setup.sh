#!/bin/sh
# Runs inside the image's root (tools/images/build.sh): this folder at /mnt/recipe,
# the tools/testbed/buildkit part (buildkitd, buildctl, rootlesskit) at /mnt/buildkit.
# The layout of moby/buildkit:<version>-rootless, which the build Job is rendered for:
# user `user` 1000:1000, subordinate ids 100000-165535, BuildKit's state under
# /home/user/.local/share/buildkit, the runtime dir /run/user/1000.
set -eu
install -m 0755 /mnt/buildkit/buildkitd /mnt/buildkit/buildctl /mnt/buildkit/rootlesskit /usr/bin/
install -m 0755 /mnt/recipe/buildctl-daemonless.sh /usr/bin/buildctl-daemonless.sh
groupadd --gid 1000 user
useradd --uid 1000 --gid 1000 --create-home --shell /bin/sh user
echo "user:100000:65536" > /etc/subuid
echo "user:100000:65536" > /etc/subgid
install -d -o 1000 -g 1000 -m 0700 /run/user/1000
install -d -o 1000 -g 1000 /home/user/.local/share/buildkit /home/user/.config/buildkit
# newuidmap/newgidmap with file capabilities instead of Debian's setuid bit. Setuid, they
# write uid_map as euid 0, which the kernel accepts only with CAP_SYS_ADMIN over the new
# namespace (a container has none); with cap_setuid/cap_setgid they keep the caller's
# uid, the namespace's owner, and need only the capability a pod has by default. Found
# running the build Job on the node: "newuidmap: write to uid_map failed: Operation not
# permitted".
chmod 0755 /usr/bin/newuidmap /usr/bin/newgidmap
setcap cap_setuid=ep /usr/bin/newuidmap
setcap cap_setgid=ep /usr/bin/newgidmap
