#!/usr/bin/env bash
# Keep the test base images where a later run on this machine finds them: each image .ci/base-images.sh builds is
# saved with `docker save | zstd` in $CARRY_CI_DIR/saved-images under its name and recipe tag (the tag
# base-images.sh computes: a hash of that script and the host's nvcc version), and loaded from there into an engine
# that lacks it. A changed recipe has a new tag: its images are built, then saved, and the files of other recipes
# are removed.
#   bash .ci/saved-images.sh load    before .ci/base-images.sh: load each saved image of this recipe the engine lacks
#   bash .ci/saved-images.sh save    after it: save each image of this recipe not saved yet
# Overridable: CARRY_CI_DIR, CARRY_CI_CUDA_SRC (as for base-images.sh).
set -euo pipefail

# shellcheck source=env-file.sh
source "$(dirname "${BASH_SOURCE[0]}")/env-file.sh"
BASE_IMAGES=$(dirname "${BASH_SOURCE[0]}")/base-images.sh
CUDA_SRC=${CARRY_CI_CUDA_SRC:-/usr/local/cuda-13.0}
SAVED_DIR=$CI_DIR/saved-images
DOCKER=/usr/bin/docker

log() { printf 'saved-images: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# recipe_tag: the tag base-images.sh gives its images (the same computation).
recipe_tag() {
    { cat "$BASE_IMAGES"; "$CUDA_SRC/bin/nvcc" --version; } | sha256sum | cut -c1-12
}

images() {
    local tag=$1
    printf '%s\n' "carry-test/runtime-base:$tag" "carry-test/build-base:$tag" \
        "carry-test/runtime-base:$tag-arm64" "carry-test/build-base:$tag-arm64"
}

image_exists() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

saved_file() {
    local name=${1#*/}
    printf '%s/%s.tar.zst' "$SAVED_DIR" "${name//:/-}"
}

load() {
    local tag=$1 image file started
    while read -r image; do
        file=$(saved_file "$image")
        image_exists "$image" && continue
        [ -s "$file" ] || continue
        started=$SECONDS
        if zstd -dcq "$file" | "$DOCKER" load --quiet >/dev/null && image_exists "$image"; then
            log "loaded $image from $file in $((SECONDS - started))s"
        else
            log "could not load $image from $file; removing it (base-images.sh builds the image)"
            rm -f "$file"
        fi
    done < <(images "$tag")
}

save() {
    local tag=$1 image file started
    mkdir -p "$SAVED_DIR"
    while read -r image; do
        file=$(saved_file "$image")
        [ -s "$file" ] && continue
        image_exists "$image" || die "$image is not in the engine; run .ci/base-images.sh first"
        started=$SECONDS
        "$DOCKER" save "$image" | zstd -q -T0 -3 -f -o "$file.tmp"
        mv "$file.tmp" "$file"
        log "saved $image to $file ($(du -h "$file" | cut -f1), $((SECONDS - started))s)"
    done < <(images "$tag")
    for file in "$SAVED_DIR"/*.tar.zst; do
        [ -e "$file" ] || continue
        case "${file##*/}" in
            *-"$tag".tar.zst | *-"$tag"-arm64.tar.zst) ;;
            *)
                log "removing $file (another recipe)"
                rm -f "$file"
                ;;
        esac
    done
}

[ "$(id -u)" = 0 ] || die "run as root (talks to the Docker engine)"
command -v zstd >/dev/null || die "zstd is not installed; run .ci/services.sh first"
"$DOCKER" version >/dev/null 2>&1 || die "docker does not answer; run .ci/services.sh first"
case "${1:-}" in
    load) load "$(recipe_tag)" ;;
    save) save "$(recipe_tag)" ;;
    *) die "usage: $0 load|save" ;;
esac
