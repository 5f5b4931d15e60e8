"""Deterministic image layers: tar streams written straight from the wheels' zips. Every parent directory comes before
its children, uid/gid 0, mtime 0, modes 0755/0644: the same items give the same bytes, so the same lock on the same base
gives the same digests. A file's bytes are inflated from its wheel member as the tar is written, nothing unpacked on
disk."""

from __future__ import annotations

import dataclasses
import os
import tarfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from isal import isal_zlib

from carry.binaries import wheelzip
from carry.image.gzlayer import CHUNK
from carry.image.locked.wheelinstall import Entry

BLOCK = 512
BIG = 64 << 10  # chunks this big are yielded as they are


@dataclasses.dataclass(frozen=True)
class Item:
    """One tar entry: kind 'dir', 'file', 'symlink' or 'whiteout' (an empty file `.wh.<name>`)."""

    path: str  # no leading '/'
    kind: str
    mode: int = 0o644
    size: int = 0
    entry: Entry | None = None  # a file's source
    link: str = ""


def items_for(entries: Iterable[Entry], extra: Iterable[Item] = ()) -> tuple[Item, ...]:
    """Files (and extra items) with every parent directory, sorted by path; a path given twice keeps the last."""
    by_path = {entry.path: Item(entry.path, "file", entry.mode, entry.size, entry) for entry in entries}
    for item in extra:
        by_path[item.path] = item
    dirs: set[str] = set()
    for path in by_path:
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rsplit("/", 1)[0] if "/" in parent else ""
    for directory in dirs:
        by_path.setdefault(directory, Item(directory, "dir", 0o755))
    return tuple(by_path[path] for path in sorted(by_path, key=lambda p: p.split("/")))


def _header(item: Item) -> bytes:
    info = tarfile.TarInfo(whiteout_name(item.path) if item.kind == "whiteout" else item.path)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if item.kind == "dir":
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif item.kind == "symlink":
        info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, item.link
    else:
        info.type, info.mode = tarfile.REGTYPE, item.mode
        info.size = item.size if item.kind == "file" else 0
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def whiteout_name(path: str) -> str:
    """OCI's whiteout of `path`: `.wh.<name>` beside it, hiding it (and a directory's contents) below."""
    parent, _, name = path.rpartition("/")
    return f"{parent}/.wh.{name}" if parent else f".wh.{name}"


def tar_size(items: Iterable[Item]) -> int:
    """The exact length of the tar `stream(items)` yields."""
    total = 2 * BLOCK
    for item in items:
        total += len(_header(item))
        if item.kind == "file":
            total += -(-item.size // BLOCK) * BLOCK
    return total


def stream(items: Iterable[Item]) -> Iterator[bytes]:
    """The layer's tar, chunk by chunk, files inflated from their wheel members (one open zip per wheel)."""
    archives: dict[Path, zipfile.ZipFile] = {}
    pending = bytearray()  # headers, padding and small files gathered; big chunks pass through uncopied
    try:
        for item in items:
            pending += _header(item)
            if item.kind == "file":
                assert item.entry is not None  # a file's item carries its entry (items)
                written = 0
                for chunk in _content(item.entry, archives):
                    written += len(chunk)
                    if len(chunk) >= BIG:
                        if pending:
                            yield bytes(pending)
                            pending = bytearray()
                        yield chunk
                    else:
                        pending += chunk
                if written != item.size:
                    raise OSError(f"{item.path}: {written} bytes read, {item.size} expected")
                pending += b"\0" * (-item.size % BLOCK)
            if len(pending) >= CHUNK:
                yield bytes(pending)
                pending = bytearray()
        pending += b"\0" * (2 * BLOCK)
        yield bytes(pending)
    finally:
        for archive in archives.values():
            archive.close()


def _content(entry: Entry, archives: dict[Path, zipfile.ZipFile]) -> Iterator[bytes]:
    """A file's bytes: its entry's data, or its wheel member inflated chunk by chunk with isal (several times
    zlib's speed; the wheel's sha256 was checked against the lock, and every file's hash is in RECORD)."""
    if entry.data is not None:
        yield entry.data
        return
    assert entry.wheel is not None and entry.member is not None  # an entry without data is a wheel's member
    archive = archives.get(entry.wheel)
    if archive is None:
        archive = archives[entry.wheel] = zipfile.ZipFile(entry.wheel)
    info = archive.getinfo(entry.member)
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        with archive.open(info) as handle:
            while chunk := handle.read(CHUNK):
                yield chunk
        return
    fp = archive.fp
    assert fp is not None  # the archive is open: it closes when the stream ends
    offset = wheelzip.data_start(fp, info, entry.wheel)
    end = offset + info.compress_size
    inflater = isal_zlib.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
    while offset < end:
        raw = os.pread(fp.fileno(), min(CHUNK, end - offset), offset)
        if not raw:
            raise OSError(f"{entry.wheel.name}: {entry.member} is cut short")
        offset += len(raw)
        out = inflater.decompress(raw) if inflater else raw
        if out:
            yield out
    if inflater is not None:
        tail = inflater.flush()
        if tail:
            yield tail
