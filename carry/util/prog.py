"""The command the user ran, for the commands carry's messages suggest: `carry` (the installed command, and
`python -m carry`) or `build.py` (a checkout's)."""

from __future__ import annotations

import os
import shlex
import sys


def name() -> str:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "build.py" if script == "build.py" else "carry"


def command(*args: str) -> str:
    """`carry drop NAME` (or `build.py drop NAME`), quoted like a shell would need it."""
    return shlex.join([name(), *args])
