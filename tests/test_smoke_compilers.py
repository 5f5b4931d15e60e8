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
from pathlib import Path

import pytest

import dockerenv
from carry.image.locked import cudatoolkit, smoketest
from carry.platforms import Platform

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


def test_one_release_links_as_flashinfer_does_only_with_the_toolkit_layout(tmp_path):
    """NVIDIA's wheels alone: nvcc compiles, but FlashInfer's link (-L$CUDA_HOME/lib64 -lcudart -lcuda) finds no
    libcudart.so and no driver stub, as on the H200; with the layout the nvidia layer adds (cudatoolkit.layout) it
    links, the object needing libcudart.so.13 and libcuda.so.1 (the container's driver at run time)."""
    env = dockerenv.require()
    root = Path(toolkit(tmp_path / "one", ONE_RELEASE))
    found, problems = check(env.build_base, cc=True, nvcc=True, toolkit=root)
    assert "release 13.0" in found["nvcc"]["version"], found
    assert len(problems) == 1 and "cannot find -lcudart" in problems[0] and "lib64, stubs" in problems[0], problems
    pins = dict(pin.split("==") for pin in ONE_RELEASE)
    cuda_h = (root / "nvidia/cu13/include/cuda.h").read_bytes()
    for added in cudatoolkit.layout("", pins, Platform.native(), cuda_h):
        (root / added.path).parent.mkdir(parents=True, exist_ok=True)
        (root / added.path).symlink_to(added.link) if added.link else (root / added.path).write_bytes(added.data)
    found, problems = check(env.build_base, cc=True, nvcc=True, toolkit=root)
    assert problems == [], problems
    assert {"libcudart.so.13", "libcuda.so.1"} <= set(found["nvcc"]["needed"]), found
    assert found["cc"]["version"].startswith("cc (Debian 12"), found
    text = smoketest.compilers_text(found, _Plan())
    assert "cc (cc (Debian 12" in text and "nvcc 13.0 compiled CUDA with the CCCL headers" in text, text
    assert "libcuda.so.1" in text, text


def test_the_driver_stub_defines_the_driver_api_for_each_cpu(tmp_path):
    """The stub is an ELF shared object of the platform's CPU named libcuda.so.1, defining the versioned names
    cuda.h makes code call (cuMemAlloc -> cuMemAlloc_v2, the _ptsz forms): read back with binutils' readelf."""
    header = (
        b"CUresult CUDAAPI cuInit(unsigned int Flags);\n#define cuMemAlloc cuMemAlloc_v2\n"
        b"#define cuMemcpyAsync __CUDA_API_PTSZ(cuMemcpyAsync)\n"
    )
    names = cudatoolkit.driver_api(header)
    assert names == ("cuInit", "cuMemAlloc_v2", "cuMemcpyAsync", "cuMemcpyAsync_ptsz"), names
    for platform, machine in ((Platform.LINUX_AMD64, "X86-64"), (Platform.LINUX_ARM64, "AArch64")):
        stub = tmp_path / f"libcuda-{platform.machine}.so"
        stub.write_bytes(cudatoolkit.driver_stub(platform, names))
        done = subprocess.run(["readelf", "-hd", "--dyn-syms", "-W", str(stub)], capture_output=True, text=True)
        text = done.stdout
        assert done.returncode == 0 and not done.stderr, done.stderr
        assert machine in text and "Library soname: [libcuda.so.1]" in text, text
        defined = {line.split()[-1] for line in text.splitlines() if " FUNC    GLOBAL DEFAULT " in line}
        assert defined == set(names), defined


class _Plan:
    compilers = ("cc", "nvcc")
