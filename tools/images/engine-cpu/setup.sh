#!/bin/sh
# Runs inside the image's root (tools/images/build.sh): this folder at /mnt/recipe, the
# wheelhouse at /mnt/wheels (read-write; network only to fill it), the machine's CA
# certificates at /mnt/host-certs.
set -eu
# The engine's user (k3infra/podsecurity.py ENGINE_UID).
groupadd --gid 1000 vllm
useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin vllm
python3 -m venv /opt/vllm
# The lock's files, by the image's own pip for its own python, into the cached
# wheelhouse (once per lock: tools/images/build.sh marks it complete after a build).
if [ ! -f /mnt/wheels/.complete ]; then
  /opt/vllm/bin/pip download --no-cache-dir --disable-pip-version-check --no-deps \
    --cert /mnt/host-certs/ca-certificates.crt \
    --require-hashes --only-binary=:all: -r /mnt/recipe/requirements.lock -d /mnt/wheels
fi
# Byte-compiled here: the root file system is read-only at run time.
/opt/vllm/bin/pip install --no-cache-dir --disable-pip-version-check --no-index \
  --find-links /mnt/wheels --no-deps --require-hashes -r /mnt/recipe/requirements.lock
/opt/vllm/bin/python /mnt/recipe/vllm_alias.py
/opt/vllm/bin/python -c 'import vllm, huggingface_hub, hf_xet; print("vllm", vllm.__version__, "huggingface_hub", huggingface_hub.__version__)'
# The venv's own pip stays (a pip check or a debug session needs it), caches do not.
rm -rf /root/.cache
