#!/usr/bin/env bash
# Install what `build.py wheel` compiles with on a bare Ubuntu runner: ccache, NVIDIA's CUDA toolkit
# ($CARRY_CUDA_PACKAGE, default cuda-toolkit-13-0, from NVIDIA's apt repository: the runner's apt sources, or the
# keyring package at $CARRY_CUDA_KEYRING_URL, which NVIDIA's CUDA installation guide names for each distro and
# CPU, `{repo}` filled in with e.g. ubuntu2404/x86_64) and, when build.build_isolation is false, the upstream's
# own build requirements at the pinned commit, through pip's configured index plus $CARRY_TORCH_INDEX_URL where
# set (the torch index of the CUDA release, as PyTorch's install page gives it). No index host is written here.
# Steps whose result is already there are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/lib.sh
source ci/lib.sh

config="${CARRY_CONFIG:-build.yaml}"  # relative to the repo root

cuda_package="${CARRY_CUDA_PACKAGE:-cuda-toolkit-13-0}"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
torch_index="${CARRY_TORCH_INDEX_URL:-}"
build_requirements="${CARRY_BUILD_REQUIREMENTS:-requirements/build.txt}"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

apt_install() {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

nvidia_repo() {
    local distro
    # shellcheck source=/dev/null
    distro="$(. /etc/os-release && printf '%s%s' "$ID" "${VERSION_ID//./}")"
    case "$(uname -m)" in
        x86_64) echo "$distro/x86_64" ;;
        aarch64) echo "$distro/sbsa" ;;
        *) echo "ci: no CUDA apt repository known for $(uname -m)" >&2; return 1 ;;
    esac
}

if ! command -v ccache >/dev/null; then
    as_root apt-get update -qq
    apt_install ccache
fi

if [ ! -x "$cuda_home/bin/nvcc" ]; then
    if [ -n "${CARRY_CUDA_KEYRING_URL:-}" ]; then
        keyring_url="${CARRY_CUDA_KEYRING_URL//\{repo\}/$(nvidia_repo)}"
        curl --fail --silent --show-error --location --retry 3 --output "$scratch/cuda-keyring.deb" "$keyring_url"
        as_root dpkg -i "$scratch/cuda-keyring.deb"
    fi
    as_root apt-get update -qq
    if ! apt-cache policy "$cuda_package" | grep -q 'Candidate: [0-9]'; then
        echo "ci: apt has no $cuda_package; add NVIDIA's CUDA apt repository or set CARRY_CUDA_KEYRING_URL" >&2
        exit 2
    fi
    apt_install "$cuda_package"
fi
"$cuda_home/bin/nvcc" --version | tail -n 1
if [ -n "${GITHUB_ENV:-}" ]; then
    echo "CUDA_HOME=$cuda_home" >>"$GITHUB_ENV"
    echo "$cuda_home/bin" >>"$GITHUB_PATH"
fi

if [ "$(python ci/carry_query.py build.build_isolation --config "$config")" = false ]; then
    python build.py --config "$config" fetch >/dev/null
    mirror="$(python ci/carry_query.py cache.mirror --config "$config")"
    commit="$(python ci/carry_query.py upstream.commit --config "$config")"
    git -C "$mirror" show "$commit:$build_requirements" >"$scratch/build-requirements.txt"
    extra=()
    if [ -n "$torch_index" ]; then extra=(--extra-index-url "$torch_index"); fi
    python -m pip install --quiet --disable-pip-version-check "${extra[@]}" -r "$scratch/build-requirements.txt"
fi
