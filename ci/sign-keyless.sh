#!/usr/bin/env bash
# The keyless route of signing, beside carry's key route: cosign (installed by the workflow) signs the image this
# runner pushed with the runner's OIDC identity (a short-lived Fulcio certificate, logged in Rekor) and attests its
# SBOM from dist/ (written by `image --push`). Check it with `cosign verify --certificate-identity ...
# --certificate-oidc-issuer https://token.actions.githubusercontent.com`; carry's `verify --key` says that a key
# cannot check a keyless signature. Usage: ci/sign-keyless.sh PLATFORM (the VERSION-ARCH image), or `index` (the
# VERSION tag). Registry credentials: CARRY_REGISTRY_USER / CARRY_REGISTRY_PASSWORD, handed to cosign on stdin.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/lib.sh
source ci/lib.sh

config="${CARRY_CONFIG:-build.yaml}"
what="${1:?usage: ci/sign-keyless.sh PLATFORM|index}"
command -v cosign >/dev/null || { echo "ci: cosign is not installed (sigstore/cosign-installer)" >&2; exit 2; }
: "${CARRY_REGISTRY_USER:?set CARRY_REGISTRY_USER}"
: "${CARRY_REGISTRY_PASSWORD:?set CARRY_REGISTRY_PASSWORD}"
name="$(python ci/carry_query.py image.name --config "$config")"
version="$(python build.py --config "$config" version)"
registry="${name%%/*}"
printf '%s' "$CARRY_REGISTRY_PASSWORD" | cosign login "$registry" --username "$CARRY_REGISTRY_USER" --password-stdin

if [ "$what" = index ]; then
    ref="$name:$version"
else
    ref="$name:$version-$(arch_tag "$what")"
fi
# cosign names the signature tag of what `ref` points at: NAME:sha256-<hex>.sig; sign by digest, not by tag.
hex="$(cosign triangulate "$ref")"
hex="${hex##*:sha256-}"
hex="${hex%.sig}"
cosign sign --yes "$name@sha256:$hex"
if [ "$what" != index ]; then
    for sbom in dist/*-"$version"-linux-"$(arch_tag "$what")".cdx.json; do
        [ -f "$sbom" ] || continue
        cosign attest --yes --type cyclonedx --predicate "$sbom" "$name@sha256:$hex"
    done
fi
