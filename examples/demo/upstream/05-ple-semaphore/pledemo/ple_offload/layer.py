"""A PLE layer whose lookups run elsewhere, and the flag it waits on.

Hand-off for one step, per layer:

    CPU worker                          model (GPU stream)
    wait_reset()  flag == RESET         ...
    write output, signal()  flag = 1    wait for DONE, read output
                                        reset() after the step  flag = 0
"""

import threading
from array import array


class CpuGpuSemaphore:
    """A one-word flag shared by the CPU worker and the model.

    The real flag is an int32 in GPU memory written with stream memory
    operations; this stand-in keeps the same protocol in host memory.
    """

    RESET_VALUE = 0
    DONE_VALUE = 1

    def __init__(self) -> None:
        self._value = self.RESET_VALUE
        self._changed = threading.Condition()

    @property
    def value(self) -> int:
        return self._value

    def reset(self) -> None:
        """Mark the output consumed: the worker may write the next one."""
        self._set(self.RESET_VALUE)

    def signal(self) -> None:
        """Mark the output written: the model may read it."""
        self._set(self.DONE_VALUE)

    def wait_reset(self, timeout: float | None = None) -> bool:
        """Block until the flag is RESET; False if `timeout` seconds passed first."""
        return self._wait_for(self.RESET_VALUE, timeout)

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until the flag is DONE; False if `timeout` seconds passed first."""
        return self._wait_for(self.DONE_VALUE, timeout)

    def _set(self, value: int) -> None:
        with self._changed:
            self._value = value
            self._changed.notify_all()

    def _wait_for(self, value: int, timeout: float | None) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._value == value, timeout)


class PleOffloadLayer:
    """The model-side placeholder of one offloaded PLE table."""

    def __init__(self, name: str, dim: int) -> None:
        self.name = name
        self.dim = dim
        self.sem = CpuGpuSemaphore()
        self.output = array("f")

    def write_output(self, rows: array) -> None:
        """Called by the CPU worker: publish this step's rows."""
        self.output = rows
        self.sem.signal()

    def forward(self, num_tokens: int, timeout: float | None = None) -> array:
        """Wait for this step's rows and return them."""
        if not self.sem.wait_done(timeout):
            raise TimeoutError(f"PLE layer {self.name}: no output after {timeout} s")
        return self.output[: num_tokens * self.dim]
