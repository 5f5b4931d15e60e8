#!/usr/bin/env bash
# The fixed vLLM as an image people pull, made on one x86-64 runner from what the repository commits: the
# precompiled pins (build.precompiled.wheels) and the runtime lock (runtime-lock/) are the reviewed state, like a
# lock file, that a maintainer makes with `build.py pin` and `build.py lock` and commits. CI only proves they
# still hold, then builds: exactly `pin --check` (the nightly index serves those wheels, same sha256), `lock
# --check` (the lock is fresh for the fixed wheels and the runtime bases, which carry derives from NVIDIA's
# Python-less CUDA runtime images here, the arm64 one under QEMU) and `image --push` (both platforms' locked
# images, written by carry, pushed and smoke-tested; `--discard-wheels`: a hosted runner's disk holds one platform's
# locked wheels at a time). The registry is the runner's only cache: the previous VERSION's image (`latest`) records
# its layers, so a Python-only change writes one small layer, builds no wheel and pulls nothing (docs/images.md, "A
# fresh runner"). QEMU is set up first when image.platforms lists a platform
# of another CPU. The nightly index comes from $CARRY_NIGHTLY_INDEX (build.yaml names it `${CARRY_NIGHTLY_INDEX}`),
# registry credentials from CARRY_REGISTRY_USER / CARRY_REGISTRY_PASSWORD; both only through the environment.
# Signing, the key route: CARRY_SIGNING_KEY_PEM (a secret) becomes a mode-600 file named by CARRY_SIGNING_KEY, and
# `image --push` signs each pushed manifest and the index and attaches the SBOM and provenance (docs/trust.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/lib.sh
source ci/lib.sh

config="${CARRY_CONFIG:-build.yaml}"  # relative to the repo root

native="$(native_platform)"
if python ci/carry_query.py image.platforms --config "$config" | grep -qvxF -- "$native"; then
    as_root bash ci/qemu.sh
fi

signing_key_from_secret
trap 'rm -rf "${signing_dir:-}"' EXIT

python build.py --config "$config" pin --check
python build.py --config "$config" lock --check
python build.py --config "$config" image --push --discard-wheels
