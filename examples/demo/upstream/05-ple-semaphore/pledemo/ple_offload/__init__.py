"""CPU offload of per-layer embeddings (PLE).

A PLE table is large and read a few rows per token, so it can live in host
memory: a CPU worker gathers the rows and copies them to the GPU layer's
output buffer, and the model stream waits on a flag in device memory until
they are there.
"""

from pledemo.ple_offload.layer import CpuGpuSemaphore, PleOffloadLayer

__all__ = ["CpuGpuSemaphore", "PleOffloadLayer"]
