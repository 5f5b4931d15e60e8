"""Check the PLE hand-off on a GPU: after a dummy run, does every real step read its own rows?

    python -m pledemo.ple_offload.repro [--steps N] [--layers L] [--tokens T] [--dim D] [--timeout S]

A toy model runner drives the connector, the layers and the CPU worker the
way a serving engine does: one dummy run first (as at CUDA-graph capture),
which signals every layer without the worker, then N real steps with
distinct token ids. In each forward a kernel on the model stream copies what
every layer's wait let it read; afterwards the step compares that with the
rows of its own token ids.

Prints one JSON line (steps, stale reads, the GPU) and exits 0 when every
step read its own rows, 1 when any read someone else's, 3 when the hand-off
stalled or CUDA failed.
"""

import argparse
import json
import os
import queue
import sys
import threading
from array import array

from pledemo import reference
from pledemo.ple_offload.connector import PleOffloadConnector
from pledemo.ple_offload.cuda import DeviceArray, PinnedArray, Stream, device_info
from pledemo.ple_offload.layer import PleOffloadLayer
from pledemo.ple_offload.worker import PleCpuWorker

STALE = 1
STALLED = 3


def make_table(layer: int, rows: int, dim: int) -> array:
    """Rows that differ from every other row of every layer, exact in float32, never all zero."""
    return array("f", (1 + 1000 * layer + row + col / 1024 for row in range(rows) for col in range(dim)))


def step_ids(step: int, tokens: int, rows: int) -> array:
    """Token ids of a real step: consecutive steps share none while 2 * tokens <= rows."""
    return array("i", ((step * tokens + t) % rows for t in range(tokens)))


class ToyRunner:
    """The model side: each forward reads every PLE layer's output on the model stream."""

    def __init__(self, connector: PleOffloadConnector, layers: list[PleOffloadLayer], timeout: float):
        self.connector = connector
        self.layers = layers
        self.stream = connector.stream
        self.timeout = timeout
        self._consumed = {layer.name: DeviceArray(layer.max_tokens * layer.dim) for layer in layers}
        self._readback = {layer.name: PinnedArray(layer.max_tokens * layer.dim) for layer in layers}

    def forward(self, input_ids: array, is_dummy: bool) -> dict[str, array]:
        """Run one step; return, per layer, the rows its forward read."""
        self.connector.stage_inputs(input_ids)
        self.connector.prepare_forward(is_dummy)
        for layer in self.layers:
            count = len(input_ids) * layer.dim
            rows = layer.forward(len(input_ids), self.stream)
            self._consumed[layer.name].copy_from_(rows, count, self.stream)
            self._readback[layer.name].download(self._consumed[layer.name].address, count, self.stream)
        if not is_dummy:
            self.connector.release_outputs()
        self.stream.synchronize(self.timeout)
        return {
            layer.name: array("f", self._readback[layer.name].items[: len(input_ids) * layer.dim])
            for layer in self.layers
        }


def classify(got: array, steps_rows: list[array]) -> str:
    """What a stale read holds: the dummy run's zeros, an earlier step's rows, or something else."""
    if not any(got):
        return "dummy"
    for back, rows in enumerate(reversed(steps_rows[:-1]), start=1):
        if got == rows:
            return f"step-{back}"
    return "other"


def run(args: argparse.Namespace) -> dict:
    gpu = device_info()
    stream = Stream()
    layers = [PleOffloadLayer(f"layers.{i}.ple", args.dim, args.tokens) for i in range(args.layers)]
    tables = {layer.name: make_table(i, args.rows, args.dim) for i, layer in enumerate(layers)}
    connector = PleOffloadConnector(layers, stream)
    worker = PleCpuWorker(tables, layers)
    runner = ToyRunner(connector, layers, args.timeout)
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            worker.serve(connector.requests, args.timeout)
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    thread = threading.Thread(target=serve, name="ple-cpu-worker", daemon=True)
    thread.start()
    runner.forward(array("i", [0] * args.tokens), is_dummy=True)
    stale: dict[int, dict[str, str]] = {}
    expected_so_far: dict[str, list[array]] = {layer.name: [] for layer in layers}
    for step in range(args.steps):
        ids = step_ids(step, args.tokens, args.rows)
        read = runner.forward(ids, is_dummy=False)
        if failures:
            raise failures[0]
        for layer in layers:
            expected = reference.ple_gather(tables[layer.name], ids, args.dim)
            expected_so_far[layer.name].append(expected)
            if read[layer.name] != expected:
                stale.setdefault(step, {})[layer.name] = classify(read[layer.name], expected_so_far[layer.name])
    connector.requests.put(None)
    thread.join(args.timeout)
    worker.close(args.timeout)
    kinds: dict[str, int] = {}
    for per_layer in stale.values():
        for kind in per_layer.values():
            kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "steps": args.steps,
        "layers": args.layers,
        "reads": args.steps * args.layers,
        "stale_reads": sum(len(per_layer) for per_layer in stale.values()),
        "stale_steps": sorted(stale),
        "stale_kinds": kinds,
        "gpu": gpu,
        "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "default"),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pledemo.ple_offload.repro", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="real steps after the dummy run (default 8)")
    parser.add_argument("--layers", type=int, default=4, help="PLE layers (default 4)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per step (default 16)")
    parser.add_argument("--dim", type=int, default=64, help="PLE row width, at most 1024 (default 64)")
    parser.add_argument("--rows", type=int, default=512, help="rows per PLE table (default 512)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds any one wait may take (default 20)")
    args = parser.parse_args(argv)
    if min(args.steps, args.layers, args.tokens, args.dim) < 1 or args.dim > 1024 or args.rows < 2 * args.tokens:
        parser.error("steps, layers, tokens and dim must be positive, dim at most 1024, rows at least 2 * tokens")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def stalled(reason: str) -> None:
        print(json.dumps({"steps": args.steps, "error": reason}), flush=True)
        os._exit(STALLED)  # a worker thread may still be blocked in CUDA

    # A CUDA call that never returns (e.g. a lazily loaded kernel queued behind
    # a stream wait) is caught here; everything else times out on its own.
    watchdog = threading.Timer(args.timeout * (args.steps + 3), stalled, ["no progress: a CUDA call blocked"])
    watchdog.daemon = True
    watchdog.start()
    try:
        report = run(args)
    except (TimeoutError, RuntimeError) as error:
        stalled(f"{type(error).__name__}: {error}")
    watchdog.cancel()
    print(json.dumps(report), flush=True)
    return STALE if report["stale_reads"] else 0


if __name__ == "__main__":
    sys.exit(main())
