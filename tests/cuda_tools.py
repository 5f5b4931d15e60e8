"""Where the CUDA tools the tests use live: the real nvcc, and cuobjdump from PyPI's nvidia-cuda-cuobjdump."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

REAL_CUDA = Path("/usr/local/cuda")


def nvcc() -> str:
    found = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(found).exists():
        pytest.skip("nvcc is not installed (expected /usr/local/cuda/bin/nvcc)")
    return found


def cuobjdump() -> str:
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec else []
    found = [path for root in roots for path in Path(root).glob("*/bin/cuobjdump")]
    if not found:
        pytest.skip("cuobjdump is not installed: pip install nvidia-cuda-cuobjdump")
    return str(found[0])


def counting_cuda_home(directory: Path, calls: Path) -> Path:
    """A CUDA_HOME whose nvcc logs every invocation and then runs the real one."""
    home = directory / "cuda"
    (home / "bin").mkdir(parents=True)
    for entry in REAL_CUDA.resolve().iterdir():
        if entry.name != "bin":
            (home / entry.name).symlink_to(entry)
    for tool in (REAL_CUDA / "bin").iterdir():
        if tool.name != "nvcc":
            (home / "bin" / tool.name).symlink_to(tool.resolve())
    wrapper = home / "bin" / "nvcc"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {REAL_CUDA.resolve()}/bin/nvcc "$@"\n')
    wrapper.chmod(0o755)
    return home
