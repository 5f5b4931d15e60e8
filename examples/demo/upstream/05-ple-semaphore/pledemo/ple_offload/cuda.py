"""Small owners of CUDA resources for PLE offload: streams, device and pinned memory.

The extension is loaded, and its stream kernels warmed up, on first use, so
this module imports on machines without a GPU.
"""

import ctypes
import threading

_ready = threading.Lock()
_ops = None


def ops():
    """pledemo._C, initialised once: stream memory operations found, kernels loaded."""
    global _ops
    with _ready:
        if _ops is None:
            from pledemo import _C

            _C.stream_ops_init()
            _ops = _C
    return _ops


def device_info() -> dict:
    """Name, compute capability and driver CUDA version of the current GPU."""
    return ops().device_info()


class Stream:
    """A non-blocking CUDA stream."""

    def __init__(self) -> None:
        self.handle = ops().stream_create()

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait until the stream's queued work is done; TimeoutError after `timeout` seconds."""
        if not ops().stream_wait_idle(self.handle, -1.0 if timeout is None else timeout):
            raise TimeoutError(f"CUDA stream still busy after {timeout} s")

    def close(self) -> None:
        if self.handle:
            ops().stream_destroy(self.handle)
            self.handle = 0


class DeviceArray:
    """`count` float32 items in device memory, zeroed."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.address = ops().device_alloc(4 * max(count, 1))

    def zero_(self, stream: Stream) -> None:
        ops().fill_zero_async(self.address, self.count, stream.handle)

    def copy_from_(self, source_address: int, count: int, stream: Stream) -> None:
        """Queue a kernel that copies `count` floats from a device address into this array."""
        ops().copy_floats_async(self.address, source_address, count, stream.handle)

    def close(self) -> None:
        if self.address:
            ops().device_free(self.address)
            self.address = 0


class PinnedArray:
    """`count` float32 items in page-locked host memory, readable and writable from Python."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.address = ops().host_alloc(4 * max(count, 1))
        raw = (ctypes.c_char * (4 * max(count, 1))).from_address(self.address)
        self.items = memoryview(raw).cast("B").cast("f")

    def upload(self, destination: int, count: int, stream: Stream) -> None:
        """Queue a copy of the first `count` items to a device address."""
        ops().copy_async(destination, self.address, 4 * count, stream.handle)

    def download(self, source: int, count: int, stream: Stream) -> None:
        """Queue a copy of `count` items from a device address into this array."""
        ops().copy_async(self.address, source, 4 * count, stream.handle)

    def close(self) -> None:
        if self.address:
            self.items.release()
            ops().host_free(self.address)
            self.address = 0
