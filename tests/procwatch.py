"""Watch every process's command line while a block runs: secrets must never show up in argv."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path


def _scan(seen: set[str], stop: threading.Event) -> None:
    while not stop.is_set():
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    seen.add((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    pass
        time.sleep(0.001)


@contextlib.contextmanager
def command_lines() -> Iterator[set[str]]:
    """The distinct command lines of all processes seen while the block runs, scanned as fast as /proc allows."""
    seen: set[str] = set()
    stop = threading.Event()
    watcher = threading.Thread(target=_scan, args=(seen, stop), daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()
