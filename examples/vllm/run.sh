#!/usr/bin/env bash
# The fixed vLLM wheel on real vLLM 0.33.0, end to end, after `bash ci/setup.sh` (no Docker needed): make the
# upstream history from PyPI's sdists, check the series, build the x86_64 wheel and, on this same machine without
# emulating anything, the aarch64 (GB10 / DGX Spark) wheel, both from vLLM's own released wheels (precompiled
# mode); verify and gate both. About 2 minutes cold on 2 cores (the build environment, 5 GB, comes from uv's
# cache after the first time), under a second again. Then the image of both platforms, from the runtime lock
# (runtime-lock/): carry writes its layers itself, nothing emulated, pushes them to the registry ci/setup.sh
# started under VERSION (one multi-platform tag) and smoke-tests each platform's image pulled back: linux/amd64
# imports vllm, linux/arm64 (QEMU) runs a stdlib check (the version, the patched files' bytes, the scripts'
# interpreter); each stays in the engine as <image.name>:<VERSION>-<arch> (about 9.5 GB each); then `verify` proves each platform's files against the lock, natively. The lock is refreshed
# first when this machine's runtime bases are not the ones it names.
set -euo pipefail
cd "$(dirname "$0")/../.."

config=examples/vllm/build.yaml
python3 examples/vllm/make_upstream.py >/dev/null
carry() { python3 build.py --config "$config" "$@"; }
carry check
wheel=$(carry wheel | tail -n 1)
carry verify "$wheel" | tail -n 1
carry gate "$wheel" | head -n 2
arm64_wheel=$(carry wheel --platform linux/arm64 | tail -n 1)
carry verify "$arm64_wheel" | tail -n 1
carry gate "$arm64_wheel" | head -n 2

# The registry login from what .ci/services.sh recorded (the password from its mode-600 file, never an argument).
env_file=${CARRY_CI_ENV:-/tmp/carry-ci/env}
setting() { sed -n "s/^$1=//p" "$env_file" | tail -n 1; }
export CARRY_REGISTRY_USER CARRY_REGISTRY_PASSWORD
CARRY_REGISTRY_USER=$(setting CARRY_TEST_REGISTRY_USER)
CARRY_REGISTRY_PASSWORD=$(cat "$(setting CARRY_TEST_REGISTRY_PASSWORD_FILE)")
carry lock --check >/dev/null 2>&1 || carry lock >/dev/null
image_lines=$(carry image --push)
echo "$image_lines" | tail -n 6
# verify IMAGE reads each platform's layers from the registry on this machine (nothing emulated, no pull) and
# proves them against the lock, every RECORD and the fixed wheel in dist/.
image_ref=$(echo "$image_lines" | tail -n 1 | cut -d' ' -f1)
for platform in linux/amd64 linux/arm64; do
    carry verify "$image_ref" --platform "$platform" | tail -n 1
done

cat <<DONE

vllm example: done; VERSION $(carry version)
  wheel (x86_64)          $wheel
  wheel (GB10, aarch64)   $arm64_wheel
  gate reports            $wheel.gate.txt, $arm64_wheel.gate.txt
  image (both platforms)  $image_ref (verified per platform)
DONE
