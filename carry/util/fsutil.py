"""Writing files so that a crash never leaves a partial one: temp file in the same directory, then rename.

glob, shutil and tempfile are imported where they are used: `check` and `version` load this module and need none.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from carry.util.errors import Failed

# What a full filesystem (or a user's exhausted quota) says: as an errno, and in a tool's output (uv is Rust's).
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE_SIGNS = ("No space left on device", "os error 28", "Disk quota exceeded")


def owned_prefix(prefix: str) -> str:
    """A temp-name prefix that records this process, so a later run can tell leftovers of dead ones."""
    return f"{prefix}{os.getpid()}-"


def sweep_dead(parent: Path, prefix: str) -> None:
    """Remove temp files and dirs named `owned_prefix(prefix)...` whose process is gone (killed mid-way)."""
    if not parent.is_dir():
        return
    import glob

    for entry in parent.glob(f"{glob.escape(prefix)}*"):
        pid = entry.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            remove(entry)


def remove(path: Path) -> None:
    """Remove a file, a link or a whole directory, whatever is there (nothing when it is gone)."""
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True  # a PermissionError too: the process exists, another user's


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
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if is_no_space(exc):  # the file keeps what it held; the line names it, not the temp file
            raise Failed(no_space_line(path, needed=len(data))) from None
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


def human_size(size: float) -> str:
    """1.5 MB, 230 KB, 17 B (powers of 1000, as df -H and the registries count)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size:.1f} TB"


def free_space(path: Path) -> int:
    """Bytes free to this user on the filesystem that holds `path` (its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def tree_size(path: Path) -> int:
    """The bytes of the files under `path` (what a half-made directory had written when the disk filled)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def no_space_line(path: Path, needed: int | None = None, written: int | None = None) -> str:
    """One line for a full filesystem: the path that could not be written, what it needed (exactly where that is
    known; else at least what was written before it filled), and what is free there."""
    if needed is not None:
        need = f"needs {human_size(needed)}"
    elif written:
        need = f"needs more than the {human_size(written)} written before it filled"
    else:
        need = "needs more space"
    return (
        f"{path}: no space left on device: {need}, {human_size(free_space(path))} free there; free some space "
        f"(or point CARRY_CACHE / --out elsewhere) and run again"
    )


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in NO_SPACE


def says_no_space(text: str) -> bool:
    """Whether a tool's output says it found the disk full."""
    return any(sign in text for sign in NO_SPACE_SIGNS)


def ensure_room(directory: Path, needed: int, what: str) -> None:
    """Fail before writing `needed` bytes of `what` into `directory` when its filesystem has less free."""
    if free_space(directory) < needed:
        raise Failed(no_space_line(Path(directory) / what, needed))
