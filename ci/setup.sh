#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for carry: the Python package and its test tools, ccache, and
# (for the image commands and tests) a Docker engine and a local registry started in the background, QEMU for
# the other CPU's images (arm64 on an x86-64 machine), and the local base images the demo and the image tests
# build FROM, for both platforms (nothing can be pulled here).
# Idempotent; runs as root without stdin. Set CARRY_SETUP_SERVICES=0 to skip Docker and the registry.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
# vLLM's real released files the tests and examples/vllm use (sha256-pinned, downloaded once into the download
# store), and the vLLM history made from them.
python3 examples/vllm/fetch.py >/dev/null
python3 examples/vllm/make_upstream.py >/dev/null
# pluggy's 1.5.0 and 1.6.0 sdists and the history made from them: README's "Carry your own patch", run as a test.
python3 examples/pluggy/make_upstream.py >/dev/null
if [ "${CARRY_SETUP_SERVICES:-1}" = 1 ]; then
    bash .ci/services.sh
    bash ci/qemu.sh
    bash .ci/base-images.sh
elif ! command -v ccache >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ccache >/dev/null
fi
