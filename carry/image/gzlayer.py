"""A layer blob as both image paths write it: a tar stream gzip-compressed with isal chunk by chunk, its digests and
sizes counted as it goes (`compressed` -> `Written`), produced in a thread of its own (`prefetched`), and what the
compressed bytes depend on besides the tar (`gzip_key`)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Iterator

from isal import isal_zlib

CHUNK = 1 << 20
LEVEL = 1  # isal levels 0-3; 1 is igzip's fast default (bench: MB/s and ratio)
FORMAT = 2  # bump when the bytes of a layer for the same inputs change


@dataclasses.dataclass(frozen=True)
class Written:
    """A layer as written: its blob digest and size (compressed), diff_id and size uncompressed, installed bytes."""

    digest: str
    size: int
    diff_id: str
    tar_size: int
    installed: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def compressed(
    chunks: Iterable[bytes], on_done: Callable[[Written], None], installed: int = 0, level: int = LEVEL
) -> Iterator[bytes]:
    """gzip (isal) of a tar stream, chunk by chunk; `on_done` gets the digests and sizes once it is through."""
    compressor = isal_zlib.compressobj(level, isal_zlib.DEFLATED, 16 + 15)
    diff, digest = hashlib.sha256(), hashlib.sha256()
    raw_size = size = 0
    buffer = bytearray()
    for chunk in chunks:
        diff.update(chunk)
        raw_size += len(chunk)
        buffer += chunk
        if len(buffer) < CHUNK:
            continue
        # isal's output depends on how its input is split: feed it whole CHUNKs, whatever the reader yielded
        view, whole = memoryview(buffer), len(buffer) - len(buffer) % CHUNK
        for start in range(0, whole, CHUNK):
            out = compressor.compress(view[start : start + CHUNK])
            if out:
                digest.update(out)
                size += len(out)
                yield out
        view.release()
        del buffer[:whole]
    out = compressor.compress(bytes(buffer)) + compressor.flush()
    digest.update(out)
    size += len(out)
    yield out
    on_done(Written(f"sha256:{digest.hexdigest()}", size, f"sha256:{diff.hexdigest()}", raw_size, installed))


def prefetched(chunks: Iterable[bytes], depth: int = 16) -> Iterator[bytes]:
    """`chunks` produced in a thread of its own (inflating the wheels' members releases the GIL, as do isal and
    sha256 in the consumer), so reading, compressing and sending overlap on several cores."""
    import queue
    import threading

    box: queue.Queue = queue.Queue(depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for chunk in chunks:
                if stop.is_set():
                    return
                box.put(chunk)
            box.put(done)
        except BaseException as exc:  # handed to the consumer
            box.put(exc)

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    try:
        while (chunk := box.get()) is not done:
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk
    finally:
        stop.set()
        while worker.is_alive():
            try:
                box.get_nowait()
            except queue.Empty:
                worker.join(0.05)


def gzip_key() -> dict:
    """What the compressed bytes depend on besides the tar: part of every layer's cache key."""
    import isal

    return {"format": FORMAT, "gzip": f"isal {isal.__version__} level {LEVEL}"}
