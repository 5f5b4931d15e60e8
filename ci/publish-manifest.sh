#!/usr/bin/env bash
# After each platform's runner pushed its own image (<VERSION>-<arch>, ci/build-platform.sh): make every shared tag
# (VERSION, VERSION-cuXYZ, latest, ...) a manifest list of those images with `build.py manifest`, which first checks
# that each platform's image is in the registry and afterwards reads every list back; then verify each platform of
# the VERSION tag, the other CPU's under QEMU (ci/qemu.sh). Credentials: CARRY_REGISTRY_USER /
# CARRY_REGISTRY_PASSWORD, which carry hands to `docker login --password-stdin` in a throwaway DOCKER_CONFIG.
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
python build.py --config "$config" manifest
python build.py --config "$config" verify "$name:$version"
