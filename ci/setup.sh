#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for carry: the Python package and its test tools, ccache, and
# (for the image commands and tests) a Docker engine and a local registry started in the background, QEMU for
# the other CPU's images (arm64 on an x86-64 machine), and the local base images the demo and the image tests
# build FROM, for both platforms (nothing can be pulled here): loaded from where an earlier run on this machine
# saved them (.ci/saved-images.sh), else built (.ci/base-images.sh) and saved; and the real cosign, Debian's, for
# the tests that check carry's signatures with it (ci/cosign.sh).
# What the tests download (vLLM's real released files, and PyPI's CUDA 13 torch into uv's cache) is fetched in the
# background meanwhile, while QEMU builds the arm64 images.
# Idempotent; runs as root without stdin. Set CARRY_SETUP_SERVICES=0 to skip Docker and the registry.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

# downloads: vLLM's real released files the tests and examples/vllm use (sha256-pinned, downloaded once into the
# download store), the vLLM history made from them, pluggy's, and torch in uv's cache (vLLM's build environment
# needs it; a venv made and removed here, so the first test that builds that environment finds it warm)
downloads() {
    python3 examples/vllm/fetch.py >/dev/null
    python3 examples/vllm/make_upstream.py >/dev/null
    # pluggy's 1.5.0 and 1.6.0 sdists and the history made from them: README's "Carry your own patch", run as a test
    python3 examples/pluggy/make_upstream.py >/dev/null
    local venv
    venv=$(mktemp -d /tmp/carry-setup-torch.XXXXXX)
    python3 -m uv venv --no-config --quiet --python "$(command -v python3)" "$venv/venv" \
        && python3 -m uv pip install --no-config --quiet --python "$venv/venv/bin/python" torch==2.14.0
    local status=$?
    rm -rf "$venv"
    return "$status"
}
log_dir=${CARRY_CI_DIR:-/tmp/carry-ci}
mkdir -p "$log_dir"
downloads >"$log_dir/downloads.log" 2>&1 &
downloading=$!
trap 'kill "$downloading" 2>/dev/null || true' EXIT

if [ "${CARRY_SETUP_SERVICES:-1}" = 1 ]; then
    bash .ci/services.sh
    bash ci/cosign.sh
    bash ci/qemu.sh
    bash .ci/saved-images.sh load
    bash .ci/base-images.sh
    bash .ci/saved-images.sh save
elif ! command -v ccache >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ccache >/dev/null
fi
wait "$downloading" || {
    echo "setup: downloading what the tests need failed; see $log_dir/downloads.log" >&2
    tail -n 20 "$log_dir/downloads.log" >&2
    exit 1
}
trap - EXIT
