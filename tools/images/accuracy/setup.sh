#!/bin/sh
# Runs inside the image's root (tools/images/build.sh): this folder at /mnt/recipe, the
# wheelhouse at /mnt/wheels (read-write; network only to fill it), the machine's CA
# certificates at /mnt/host-certs.
set -eu
# The Job's user (k3infra/podsecurity.py ENGINE_UID, like the engine image).
groupadd --gid 1000 lmeval
useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin lmeval
python3 -m venv /opt/lm-eval
# The lock's files (wheels, and the sources of three pure-Python packages), by the
# image's own pip, into the cached wheelhouse (once per lock).
if [ ! -f /mnt/wheels/.complete ]; then
  /opt/lm-eval/bin/pip download --no-cache-dir --disable-pip-version-check --no-deps \
    --cert /mnt/host-certs/ca-certificates.crt \
    --require-hashes -r /mnt/recipe/requirements.lock -d /mnt/wheels
fi
# Offline: the sources build against the wheelhouse's setuptools and wheel.
/opt/lm-eval/bin/pip install --no-cache-dir --disable-pip-version-check --no-index \
  --find-links /mnt/wheels --no-deps --require-hashes -r /mnt/recipe/requirements.lock
# The tasks' datasets: generated stand-ins (no Hub here) in the cache image.conf names
# with HF_DATASETS_CACHE (the Job sets HOME=/tmp, so the home's default cache is empty).
mkdir -p /opt/hf-datasets
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=/tmp/hf HF_DATASETS_CACHE=/opt/hf-datasets \
  /opt/lm-eval/bin/python /mnt/recipe/stand_in_datasets.py /opt/hf-datasets
rm -f /opt/hf-datasets/*.lock
/opt/lm-eval/bin/python -c 'import importlib.metadata as m; print("lm_eval", m.version("lm_eval"), "datasets", m.version("datasets"))'
rm -rf /root/.cache
