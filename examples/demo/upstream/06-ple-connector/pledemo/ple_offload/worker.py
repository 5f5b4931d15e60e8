"""The CPU worker: gathers PLE rows from host-memory tables and copies them to the GPU layers."""

import dataclasses
import queue
from array import array
from collections.abc import Iterable, Mapping

from pledemo import reference
from pledemo.ple_offload.cuda import PinnedArray, Stream
from pledemo.ple_offload.layer import PleOffloadLayer


@dataclasses.dataclass
class _Target:
    """One layer's destination: its own copy stream and pinned staging buffer."""

    layer: PleOffloadLayer
    table: array
    stream: Stream
    staging: PinnedArray


class PleCpuWorker:
    """Serve connector requests by filling every layer's output buffer."""

    def __init__(
        self, tables: Mapping[str, array], layers: Iterable[PleOffloadLayer]
    ) -> None:
        layers = list(layers)
        missing = sorted({layer.name for layer in layers} - set(tables))
        if missing:
            raise ValueError(f"no PLE table for layer(s): {', '.join(missing)}")
        self._targets = [
            _Target(layer, tables[layer.name], Stream(), PinnedArray(layer.max_tokens * layer.dim))
            for layer in layers
        ]

    def serve_one(self, requests: queue.Queue, timeout: float | None = None) -> bool:
        """Take one request and publish its rows to each layer; False on the stop request (None).

        Each copy waits on its stream until the layer's flag reads RESET, so
        an output the model has not released yet is never overwritten.
        TimeoutError if the previous copy out of a staging buffer is still
        pending after `timeout` seconds.
        """
        input_ids = requests.get()
        if input_ids is None:
            return False
        for target in self._targets:
            layer = target.layer
            # The staging buffer is reused: the last copy out of it must be done.
            target.stream.synchronize(timeout)
            layer.sem.wait_reset(target.stream)
            rows = reference.ple_gather(target.table, input_ids, layer.dim)
            target.staging.items[: len(rows)] = rows
            target.staging.upload(layer.output.address, len(rows), target.stream)
            layer.sem.signal(target.stream)
        return True

    def serve(self, requests: queue.Queue, timeout: float | None = None) -> None:
        """Serve requests until the stop request (None)."""
        while self.serve_one(requests, timeout):
            pass

    def close(self, timeout: float | None = None) -> None:
        """Wait for the pending copies, then free the streams and staging buffers."""
        for target in self._targets:
            target.stream.synchronize(timeout)
            target.stream.close()
            target.staging.close()
