#!/usr/bin/env bash
# Join the per-platform images that build-platform.sh pushed into multi-platform images. Every platform pushed
# the same shared tags (VERSION, latest, ...) plus its own <VERSION>-<arch>; this points each shared tag at an
# index of the <VERSION>-<arch> images, with `docker buildx imagetools create`.
#   ci/publish-manifest.sh DIR    DIR holds image-refs-<arch>.txt from each platform's build
# Logs in with CARRY_REGISTRY_USER / CARRY_REGISTRY_PASSWORD through --password-stdin, into a throwaway
# DOCKER_CONFIG that is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/lib.sh
source ci/lib.sh

config="${CARRY_CONFIG:-build.yaml}"  # relative to the repo root

refs_dir="${1:?usage: ci/publish-manifest.sh DIR (holding image-refs-<arch>.txt of every platform)}"
name="$(python ci/carry_query.py image.name --config "$config")"
registry="$(python ci/carry_query.py image.registry --config "$config")"
version="$(python build.py --config "$config" version)"

sources=()
shared=""
while IFS= read -r platform; do
    arch="$(arch_tag "$platform")"
    own="$name:$version-$arch"
    file="$refs_dir/image-refs-$arch.txt"
    if [ ! -f "$file" ]; then
        echo "ci: no $file: the $platform build did not push" >&2
        exit 1
    fi
    if ! grep -qxF -- "$own" "$file"; then
        echo "ci: $file does not list $own: it is not from this VERSION" >&2
        exit 1
    fi
    sources+=("$own")
    these="$({ grep -vxF -- "$own" "$file" || true; } | sort -u)"
    if [ -z "$shared" ]; then
        shared="$these"
    elif [ "$these" != "$shared" ]; then
        echo "ci: the platforms pushed different tags; compare the image-refs files in $refs_dir" >&2
        exit 1
    fi
done < <(python ci/carry_query.py image.platforms --config "$config")
if [ -z "$shared" ]; then
    echo "ci: the platforms pushed no shared tag; nothing to join" >&2
    exit 1
fi
mapfile -t shared_refs <<<"$shared"

: "${CARRY_REGISTRY_USER:?set CARRY_REGISTRY_USER}"
: "${CARRY_REGISTRY_PASSWORD:?set CARRY_REGISTRY_PASSWORD}"
DOCKER_CONFIG="$(mktemp -d)"
export DOCKER_CONFIG
trap 'rm -rf "$DOCKER_CONFIG"' EXIT
printf '%s' "$CARRY_REGISTRY_PASSWORD" |
    docker login "$registry" --username "$CARRY_REGISTRY_USER" --password-stdin >/dev/null

for ref in "${shared_refs[@]}"; do
    docker buildx imagetools create --tag "$ref" "${sources[@]}"
    echo "ci: $ref -> ${sources[*]}"
done
