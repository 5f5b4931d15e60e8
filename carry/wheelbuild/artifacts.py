"""The artifact cache and dist/: `$CARRY_CACHE/artifacts/<key>/` holds one finished wheel, its gate report and the
wheel's sha256 (recorded as it is stored, carry.util.integrity); publishing copies them into `out`. A hit is checked
while it is copied out (one read): a wheel whose bytes are not the recorded ones is never published, the entry is
removed and built again; an older carry's entry without a sha256 is held to its own RECORD once, then sealed. `out`
gets a copy (a reflink where the filesystem has them), never a hard link: a change to either would reach the other.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from carry.util import integrity
from carry.util.cache import Cache
from carry.util.errors import CarryError, Failed
from carry.util.fsutil import atomic_write_text, ensure_room, is_no_space, no_space_line, owned_prefix, sweep_dead

GATE_SUFFIX = ".gate.txt"


class CorruptEntry(Failed):
    """A cached wheel whose bytes are not what was recorded (`corrupt`): nothing was published."""

    def __init__(self, corrupt: integrity.Corrupt):
        super().__init__(corrupt.line("not published"))
        self.corrupt = corrupt


def gate_report_path(wheel: Path) -> Path:
    """`<wheel>.gate.txt`, the full gate report beside a wheel."""
    return wheel.with_name(wheel.name + GATE_SUFFIX)


def write_gate_report(wheel: Path, lines: list[str]) -> None:
    atomic_write_text(gate_report_path(wheel), "\n".join(lines) + "\n")


def cached(cache: Cache, key: str) -> Path | None:
    """The stored wheel of `key`, or None."""
    directory = cache.artifacts / key
    wheels = sorted(directory.glob("*.whl")) if directory.is_dir() else []
    return wheels[0] if len(wheels) == 1 else None


def store(cache: Cache, key: str, wheel: Path, report_lines: list[str]) -> Path:
    """Move the finished wheel, its gate report and its sha256 into the artifact cache with one directory rename;
    a full disk leaves no staging dir and names what was needed."""
    cache.artifacts.mkdir(parents=True, exist_ok=True)
    sweep_dead(cache.artifacts, f".{key[:12]}-")
    size = wheel.stat().st_size
    staging = Path(tempfile.mkdtemp(prefix=owned_prefix(f".{key[:12]}-"), dir=cache.artifacts))
    try:
        shutil.move(str(wheel), staging / wheel.name)
        os.chmod(staging / wheel.name, 0o644)
        write_gate_report(staging / wheel.name, report_lines)
        integrity.seal(staging / wheel.name)
        final = cache.artifacts / key
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError) and is_no_space(exc):
            raise Failed(no_space_line(cache.artifacts / key, needed=size)) from None
        raise
    return final / wheel.name


def discard(cache: Cache, key: str) -> None:
    shutil.rmtree(cache.artifacts / key, ignore_errors=True)


def checked_once(wheel: Path) -> integrity.Corrupt | None:
    """A stored wheel without a recorded sha256 (an older carry's entry): held to its RECORD, every member inflated
    and hashed, then sealed; the mismatch when it is not whole."""
    from carry.binaries import wheelzip

    try:
        with zipfile.ZipFile(wheel) as archive:
            wheelzip.check_record(wheel, archive)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, CarryError):
        why = "no sha256 recorded beside it (an older carry's entry), and its own RECORD does not hold"
        return integrity.Corrupt(wheel, integrity.file_sha256(wheel), "", why)
    integrity.seal(wheel)
    return None


def check(wheel: Path) -> integrity.Corrupt | None:
    """A stored wheel held to its recorded sha256 (one read; an older carry's entry to its RECORD, once)."""
    return checked_once(wheel) if integrity.recorded(wheel) is None else integrity.check(wheel)


def publish(wheel: Path, out: Path, *, sealed: bool = False) -> Path:
    """Copy the wheel, then its gate report, into `out` through temp names and renames (never a partial wheel, nor a
    report without one); a `sealed` wheel is hashed as it is copied: a mismatch publishes nothing (CorruptEntry)."""
    out.mkdir(parents=True, exist_ok=True)
    report = gate_report_path(wheel)
    sources = [wheel, *([report] if report.exists() else [])]
    needed = sum(path.stat().st_size for path in sources)
    ensure_room(out, needed, wheel.name)
    placed: list[tuple[Path, Path]] = []
    try:
        for source in sources:
            dest = out / source.name
            sweep_dead(out, f".{dest.name}.")
            tmp = Path(tempfile.mktemp(prefix=owned_prefix(f".{dest.name}."), suffix=".tmp", dir=out))
            placed.append((tmp, dest))
            if (corrupt := _copy(source, tmp, checked=sealed and source == wheel)) is not None:
                raise CorruptEntry(corrupt)
        for tmp, dest in placed:
            os.replace(tmp, dest)
    except OSError as exc:
        if is_no_space(exc):
            raise Failed(no_space_line(out / wheel.name, needed=needed)) from None
        raise
    finally:
        for tmp, _ in placed:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return out / wheel.name


def _copy(source: Path, dest: Path, *, checked: bool) -> integrity.Corrupt | None:
    if checked and integrity.recorded(source) is None and (corrupt := checked_once(source)) is not None:
        return corrupt
    return integrity.copy_checked(source, dest, verify=checked)
