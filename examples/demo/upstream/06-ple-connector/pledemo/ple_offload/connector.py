"""The model runner's side of PLE offload: one worker request per real step."""

import queue
from array import array
from collections.abc import Iterable

from pledemo.ple_offload.cuda import Stream
from pledemo.ple_offload.layer import PleOffloadLayer
from pledemo.quant import QuantMethod, get_quant_method


class PleOffloadConnector:
    """Connect a runner's PLE layers to the CPU worker.

    Inputs are the same on every tensor-parallel rank, so only rank 0 sends
    the worker a request; the worker fills the layers of every rank. Flag
    operations are queued on `stream`, the model stream.
    """

    def __init__(
        self,
        layers: Iterable[PleOffloadLayer],
        stream: Stream,
        tp_rank: int = 0,
        quant_algo: str | None = None,
    ) -> None:
        self.stream = stream
        self.tp_rank = tp_rank
        self._layers = {layer.name: layer for layer in layers}
        self.quant_method: QuantMethod | None = (
            get_quant_method(quant_algo) if quant_algo else None
        )
        # Each forward consumes its output before the next launch, so one
        # pending request is enough; _launch() waits for the worker to take
        # the previous one.
        self.requests: queue.Queue[array | None] = queue.Queue(maxsize=1)
        self._input_ids = array("i")

    def stage_inputs(self, input_ids: Iterable[int]) -> None:
        """Remember the token ids of the next step."""
        self._input_ids = array("i", input_ids)

    def _launch(self) -> None:
        """Send the staged step to the CPU worker, from rank 0 only."""
        if self.tp_rank != 0:
            return
        self.requests.put(self._input_ids)

    def prepare_forward(self, is_dummy: bool) -> None:
        """Submit a real step, or satisfy the layers' waits for a dummy run."""
        if is_dummy:
            self.signal_dummy_outputs()
            return
        self._launch()

    def signal_dummy_outputs(self) -> None:
        """Let a dummy or capture forward pass its layers' waits without the worker."""
        for layer in self._layers.values():
            layer.output.zero_(self.stream)
            layer.sem.signal(self.stream)

    def release_outputs(self) -> None:
        """Mark every output consumed, after a real step's forward, on the model stream."""
        for layer in self._layers.values():
            layer.release_offloaded_output(self.stream)
