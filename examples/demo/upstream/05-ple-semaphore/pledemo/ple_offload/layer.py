"""A PLE layer whose lookups run on the CPU, and the GPU flag it waits on.

Hand-off for one step, per layer (every flag operation is queued on a CUDA
stream with cuStreamWaitValue32 / cuStreamWriteValue32; the host never
blocks on a flag):

    CPU worker (its copy stream)          model (model stream)
    wait_reset()    flag == RESET          ...
    gather rows into pinned memory         ...
    copy rows into the output buffer       wait_done()   flag == DONE
    signal()        flag = DONE            read the output buffer
                                           reset() after the forward   flag = RESET
"""

from pledemo.ple_offload.cuda import DeviceArray, Stream, ops


class CpuGpuSemaphore:
    """A one-word flag in device memory shared by the CPU worker's stream and the model stream."""

    RESET_VALUE = 0
    DONE_VALUE = 1

    def __init__(self) -> None:
        self._flag = ops().device_alloc(4)

    @property
    def address(self) -> int:
        """Device address of the int32 flag."""
        return self._flag

    def reset(self, stream: Stream) -> None:
        """Queue flag = RESET on `stream`: the output was consumed, the worker may write the next."""
        ops().stream_write_value32(stream.handle, self._flag, self.RESET_VALUE)

    def signal(self, stream: Stream) -> None:
        """Queue flag = DONE on `stream`: the output is written, the model may read it."""
        ops().stream_write_value32(stream.handle, self._flag, self.DONE_VALUE)

    def wait_reset(self, stream: Stream) -> None:
        """Make `stream` wait until the flag reads RESET."""
        ops().stream_wait_value32(stream.handle, self._flag, self.RESET_VALUE)

    def wait_done(self, stream: Stream) -> None:
        """Make `stream` wait until the flag reads DONE."""
        ops().stream_wait_value32(stream.handle, self._flag, self.DONE_VALUE)

    def close(self) -> None:
        if self._flag:
            ops().device_free(self._flag)
            self._flag = 0


class PleOffloadLayer:
    """The model-side placeholder of one offloaded PLE table: an output buffer and its semaphore."""

    def __init__(self, name: str, dim: int, max_tokens: int) -> None:
        self.name = name
        self.dim = dim
        self.max_tokens = max_tokens
        self.output = DeviceArray(max_tokens * dim)
        self.sem = CpuGpuSemaphore()

    def forward(self, num_tokens: int, stream: Stream) -> int:
        """Queue the wait for this step's rows on `stream`; return the device address to read them at."""
        if num_tokens > self.max_tokens:
            raise ValueError(f"PLE layer {self.name}: {num_tokens} tokens, at most {self.max_tokens}")
        self.sem.wait_done(stream)
        return self.output.address

    def release_offloaded_output(self, stream: Stream) -> None:
        """Queue the flag's reset on `stream`, after the forward that read the output."""
        self.sem.reset(stream)

    def close(self) -> None:
        self.output.close()
        self.sem.close()
