"""The CPU worker: gathers PLE rows from host-memory tables for each request."""

import queue
from array import array
from collections.abc import Iterable, Mapping

from pledemo import reference
from pledemo.ple_offload.layer import PleOffloadLayer


class PleCpuWorker:
    """Serve connector requests by filling every layer's output."""

    def __init__(
        self, tables: Mapping[str, array], layers: Iterable[PleOffloadLayer]
    ) -> None:
        self._layers = list(layers)
        missing = sorted({layer.name for layer in self._layers} - set(tables))
        if missing:
            raise ValueError(f"no PLE table for layer(s): {', '.join(missing)}")
        self._tables = dict(tables)

    def serve_one(self, requests: queue.Queue, timeout: float | None = None) -> None:
        """Take one request and publish its rows to each layer.

        A layer's previous output must have been released (flag RESET) before
        it is overwritten; TimeoutError if that does not happen in `timeout`.
        """
        input_ids = requests.get(timeout=timeout)
        for layer in self._layers:
            if not layer.sem.wait_reset(timeout):
                raise TimeoutError(
                    f"PLE layer {layer.name}: previous output not released after {timeout} s"
                )
            layer.write_output(
                reference.ple_gather(self._tables[layer.name], input_ids, layer.dim)
            )
