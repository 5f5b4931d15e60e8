"""The end of a build log, printed when a build fails (the upstream's PEP 517 build, a BuildKit build)."""

from __future__ import annotations

import collections
from pathlib import Path

LOG_TAIL_LINES = 40


def tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    with open(log, "rb") as handle:
        last = collections.deque(handle, maxlen=lines)
    return "".join(line.decode(errors="replace") for line in last).rstrip()
