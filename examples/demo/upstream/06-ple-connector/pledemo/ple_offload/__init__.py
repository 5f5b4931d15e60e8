"""CPU offload of per-layer embeddings (PLE).

A PLE table is large and read a few rows per token, so it can live in host
memory: a CPU worker gathers the rows and copies them to the GPU layer's
output buffer, and the model stream waits on a flag in device memory until
they are there. The connector sits in the model runner and sends the worker
one request per real step; `python -m pledemo.ple_offload.repro` checks the
hand-off on a GPU.
"""

from pledemo.ple_offload.connector import PleOffloadConnector
from pledemo.ple_offload.layer import CpuGpuSemaphore, PleOffloadLayer
from pledemo.ple_offload.worker import PleCpuWorker

__all__ = ["CpuGpuSemaphore", "PleCpuWorker", "PleOffloadConnector", "PleOffloadLayer"]
