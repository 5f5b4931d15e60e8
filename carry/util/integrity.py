"""Cache entries checked by the sha256 recorded when they were written, before anyone uses them.

A file carry keeps (a wheel in `$CARRY_CACHE/artifacts/`, a bundle in `$CARRY_CACHE/bundles/`) is hashed once, as
it is stored, into `<file>.sha256` (sha256sum's format). A cache hit hashes the file again while it is copied for
its use and compares, in one read. A mismatch is a corrupt entry: the caller removes and remakes it, or refuses it,
in one line (`Corrupt.line`). Copies out of the cache are never hard links, so neither side's changes reach the other.

hashlib is imported where files are hashed: its sha256 is 3.6x the interpreter's own, and `check` never hashes.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO

from carry.util.fsutil import atomic_write_text
from carry.util.record import record

SUFFIX = ".sha256"
CHUNK = 4 << 20
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int), a copy-on-write clone of a whole file (btrfs, xfs)


@record
class Corrupt:
    """A cache entry whose bytes are not the ones recorded at write time."""

    path: Path
    found: str
    recorded: str  # the sha256 recorded at write time; empty when none was (then `why` says what failed)
    why: str = ""

    def line(self, action: str) -> str:
        """One line: the entry, both hashes (or what else failed) and what was done (`removed; building it again`)."""
        what = self.why or f"sha256 {self.found[:16]}… is not the {self.recorded[:16]}… recorded when it was written"
        return f"{self.path}: {what}: a corrupt cache entry, {action}"


def seal_path(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def seal(path: Path, sha256: str | None = None) -> str:
    """Record `path`'s sha256 (given when the caller hashed it already) beside it; returns it."""
    found = sha256 or file_sha256(path)
    atomic_write_text(seal_path(path), f"{found}  {path.name}\n")
    return found


def recorded(path: Path) -> str | None:
    """The sha256 recorded beside `path`; None when there is none (an older carry's entry) or it is unreadable."""
    try:
        text = seal_path(path).read_text()
    except OSError:
        return None
    value = text.split(maxsplit=1)[0] if text.strip() else ""
    return value if len(value) == 64 and all(c in "0123456789abcdef" for c in value) else None


def check(path: Path) -> Corrupt | None:
    """`path` hashed and held to its seal; None when they agree. A missing seal is a mismatch too."""
    found = file_sha256(path)
    want = recorded(path)
    return None if found == want else Corrupt(path, found, want or "", "" if want else "no sha256 recorded beside it")


def copy_checked(source: Path, dest: Path, *, verify: bool = True) -> Corrupt | None:
    """Copy `source` to the new file `dest` (a reflink where possible, else the bytes). With `verify`, what is read is
    hashed and held to the seal: on a mismatch `dest` is removed and the mismatch returned."""
    import hashlib

    digest = hashlib.sha256()
    try:
        with open(source, "rb") as src, open(dest, "xb") as out:
            if not _reflink(src, out):
                while chunk := src.read(CHUNK):
                    if verify:
                        digest.update(chunk)
                    out.write(chunk)
            elif verify:
                with open(dest, "rb") as clone:
                    while chunk := clone.read(CHUNK):
                        digest.update(chunk)
        os.chmod(dest, 0o644)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    if not verify:
        return None
    found, want = digest.hexdigest(), recorded(source)
    if found == want:
        return None
    dest.unlink(missing_ok=True)
    return Corrupt(source, found, want or "", "" if want else "no sha256 recorded beside it")


def _reflink(src: BinaryIO, out: BinaryIO) -> bool:
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.ioctl(out.fileno(), FICLONE, src.fileno())
        return True
    return False


def discard(path: Path) -> None:
    """A corrupt entry and its seal, removed."""
    path.unlink(missing_ok=True)
    seal_path(path).unlink(missing_ok=True)
