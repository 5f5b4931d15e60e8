#!/usr/bin/env bash
# After each platform's runner pushed its own image (<VERSION>-<arch>, ci/build-platform.sh): make every shared tag
# (VERSION, VERSION-cuXYZ, latest, ...) a manifest list of those images with `build.py manifest`, which first checks
# that each platform's image is in the registry, PUTs the list by digest (signed) and moves the tags last; then
# verify each platform of the VERSION tag, the other CPU's under QEMU (ci/qemu.sh). $CARRY_CUDA_RELEASE (default
# 13.0) is the CUDA release the platforms built with, for the {cuda} tag field. Credentials: CARRY_REGISTRY_USER /
# CARRY_REGISTRY_PASSWORD, sent in an Authorization header only (and to `docker login --password-stdin` in a throwaway
# DOCKER_CONFIG for the engine's pulls).
# With CARRY_SIGNING_KEY_PEM (the key route), `manifest` signs every list too; verify checks with
# signing/carry.pub when the repository holds it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/lib.sh
source ci/lib.sh

config="${CARRY_CONFIG:-build.yaml}"  # relative to the repo root

: "${CARRY_REGISTRY_USER:?set CARRY_REGISTRY_USER}"
: "${CARRY_REGISTRY_PASSWORD:?set CARRY_REGISTRY_PASSWORD}"
name="$(python ci/carry_query.py image.name --config "$config")"
version="$(python build.py --config "$config" version)"

as_root bash ci/qemu.sh
# The shared tags' {cuda} field is the CUDA release the platforms built with (wheel-toolchain.sh installs 13.0):
# NVIDIA's nvcc wheel tells it here without the whole toolkit.
python -m pip install --quiet --disable-pip-version-check "nvidia-cuda-nvcc==${CARRY_CUDA_RELEASE:-13.0}.*"
CUDA_HOME="$(python -c 'import glob, nvidia; print(glob.glob(nvidia.__path__[0] + "/cu*")[0])')"
export CUDA_HOME
signing_key_from_secret
trap 'rm -rf "${signing_dir:-}"' EXIT
python build.py --config "$config" manifest
if pub="$(verify_key)"; then
    python build.py --config "$config" verify "$name:$version" --key "$pub"
else
    python build.py --config "$config" verify "$name:$version"
fi
