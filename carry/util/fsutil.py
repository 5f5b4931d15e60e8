"""Writing files so that a crash never leaves a partial one: temp file in the same directory, then rename.

glob, shutil and tempfile are imported where they are used: `check` and `version` load this module and need none.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def owned_prefix(prefix: str) -> str:
    """A temp-name prefix that records this process, so a later run can tell leftovers of dead ones."""
    return f"{prefix}{os.getpid()}-"


def sweep_dead(parent: Path, prefix: str) -> None:
    """Remove temp files and dirs named `owned_prefix(prefix)...` whose process is gone (killed mid-way)."""
    if not parent.is_dir():
        return
    import glob
    import shutil

    for entry in parent.glob(f"{glob.escape(prefix)}*"):
        pid = entry.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one rename."""
    path = Path(path)
    import tempfile

    sweep_dead(path.parent, f".{path.name}.")
    fd, tmp = tempfile.mkstemp(prefix=owned_prefix(f".{path.name}."), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_private(path: Path, text: str) -> Path:
    """Write a new mode-600 file (created so: a secret in it is never readable by others, not even briefly)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return path


@contextlib.contextmanager
def temp_dir(parent: Path, prefix: str) -> Iterator[Path]:
    """A scratch directory under `parent`, removed afterwards whatever happens (and by the next run if killed)."""
    import shutil
    import tempfile

    parent.mkdir(parents=True, exist_ok=True)
    sweep_dead(parent, prefix)
    path = Path(tempfile.mkdtemp(prefix=owned_prefix(prefix), dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
