#!/usr/bin/env bash
# The fixed vLLM wheel on real vLLM 0.33.0, end to end, after `bash ci/setup.sh` (no Docker needed): make the
# upstream history from PyPI's sdists, check the series, build the x86_64 wheel and, on this same machine without
# emulating anything, the aarch64 (GB10 / DGX Spark) wheel, both from vLLM's own released wheels (precompiled
# mode); verify and gate both. About 2 minutes cold on 2 cores (the build environment, 5 GB, comes from uv's
# cache after the first time), under a second again.
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

cat <<DONE

vllm example: done; VERSION $(carry version)
  wheel (x86_64)          $wheel
  wheel (GB10, aarch64)   $arm64_wheel
  gate reports            $wheel.gate.txt, $arm64_wheel.gate.txt
DONE
