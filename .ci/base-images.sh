#!/usr/bin/env bash
# Build the local base images the image tests and the demo build FROM, without pulling anything, for this
# machine's platform (amd64) and for linux/arm64 (GB10), which runs under QEMU (ci/qemu.sh first):
#   carry-test/runtime-base:<tag>        Debian bookworm with python3 and venv (and apt), from mmdebstrap
#   carry-test/build-base:<tag>          the runtime base plus python3-pip/-dev, gcc, g++, git, ccache and a
#                                        CUDA 13 compiler subset copied from the host, at /usr/local/cuda
#   carry-test/runtime-base:<tag>-arm64  the same for linux/arm64: an arm64 bookworm root (mmdebstrap
#   carry-test/build-base:<tag>-arm64    --arch=arm64) added to an empty image by a BuildKit build for that
#                                        platform; the build base's CUDA compiler is NVIDIA's aarch64 wheels
#                                        from PyPI (kept in $CI_DIR/wheelhouse-cuda-arm64)
#   carry-test/pyless-base:<tag>{,-arm64}  a minimal Debian without python3 (mmdebstrap minbase), standing in for
#                                        NVIDIA's CUDA runtime images, for both CPUs
# Each is also tagged carry-local/{build,runtime}-base:{amd64,arm64}, the names examples/demo/build.yaml uses.
# Packages come from the Debian mirror this machine's apt uses (the first `URIs:` of
# /etc/apt/sources.list.d/*.sources, else the first `deb` line of /etc/apt/sources.list and *.list, that serves
# Debian's main archive; CARRY_CI_DEBIAN_MIRROR overrides it), over plain HTTP. <tag> hashes this script and the host's nvcc
# version: images that exist are reused, a changed recipe gets a new tag. The two arm64 roots are made at
# the same time as the amd64 images (their package scripts run emulated, about 3 and 6 minutes).
# Run after services.sh; records the image names in the same env file.
#
# Overridable: CARRY_CI_DIR, CARRY_CI_ENV, CARRY_CI_DEBIAN_MIRROR, CARRY_CI_CUDA_SRC.
set -euo pipefail

# shellcheck source=env-file.sh
source "$(dirname "${BASH_SOURCE[0]}")/env-file.sh"
# The machine's own Debian mirror: the first URI of its apt sources that serves a Debian suite (not -security).
apt_mirror() {
    local file
    for file in /etc/apt/sources.list.d/*.sources; do
        [ -f "$file" ] || continue
        awk 'BEGIN { RS = ""; FS = "\n" }
             { uri = ""; suites = ""
               for (i = 1; i <= NF; i++) {
                   if ($i ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", $i); split($i, u, /[ \t]+/); uri = u[1] }
                   if ($i ~ /^Suites:/) suites = $i }
               if (uri != "" && suites !~ /-security/) { print uri; exit } }' "$file"
    done
    # Either kind of file may be missing: a missing one is no failure (set -e and pipefail are on).
    { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true; } |
        awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { if ($(i+1) !~ /-security/) print $i; next } }'
}
MIRROR=${CARRY_CI_DEBIAN_MIRROR:-$( (apt_mirror || true) | head -n 1)}
if [ -z "$MIRROR" ]; then
    echo "base-images: no Debian mirror in this machine's apt sources; set CARRY_CI_DEBIAN_MIRROR" >&2
    exit 2
fi
# mmdebstrap's roots are reproducible with a fixed SOURCE_DATE_EPOCH: the same Debian packages give the same tar,
# so the runtime images have the same layers (diff_ids), hence the same content digest, on every machine, and a
# runtime lock committed from one (examples/vllm/runtime-lock) is fresh on another (carry/image/locked/runtimebase.py).
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
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
# NVIDIA's aarch64 CUDA compiler on PyPI; together they unpack into nvidia/cu13, a CUDA_HOME.
ARM64_CUDA_WHEELS=(nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-cccl)
ARM64_WHEELHOUSE=$CI_DIR/wheelhouse-cuda-arm64

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

# The builders below run where bash ignores `set -e` (under `if`, in build_if_missing), so each step that can
# fail says `|| return 1`, and the image build is the last command: its status is the builder's.

# build_build_base IMAGE RUNTIME_IMAGE CONTEXT: the runtime base plus compilers and the CUDA subset.
build_build_base() {
    local context=$3
    mkdir -p "$context/cuda" || return 1
    tar -C "$CUDA_SRC" -cf - "${CUDA_FILES[@]}" | tar -C "$context/cuda" -xf - || return 1
    DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain --tag "$1" -f - "$context" <<EOF
FROM $2
RUN apt-get update \\
 && apt-get install -y --no-install-recommends $BUILD_PACKAGES \\
 && rm -rf /var/lib/apt/lists/*
COPY cuda $CUDA_DEST
RUN ln -s $(basename "$CUDA_DEST") /usr/local/cuda
ENV CUDA_HOME=/usr/local/cuda
EOF
}

# cuda_release: "13.0" from the host nvcc, so the aarch64 compiler is the same release.
cuda_release() { "$CUDA_SRC/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\),.*/\1/p'; }

# arm64_rootfs PACKAGES TAR: an arm64 bookworm root made with mmdebstrap (package scripts run under QEMU).
arm64_rootfs() {
    mmdebstrap --quiet --variant=apt --arch=arm64 --include="$1" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        "$SUITE" "$2" "$MIRROR"
}

# build_arm64_image IMAGE CONTEXT: an arm64 image from CONTEXT/rootfs.tar (and CONTEXT/cuda when present).
# `docker import` cannot record another architecture in Docker 20.10; a BuildKit build for the platform can.
build_arm64_image() {
    local cuda_steps=""
    [ -d "$2/cuda" ] && cuda_steps="COPY cuda $CUDA_DEST
RUN ln -s $(basename "$CUDA_DEST") /usr/local/cuda
ENV CUDA_HOME=/usr/local/cuda"
    DOCKER_BUILDKIT=1 "$DOCKER" build --platform linux/arm64 --progress=plain --tag "$1" -f - "$2" <<EOF
FROM scratch
ADD rootfs.tar /
ENV PATH=$IMAGE_PATH
$cuda_steps
CMD ["/bin/bash"]
EOF
}

build_arm64_runtime_base() {
    arm64_rootfs "${RUNTIME_PACKAGES// /,}" "$2/rootfs.tar" || return 1
    build_arm64_image "$1" "$2"
}

# build_arm64_build_base IMAGE CONTEXT: an arm64 root with the build packages, plus NVIDIA's aarch64 CUDA
# wheels (the same release as the host's nvcc) unpacked as /usr/local/cuda.
build_arm64_build_base() {
    local context=$2 release
    release=$(cuda_release)
    [ -n "$release" ] || return 1
    mkdir -p "$ARM64_WHEELHOUSE" || return 1
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform manylinux2014_aarch64 --dest "$ARM64_WHEELHOUSE" \
        "${ARM64_CUDA_WHEELS[@]/%/==$release.*}" || return 1
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-index --no-compile \
        --only-binary=:all: --platform manylinux2014_aarch64 --target "$context/site" \
        --find-links "$ARM64_WHEELHOUSE" "${ARM64_CUDA_WHEELS[@]/%/==$release.*}" || return 1
    mv "$context/site/nvidia/cu13" "$context/cuda" && ln -s lib "$context/cuda/lib64" || return 1
    arm64_rootfs "python3,${BUILD_PACKAGES// /,}" "$context/rootfs.tar" || return 1
    build_arm64_image "$1" "$context"
}

# build_pyless_base IMAGE ARCH CONTEXT: a minimal Debian without python3 (mmdebstrap minbase: apt, no Python)
# for ARCH, the stand-in for NVIDIA's CUDA runtime images, which hold none, in the tests of the runtime base carry
# derives (carry/image/locked/runtimebase.py). Like NVIDIA's it has ca-certificates (python3-venv needs them; their
# package scripts alone take minutes under QEMU, which the derivation then does not repeat). Its apt sources are
# the mirror's (plain HTTP), as the others'. Made for both CPUs the way the arm64 images are (FROM scratch, ADD).
build_pyless_base() {
    mmdebstrap --quiet --variant=minbase --arch="$2" --include=ca-certificates \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        "$SUITE" "$3/rootfs.tar" "$MIRROR" || return 1
    DOCKER_BUILDKIT=1 "$DOCKER" build --platform "linux/$2" --progress=plain --tag "$1" -f - "$3" <<EOF
FROM scratch
ADD rootfs.tar /
ENV PATH=$IMAGE_PATH
CMD ["/bin/bash"]
EOF
}

# pyless_bases IMAGE: the python-less base for both CPUs, IMAGE and IMAGE-arm64 (arm64's package scripts under
# QEMU, beside amd64), each checked to hold no python3.
pyless_bases() {
    local image=$1 arm64 ref
    build_if_missing pyless-base-arm64 "$image-arm64" build_pyless_base arm64 &
    arm64=$!
    build_if_missing pyless-base "$image" build_pyless_base amd64
    wait "$arm64" || die "the arm64 python-less base failed"
    for ref in "$image" "$image-arm64"; do
        if "$DOCKER" run --rm --network=none "$ref" sh -c 'command -v python3' >/dev/null 2>&1; then
            die "$ref holds a python3"
        fi
    done
}

# check_nvcc_offline IMAGE PLATFORM: compile and link a kernel for sm_121 with networking off, as PLATFORM.
check_nvcc_offline() {
    # shellcheck disable=SC2016 # $CUDA_HOME is the container's
    "$DOCKER" run --rm -i --network=none --platform "$2" "$1" bash -euc '
        cat >/tmp/probe.cu
        cd /tmp
        nvcc -O2 -gencode arch=compute_121,code=sm_121 -gencode arch=compute_120,code=compute_120 \
            -o probe probe.cu
        test -x probe && test "$CUDA_HOME" = /usr/local/cuda
        echo "nvcc compiles on $(uname -m)"' <<'EOF'
__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }
int main() { return 0; }
EOF
}

# checked_build_base IMAGE PLATFORM: remove IMAGE and fail when its nvcc does not compile offline.
checked_build_base() {
    local log_file=$CI_DIR/nvcc-check-${2#*/}.log
    check_nvcc_offline "$1" "$2" >"$log_file" 2>&1 || {
        "$DOCKER" image rm --force "$1" >/dev/null 2>&1 || true
        die "nvcc in $1 failed to compile offline; see $log_file"
    }
    log "nvcc in $1 compiles with --network=none ($(tail -n 1 "$log_file"))"
}

# build_if_missing NAME IMAGE BUILDER [ARGS...]: run BUILDER IMAGE ARGS... CONTEXT unless IMAGE exists, with a
# fresh, private CONTEXT dir, logging to a file; a failed build leaves no image behind.
build_if_missing() {
    local name=$1 image=$2 builder=$3 started=$SECONDS context
    shift 3
    if image_exists "$image"; then
        log "$image exists, skipping"
        return
    fi
    log "building $image (log: $CI_DIR/$name.log)"
    context=$(mktemp -d "$CI_DIR/$name-context.XXXXXX")
    if ! "$builder" "$image" "$@" "$context" >"$CI_DIR/$name.log" 2>&1 || ! image_exists "$image"; then
        rm -rf "$context"
        "$DOCKER" image rm --force "$image" >/dev/null 2>&1 || true
        die "building $image failed; see $CI_DIR/$name.log"
    fi
    rm -rf "$context"
    log "built $image in $((SECONDS - started))s"
}

main() {
    [ "$(id -u)" = 0 ] || die "run as root (mmdebstrap needs it)"
    "$DOCKER" version >/dev/null 2>&1 || die "docker does not answer; run .ci/services.sh first"
    [ -x "$CUDA_SRC/bin/nvcc" ] || die "no nvcc at $CUDA_SRC/bin/nvcc; set CARRY_CI_CUDA_SRC"
    mkdir -p "$CI_DIR"
    grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null \
        || die "this machine cannot run arm64 programs; run ci/qemu.sh first"
    local tag runtime_image build_image arm64_runtime arm64_build pyless_image pyless
    # The arm64 builds run in the background: stop them too when this script fails.
    trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
    tag=$(recipe_tag)
    runtime_image=carry-test/runtime-base:$tag
    build_image=carry-test/build-base:$tag
    pyless_image=carry-test/pyless-base:$tag

    # The arm64 roots take minutes of emulated package scripts: start them first, beside the amd64 work.
    build_if_missing runtime-base-arm64 "$runtime_image-arm64" build_arm64_runtime_base &
    arm64_runtime=$!
    build_if_missing build-base-arm64 "$build_image-arm64" build_arm64_build_base &
    arm64_build=$!
    build_if_missing runtime-base "$runtime_image" build_runtime_base
    build_if_missing build-base "$build_image" build_build_base "$runtime_image"
    checked_build_base "$build_image" linux/amd64
    pyless_bases "$pyless_image" &
    pyless=$!
    wait "$arm64_runtime" || die "the arm64 runtime base failed"
    wait "$arm64_build" || die "the arm64 build base failed"
    checked_build_base "$build_image-arm64" linux/arm64
    wait "$pyless" || die "the python-less bases failed"

    "$DOCKER" tag "$build_image" carry-local/build-base:amd64
    "$DOCKER" tag "$runtime_image" carry-local/runtime-base:amd64
    "$DOCKER" tag "$build_image-arm64" carry-local/build-base:arm64
    "$DOCKER" tag "$runtime_image-arm64" carry-local/runtime-base:arm64
    set_env CARRY_TEST_BUILD_BASE "$build_image"
    set_env CARRY_TEST_RUNTIME_BASE "$runtime_image"
    set_env CARRY_TEST_BUILD_BASE_ARM64 "$build_image-arm64"
    set_env CARRY_TEST_RUNTIME_BASE_ARM64 "$runtime_image-arm64"
    set_env CARRY_TEST_PYLESS_BASE "$pyless_image"
    set_env CARRY_TEST_PYLESS_BASE_ARM64 "$pyless_image-arm64"
    log "wrote $ENV_FILE"
}

main "$@"
