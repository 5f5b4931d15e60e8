"""Where the CUDA tools the tests use live: the real nvcc, and cuobjdump from PyPI's nvidia-cuda-cuobjdump."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest


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
