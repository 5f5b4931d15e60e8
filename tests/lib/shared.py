"""Made once per test run, whatever the number of pytest workers: a lock file and a result on disk.

A session fixture runs once per pytest-xdist worker. `once(factory, name, make)` runs `make(directory)` in the first
worker that asks, under a lock in the run's shared temp root (the parent of every worker's basetemp); the others wait
for the lock and read the result it left (JSON). The directory lives as long as the run's temp dirs (removed after a
passing run: tmp_path_retention_policy). A `make` that raises leaves no result: the next worker to ask tries again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock
import pytest


def run_root(factory: pytest.TempPathFactory) -> Path:
    """The temp dir every worker of this run shares: basetemp itself, or its parent under xdist (popen-gwN)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]) -> Any:
    """make(directory)'s JSON-able result, made by one worker of the run and read by the others."""
    root = run_root(factory) / "shared"
    root.mkdir(exist_ok=True)
    result = root / f"{name}.json"
    with filelock.FileLock(str(root / f"{name}.lock")):
        if result.exists():
            return json.loads(result.read_text())
        directory = root / name
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        made = make(directory)
        result.write_text(json.dumps(made))
        return made


def hardlinked_copy(source: Path, dest: Path) -> Path:
    """A copy of the tree `source` at `dest` whose files are hard links (no bytes copied; `cp -al`). A user that
    writes a file in place would write the original too: carry writes new files and renames them into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(source), str(dest)], check=True)
    return dest
