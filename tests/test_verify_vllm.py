"""`verify IMAGE` on the real locked vLLM 0.33.0 image (examples/vllm, both platforms), as carry's `image --push`
writes it (the run's one cold build, tests/conftest.py `cold_vllm`, which tests/test_locked_image.py reads too):
every platform read from the registry natively and proven against its lock and the fixed wheel; linux/arm64 takes
about as long as linux/amd64 (nothing emulated). The times per platform are printed (-s) and asserted only against
each other."""

from __future__ import annotations

import time

import pytest

from helpers import carry
from lib.lockedvllm import PLATFORMS

pytestmark = [pytest.mark.slow, pytest.mark.docker]


def test_verify_proves_both_platforms_of_the_real_vllm_image(locked_vllm, cold_vllm):
    config, env, name, _ = locked_vllm
    ref = f"{name}:20261201.1"
    seconds = {}
    for platform in PLATFORMS:
        start = time.monotonic()
        result = carry("--config", str(config), "verify", ref, "--platform", platform, env=env, timeout=1200)
        seconds[platform] = time.monotonic() - start
        assert result.code == 0, result.out[-6000:] + result.err[-2000:]
        out = result.out
        assert f"platform {platform}: read natively from registry" in out
        assert "distribution(s) = the lock's" in out and "each matching its RECORD" in out
        assert "fixed wheel: vllm-0.33.0+carry.20261201.1-" in out and "nothing else under vllm" in out
        assert "arch gate passed" in out and out.strip().endswith("verified")
        # what carry adds to CUDA_HOME beside the wheels, each checked (the stub against the image's own cuda.h)
        assert "CUDA_HOME's toolkit layout, carry's: nvidia/cu13/lib64, nvidia/cu13/lib/libcudart.so, " in out, out
        print(f"\nverify {platform}: {seconds[platform]:.1f} s\n" + "\n".join(out.splitlines()[:8]))
    assert seconds["linux/arm64"] <= 1.5 * seconds["linux/amd64"] + 10, seconds
