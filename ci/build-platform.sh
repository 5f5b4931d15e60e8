#!/usr/bin/env bash
# Build the wheel and the image for one platform on a machine of that CPU (no emulation: a vLLM build takes
# 30-90 minutes natively, many times that under QEMU): build and verify the wheel, build and push the image, then
# verify it. With several platforms in image.platforms carry pushes this one as <VERSION>-<arch> only and leaves the
# shared tags to publish-manifest.sh, which joins every platform under them. Registry credentials come from
# CARRY_REGISTRY_USER / CARRY_REGISTRY_PASSWORD in the environment (carry hands the password to
# `docker login --password-stdin`). CARRY_PUSH=0 builds and verifies without pushing. Signing, the key route:
# CARRY_SIGNING_KEY_PEM (the private key, a secret) and CARRY_SIGNING_KEY_PASSWORD: `image --push` signs each
# pushed manifest and attaches its SBOM and provenance; verify checks them with signing/carry.pub when the
# repository holds it. The keyless route is sign-keyless.sh (cosign with the runner's OIDC identity).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/lib.sh
source ci/lib.sh

config="${CARRY_CONFIG:-build.yaml}"  # relative to the repo root

platform="${1:?usage: ci/build-platform.sh PLATFORM, e.g. linux/arm64}"
if ! python ci/carry_query.py image.platforms --config "$config" | grep -qxF -- "$platform"; then
    echo "ci: $platform is not in image.platforms of build.yaml" >&2
    exit 2
fi
native="$(native_platform)"
if [ "$platform" != "$native" ]; then
    echo "ci: this machine builds $native natively, not $platform; run on a $platform runner" >&2
    exit 2
fi

arch="$(arch_tag "$platform")"
version="$(python build.py --config "$config" version)"
name="$(python ci/carry_query.py image.name --config "$config")"

wheel="$(python build.py --config "$config" wheel --out dist | tail -n 1)"
python build.py --config "$config" verify "$wheel"

signing_key_from_secret
trap 'rm -rf "${signing_dir:-}"' EXIT
if [ "${CARRY_PUSH:-1}" = 1 ]; then
    python build.py --config "$config" image --platform "$platform" --push
else
    python build.py --config "$config" image --platform "$platform"
fi
if pub="$(verify_key)"; then
    python build.py --config "$config" verify "$name:$version-$arch" --platform "$platform" --key "$pub"
else
    python build.py --config "$config" verify "$name:$version-$arch" --platform "$platform"
fi
