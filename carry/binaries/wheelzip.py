"""Wheels as zip files: a member's bytes read straight from the file (inflated with the GIL released), every
member checked against RECORD, and a wheel rewritten without inflating it: unchanged members are copied as their
compressed bytes (a 300 MB shared object costs a file copy, not a deflate), RECORD regenerated last. Stored members
(carry asks setuptools for them, wheelbuild/pep517.py) are deflated on the way, by ISA-L: a precompiled vLLM wheel's
837 MB in 3.3 s here, where zlib's level 6 took 27.8 s, for a wheel 7 % larger (359 MB, not 336).

It leans on three zipfile internals (`fp`, `filelist`/`NameToInfo`, `start_dir`) to place raw members in an
archive; `read()` in buildinfo re-checks every member against RECORD, and the tests do too.
"""

from __future__ import annotations

import base64
import copy
import csv
import hashlib
import io
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from carry.util.errors import Failed

try:  # ISA-L inflates about twice as fast as zlib; both release the GIL, so members inflate in parallel
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - isal is a dependency; zlib keeps carry working without it
    _zlib = zlib  # type: ignore[misc]
DEFLATE_LEVEL = 3  # ISA-L's highest (0-3)

_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_DESCRIPTOR_SIGNATURE = b"PK\x07\x08"
_COPY_CHUNK = 1 << 22


def dist_info(archive: zipfile.ZipFile) -> str:
    """The `.dist-info` directory at the archive's root."""
    found = {name.split("/", 1)[0] for name in archive.namelist() if name.split("/", 1)[0].endswith(".dist-info")}
    if len(found) != 1:
        raise Failed(f"{archive.filename}: expected one .dist-info directory, found {len(found)}")
    return found.pop()


def member_bytes(wheel: Path, member: zipfile.ZipInfo, handle: IO[bytes] | None = None) -> bytes:
    """A member's contents: stored or deflated members are read and inflated directly (the GIL is released
    while inflating; `handle`, an open file of the wheel, is read with pread), others through zipfile."""
    if member.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    if handle is None:
        with open(wheel, "rb") as own:
            return member_bytes(wheel, member, own)
    raw = os.pread(handle.fileno(), member.compress_size, data_start(handle, member, wheel))
    stored = member.compress_type == zipfile.ZIP_STORED
    data = raw if stored else _zlib.decompress(raw, -15, max(member.file_size, 1))  # one buffer of the known size
    if len(data) != member.file_size:
        raise Failed(f"{wheel}: {member.filename} inflates to {len(data)} bytes, not {member.file_size}")
    return data


def data_start(handle: IO[bytes], member: zipfile.ZipInfo, where: str | Path) -> int:
    """Where `member`'s compressed bytes start: after its local header, name and extra field."""
    fields = _LOCAL.unpack(os.pread(handle.fileno(), _LOCAL.size, member.header_offset))
    if fields[0] != b"PK\x03\x04":
        raise Failed(f"{where}: bad local header for {member.filename}")
    return member.header_offset + _LOCAL.size + fields[9] + fields[10]


def check_record(wheel: Path, archive: zipfile.ZipFile, unhashed_ok: bool = False) -> int:
    """How many members of the open `archive` (at `wheel`) were checked against RECORD, several at a time, biggest
    first (a vLLM wheel holds 650 MB of shared objects); a member with no hash fails unless `unhashed_ok`."""
    record_name = f"{dist_info(archive)}/RECORD"
    record = {row[0]: row[1] for row in csv.reader(archive.read(record_name).decode().splitlines()) if row}
    members = sorted(
        (m for m in archive.infolist() if not m.is_dir() and m.filename != record_name), key=lambda m: -m.file_size
    )
    if unhashed_ok:
        members = [m for m in members if record.get(m.filename)]

    def check(member: zipfile.ZipInfo, handle: IO[bytes]) -> None:
        algorithm, _, digest = record.get(member.filename, "").partition("=")
        if algorithm != "sha256" or not digest:
            raise Failed(f"{member.filename} has no sha256 hash in RECORD")
        found = base64.urlsafe_b64encode(hashlib.sha256(member_bytes(wheel, member, handle)).digest())
        if found.rstrip(b"=").decode() != digest:
            raise Failed(f"Hash mismatch for {member.filename}: its bytes are not what RECORD says")

    workers = max(1, min(4, os.cpu_count() or 1))
    with open(wheel, "rb") as handle, ThreadPoolExecutor(workers) as pool:  # pread: one handle serves all
        list(pool.map(lambda member: check(member, handle), members))
    return len(members)


def record_hash(data: bytes) -> str:
    """The RECORD hash of `data`: `sha256=` and the urlsafe base64 digest without padding (PEP 376/427)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def record_line(name: str, data: bytes) -> list[str]:
    return [name, record_hash(data), str(len(data))]


def rewrite(src: Path, dest: Path, changes: dict[str, bytes | None], dist_info_as: str | None = None) -> None:
    """Write `dest` in place as `src` with `changes` (name -> new bytes, None drops it) and RECORD regenerated: a
    replaced member keeps its place, date and mode, new names go before RECORD, the rest keep their compressed
    bytes. `dist_info_as` renames the .dist-info directory (`changes` names its members by their new names)."""
    with zipfile.ZipFile(src) as archive, open(src, "rb") as raw:
        info_dir = dist_info(archive)
        new_info = dist_info_as or info_dir
        record_name = f"{new_info}/RECORD"
        old_rows = {row[0]: row for row in csv.reader(archive.read(f"{info_dir}/RECORD").decode().splitlines()) if row}
        members = [m for m in archive.infolist() if m.filename != f"{info_dir}/RECORD"]
        date_time = max((m.date_time for m in members), default=(1980, 1, 1, 0, 0, 0))
        rows, placed = [], set()
        with zipfile.ZipFile(dest, "w") as out:
            for member in members:
                name = member.filename
                if new_info != info_dir and name.startswith(f"{info_dir}/"):
                    name = f"{new_info}/{name[len(info_dir) + 1 :]}"
                placed.add(name)
                if name == member.filename and name not in changes:
                    if member.compress_type != zipfile.ZIP_STORED or not _deflated(out, member, raw):
                        copy_member(raw, member, out)
                    rows.append(old_rows.get(name) or record_line(name, archive.read(member)))
                elif (data := changes[name] if name in changes else archive.read(member)) is not None:
                    _write(out, name, data, member.date_time, member.external_attr)
                    rows.append(record_line(name, data))
            for name, data in changes.items():
                if data is None or name == record_name or name in placed:
                    continue
                _write(out, name, data, date_time, 0o644 << 16)
                rows.append(record_line(name, data))
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows([*rows, [record_name, "", ""]])
            _write(out, record_name, text.getvalue().encode(), date_time, 0o644 << 16)


def _write(out: zipfile.ZipFile, name: str, data: bytes, date_time: tuple, external_attr: int) -> None:
    entry = zipfile.ZipInfo(name, date_time=date_time)
    entry.compress_type = zipfile.ZIP_DEFLATED
    entry.external_attr = external_attr
    out.writestr(entry, data)


def _deflated(out: zipfile.ZipFile, member: zipfile.ZipInfo, raw: IO[bytes]) -> bool:
    """Whether the stored `member` of `raw` was appended to `out` deflated by ISA-L (not when that is no smaller)."""
    data = member_bytes(Path(raw.name), member, raw)
    compressor = _zlib.compressobj(DEFLATE_LEVEL, zipfile.ZIP_DEFLATED, -15)
    packed = compressor.compress(data) + compressor.flush()
    if len(packed) >= len(data):
        return False
    placed = zipfile.ZipInfo(member.filename, date_time=member.date_time)
    placed.external_attr, placed.create_system = member.external_attr, member.create_system
    placed.compress_type, placed.CRC = zipfile.ZIP_DEFLATED, _zlib.crc32(data)
    placed.file_size, placed.compress_size = len(data), len(packed)
    _place(out, placed, [placed.FileHeader(), packed])
    return True


def copy_member(raw: IO[bytes], member: zipfile.ZipInfo, out: zipfile.ZipFile) -> None:
    """Append `member`'s local header, compressed data and data descriptor as they are in `raw` to `out`."""
    length = data_start(raw, member, raw.name) - member.header_offset + member.compress_size
    if member.flag_bits & 0x08:
        tail = os.pread(raw.fileno(), 4, member.header_offset + length)
        zip64 = member.file_size >= 0xFFFFFFFF or member.compress_size >= 0xFFFFFFFF
        length += (4 if tail == _DESCRIPTOR_SIGNATURE else 0) + (20 if zip64 else 12)

    def chunks(remaining: int) -> Iterator[bytes]:
        raw.seek(member.header_offset)
        while remaining:
            chunk = raw.read(min(_COPY_CHUNK, remaining))
            if not chunk:
                raise Failed(f"{raw.name}: {member.filename} is cut short")
            remaining -= len(chunk)
            yield chunk

    _place(out, copy.copy(member), chunks(length))


def _place(out: zipfile.ZipFile, placed: zipfile.ZipInfo, chunks: Iterable[bytes]) -> None:
    """Write `chunks` (a local header and its data) at the end of `out`'s members and list `placed` there."""
    fp = out.fp
    assert fp is not None, "out is an archive open for writing"
    fp.seek(out.start_dir)
    placed.header_offset = fp.tell()
    for chunk in chunks:
        fp.write(chunk)
    out.start_dir = fp.tell()
    out.filelist.append(placed)
    out.NameToInfo[placed.filename] = placed


def tags_of(wheel_file: str) -> tuple[str, ...]:
    """The Tag lines of a WHEEL file's text."""
    return tuple(line.split(":", 1)[1].strip() for line in wheel_file.splitlines() if line.startswith("Tag:"))


def retagged_wheel_file(text: str, tags: tuple[str, ...]) -> str:
    """A WHEEL file with its Tag lines replaced by `tags` (e.g. `cp38-abi3-manylinux_2_28_x86_64`)."""
    lines = [line for line in text.splitlines() if not line.startswith("Tag:")]
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join([*lines, *(f"Tag: {tag}" for tag in tags)]) + "\n"
