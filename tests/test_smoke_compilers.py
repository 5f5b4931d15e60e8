"""The locked image's run-time compilers check (carry/image/locked/smoketest.py: COMPILERS, compiler_problems), on
real images and NVIDIA's real pip CUDA wheels: what Triton does at the first GPU use (cc builds an extension against
Python.h and it is imported) and what FlashInfer's JIT does (CUDA_HOME's nvcc on CUDA code that includes the CCCL
headers). A runtime base without a compiler, and a CUDA_HOME made of vLLM 0.33.0's first lock (nvcc 13.5 beside
torch's runtime 13.0: the defect an H200 showed) each fail naming what is missing; the test build base with the
toolkit one release (13.0, torch 2.14's) passes. The examples/vllm image runs the same checks in its smoke test
(tests/test_locked_image.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import dockerenv
from carry.image.locked import smoketest

pytestmark = [pytest.mark.docker]

PRE = "import json, sys\nwant = json.loads(sys.argv[1]); out = {}\n"
# vLLM 0.33.0's first committed lock (humming-kernels' unpinned nvcc resolved to the newest) and the lock after the fix
MISMATCHED = (
    "nvidia-cuda-nvcc==13.5.37",
    "nvidia-cuda-crt==13.5.37",
    "nvidia-nvvm==13.5.37",
    "nvidia-cuda-cccl==13.3.5.0.6",
    "nvidia-cuda-runtime==13.0.96",
)
ONE_RELEASE = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cuda-runtime==13.0.96",
)


def check(image: str, cc: bool, nvcc: bool, toolkit=None) -> tuple[dict, list[str]]:
    """COMPILERS run in `image` (no network) with `toolkit` (a directory of NVIDIA's wheels) as CUDA_HOME."""
    args = [dockerenv.DOCKER_CLI, "run", "--rm", "--network=none"]
    if toolkit is not None:
        args += ["-v", f"{toolkit}:/opt/toolkit:ro", "-e", "CUDA_HOME=/opt/toolkit/nvidia/cu13"]
    args += ["--entrypoint", "python3", image, "-c", PRE + smoketest.COMPILERS, json.dumps({"cc": cc, "nvcc": nvcc})]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=dockerenv.cli_env())
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return found, smoketest.compiler_problems(found)


def toolkit(root, pins) -> str:
    """NVIDIA's pip CUDA wheels `pins` installed for this CPU into `root` by uv, as a locked venv holds them."""
    done = subprocess.run(
        [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--no-config", "--no-deps", "--target", str(root)]
        + ["--python-version", "3.11", "--only-binary", ":all:", *pins],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return str(root)


def test_a_runtime_base_without_compilers_is_named():
    env = dockerenv.require()
    found, problems = check(env.runtime_base, cc=True, nvcc=True)
    assert found["cc"]["error"] == "no C compiler (cc, gcc) on PATH", found
    assert len(problems) == 2, problems
    assert problems[0].startswith("Triton cannot build its driver: no C compiler") and "runtime_packages" in problems[0]
    assert "CUDA_HOME (not set)" in problems[1], problems


def test_a_cuda_home_of_two_releases_fails_as_flashinfer_did(tmp_path):
    env = dockerenv.require()
    found, problems = check(env.build_base, cc=True, nvcc=True, toolkit=toolkit(tmp_path / "mixed", MISMATCHED))
    assert found["cc"]["error"] == "", found  # the build base has gcc and python3-dev: Triton's part passes
    assert "release 13.5" in found["nvcc"]["version"], found
    assert len(problems) == 1, problems
    assert "CUDA compiler and CUDA toolkit headers are incompatible" in problems[0], problems


def test_one_release_compiles_and_the_extension_imports(tmp_path):
    env = dockerenv.require()
    found, problems = check(env.build_base, cc=True, nvcc=True, toolkit=toolkit(tmp_path / "one", ONE_RELEASE))
    assert problems == [], problems
    assert "release 13.0" in found["nvcc"]["version"], found
    assert found["cc"]["version"].startswith("cc (Debian 12"), found
    text = smoketest.compilers_text(found, _Plan())
    assert "cc (cc (Debian 12" in text and "nvcc 13.0 compiled CUDA with the CCCL headers" in text, text


class _Plan:
    compilers = ("cc", "nvcc")
