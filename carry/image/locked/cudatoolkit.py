"""The CUDA toolkit a runtime lock ships: when the lock holds NVIDIA's pip nvcc, the wheels that make the image's
CUDA_HOME (the compiler, its front end and NVVM, the CCCL headers, the runtime's headers and libraries) must be one
CUDA release, the one torch is built for (torch pins nvidia-cuda-runtime through cuda-toolkit). A JIT that compiles
with that CUDA_HOME (FlashInfer's sampler, at vLLM's first request) otherwise stops at CCCL's "CUDA compiler and CUDA
toolkit headers are incompatible": an unpinned requirement of nvcc (vLLM 0.33.0's humming-kernels) resolves to the
newest nvcc, 13.5, beside torch's runtime 13.0.

    the lock's pins -> mismatch() (None: one release) -> constraints() for uv -> the lock resolved again
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

COMPILER = "nvidia-cuda-nvcc"  # a lock without it ships no compiler: nothing to agree
ANCHOR = "nvidia-cuda-runtime"  # what torch's CUDA is (cuda-toolkit's pin)
# What makes CUDA_HOME for nvcc: bin/nvcc (nvcc), crt/ and cudafe (crt), cicc and libdevice (nvvm), the CCCL headers
# (cccl), cuda_runtime.h and libcudart (runtime).
COMPONENTS = (COMPILER, "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl", ANCHOR)
SUFFIX_RE = re.compile(r"-cu\d+$")  # CUDA 12's wheels: nvidia-cuda-nvcc-cu12, ...


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """Toolkit components of another release than torch's runtime: the runtime's release and version, and the
    others as (name, version)."""

    release: str  # "13.0"
    anchor: tuple[str, str]  # ("nvidia-cuda-runtime", "13.0.96")
    others: tuple[tuple[str, str], ...]

    def line(self) -> str:
        named = ", ".join(f"{name} {version}" for name, version in self.others)
        return (
            f"its CUDA toolkit is not one release: {self.anchor[0]} {self.anchor[1]} (torch's CUDA {self.release}) "
            f"but {named}; a JIT compiling with this CUDA_HOME fails (CCCL: compiler and toolkit headers "
            f"incompatible)"
        )


def release(version: str) -> str:
    """The CUDA release of a component's version: its first two numbers ("13.5.37" -> "13.5")."""
    return ".".join(version.split(".")[:2])


def components(pins: Mapping[str, str]) -> dict[str, str]:
    """The toolkit's wheels among `pins` (canonical name -> version), by name as pinned."""
    return {name: version for name, version in pins.items() if SUFFIX_RE.sub("", name) in COMPONENTS}


def mismatch(pins: Mapping[str, str]) -> Mismatch | None:
    """None when the lock ships no nvcc, or every toolkit wheel is of the runtime's release; else what differs."""
    found = components(pins)
    anchor = next(((n, v) for n, v in found.items() if SUFFIX_RE.sub("", n) == ANCHOR), None)
    if anchor is None or not any(SUFFIX_RE.sub("", n) == COMPILER for n in found):
        return None
    wanted = release(anchor[1])
    others = tuple(sorted((n, v) for n, v in found.items() if release(v) != wanted))
    return Mismatch(wanted, anchor, others) if others else None


def constraints(pins: Mapping[str, str], found: Mismatch) -> list[str]:
    """uv constraints holding every toolkit wheel of the lock to the runtime's release."""
    return [f"{name}=={found.release}.*" for name in sorted(components(pins))]
