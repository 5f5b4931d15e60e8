"""Phase lines with elapsed time, written to stderr as work goes on."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, quiet: bool = False):
        self.start = time.monotonic()
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def phase(self, name: str, detail: str = "") -> None:
        if not self.quiet:
            print(f"[{self.elapsed():7.1f}s] {name}: {detail}".rstrip(": "), file=self.stream, flush=True)
