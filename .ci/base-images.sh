#!/usr/bin/env bash
# Build the two local base images the image tests build FROM, without pulling anything:
#   carry-test/runtime-base:<tag>  Debian bookworm with python3 and venv (and apt), from mmdebstrap
#   carry-test/build-base:<tag>    the runtime base plus python3-pip/-dev, gcc, g++, git, ccache
#                                  and a CUDA 13 compiler subset copied from the host,
#                                  at /usr/local/cuda with CUDA_HOME set
# Packages come from the Debian mirror over plain HTTP. <tag> hashes this script and the
# host's nvcc version: images that exist are reused, a changed recipe gets a new tag.
# Run after services.sh; records the image names in the same env file.
#
# Overridable: CARRY_CI_DIR, CARRY_CI_ENV, CARRY_CI_DEBIAN_MIRROR, CARRY_CI_CUDA_SRC.
set -euo pipefail

# shellcheck source=env-file.sh
source "$(dirname "${BASH_SOURCE[0]}")/env-file.sh"
MIRROR=${CARRY_CI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CUDA_SRC=${CARRY_CI_CUDA_SRC:-/usr/local/cuda-13.0}
CUDA_DEST=/usr/local/cuda-13.0
SUITE=bookworm
DOCKER=/usr/bin/docker
RUNTIME_PACKAGES="python3 python3-venv"
BUILD_PACKAGES="python3-venv python3-pip python3-dev gcc g++ git ccache"
IMAGE_PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CUDA_FILES=(
    bin/nvcc bin/nvcc.profile bin/cudafe++ bin/ptxas bin/fatbinary bin/nvlink bin/bin2c bin/crt
    nvvm/bin nvvm/libdevice include
    lib/libcudart_static.a lib/libcudadevrt.a lib/libculibos.a
    lib64 targets
)

log() { printf 'base-images: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

recipe_tag() {
    { cat "${BASH_SOURCE[0]}"; "$CUDA_SRC/bin/nvcc" --version; } | sha256sum | cut -c1-12
}

image_exists() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# build_runtime_base IMAGE: a bookworm root with python3 from mmdebstrap, imported as IMAGE.
# Docs, man pages and translations are left out (the dpkg setting stays in the image).
build_runtime_base() {
    mmdebstrap --quiet --variant=apt --include="$RUNTIME_PACKAGES" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        "$SUITE" - "$MIRROR" \
        | "$DOCKER" import --change "ENV PATH=$IMAGE_PATH" --change 'CMD ["/bin/bash"]' - "$1" >/dev/null
}

# build_build_base IMAGE RUNTIME_IMAGE: the runtime base plus compilers and the CUDA subset.
build_build_base() {
    local context=$CI_DIR/build-base-context
    rm -rf "$context"
    mkdir -p "$context/cuda"
    tar -C "$CUDA_SRC" -cf - "${CUDA_FILES[@]}" | tar -C "$context/cuda" -xf -
    DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain --tag "$1" -f - "$context" <<EOF
FROM $2
RUN apt-get update \\
 && apt-get install -y --no-install-recommends $BUILD_PACKAGES \\
 && rm -rf /var/lib/apt/lists/*
COPY cuda $CUDA_DEST
RUN ln -s $(basename "$CUDA_DEST") /usr/local/cuda
ENV CUDA_HOME=/usr/local/cuda
EOF
    rm -rf "$context"
}

# check_nvcc_offline IMAGE: compile and link a kernel for sm_121 with networking off.
check_nvcc_offline() {
    # shellcheck disable=SC2016 # $CUDA_HOME is the container's
    "$DOCKER" run --rm -i --network=none "$1" bash -euc '
        cat >/tmp/probe.cu
        cd /tmp
        nvcc -O2 -gencode arch=compute_121,code=sm_121 -gencode arch=compute_120,code=compute_120 \
            -o probe probe.cu
        test -x probe && test "$CUDA_HOME" = /usr/local/cuda' <<'EOF'
__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }
int main() { return 0; }
EOF
}

# build_if_missing NAME IMAGE BUILDER [ARGS...]: run BUILDER IMAGE ARGS unless IMAGE
# exists, logging to a file; a failed build leaves no image behind.
build_if_missing() {
    local name=$1 image=$2 builder=$3 started=$SECONDS
    shift 3
    if image_exists "$image"; then
        log "$image exists, skipping"
        return
    fi
    log "building $image (log: $CI_DIR/$name.log)"
    if ! "$builder" "$image" "$@" >"$CI_DIR/$name.log" 2>&1; then
        "$DOCKER" image rm --force "$image" >/dev/null 2>&1 || true
        die "building $image failed; see $CI_DIR/$name.log"
    fi
    log "built $image in $((SECONDS - started))s"
}

main() {
    [ "$(id -u)" = 0 ] || die "run as root (mmdebstrap needs it)"
    "$DOCKER" version >/dev/null 2>&1 || die "docker does not answer; run .ci/services.sh first"
    [ -x "$CUDA_SRC/bin/nvcc" ] || die "no nvcc at $CUDA_SRC/bin/nvcc; set CARRY_CI_CUDA_SRC"
    mkdir -p "$CI_DIR"
    local tag runtime_image build_image
    tag=$(recipe_tag)
    runtime_image=carry-test/runtime-base:$tag
    build_image=carry-test/build-base:$tag

    build_if_missing runtime-base "$runtime_image" build_runtime_base
    build_if_missing build-base "$build_image" build_build_base "$runtime_image"
    check_nvcc_offline "$build_image" >"$CI_DIR/nvcc-check.log" 2>&1 || {
        "$DOCKER" image rm --force "$build_image" >/dev/null 2>&1 || true
        die "nvcc in $build_image failed to compile offline; see $CI_DIR/nvcc-check.log"
    }
    log "nvcc in $build_image compiles with --network=none"

    set_env CARRY_TEST_BUILD_BASE "$build_image"
    set_env CARRY_TEST_RUNTIME_BASE "$runtime_image"
    log "wrote $ENV_FILE"
}

main "$@"
