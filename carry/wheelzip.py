"""Rewrite a wheel without inflating it: every member that does not change is copied as its compressed bytes
(a 300 MB shared object costs a file copy, not a deflate), the changed and added members are written anew, and
RECORD is regenerated last from the old rows and the new hashes.

It leans on three zipfile internals (`fp`, `filelist`/`NameToInfo`, `start_dir`) to place raw members in an
archive zipfile then finishes with its own central directory; `read()` in buildinfo re-checks every member
against RECORD, and the tests do too.
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
from pathlib import Path

from carry.errors import Failed

_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_DESCRIPTOR_SIGNATURE = b"PK\x07\x08"
_COPY_CHUNK = 1 << 22


def dist_info(archive: zipfile.ZipFile) -> str:
    """The `.dist-info` directory at the archive's root."""
    found = {name.split("/", 1)[0] for name in archive.namelist() if name.split("/", 1)[0].endswith(".dist-info")}
    if len(found) != 1:
        raise Failed(f"{archive.filename}: expected one .dist-info directory, found {len(found)}")
    return found.pop()


def record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def rewrite(src: Path, dest: Path, changes: dict[str, bytes | None]) -> None:
    """Write `dest` as `src` with `changes` applied (name -> new bytes, or None to drop the member; names not in
    `src` are added before RECORD), RECORD regenerated. `dest` is written in place; callers rename it."""
    with zipfile.ZipFile(src) as archive, open(src, "rb") as raw:
        info_dir = dist_info(archive)
        record_name = f"{info_dir}/RECORD"
        old_rows = {row[0]: row for row in csv.reader(archive.read(record_name).decode().splitlines()) if row}
        members = [m for m in archive.infolist() if m.filename != record_name]
        date_time = max((m.date_time for m in members), default=(1980, 1, 1, 0, 0, 0))
        rows = []
        with zipfile.ZipFile(dest, "w") as out:
            for member in members:
                if member.filename in changes:
                    continue
                _copy_raw(raw, member, out)
                rows.append(old_rows.get(member.filename) or _recompute(archive, member))
            for name, data in changes.items():
                if data is None or name == record_name:
                    continue
                entry = zipfile.ZipInfo(name, date_time=date_time)
                entry.compress_type = zipfile.ZIP_DEFLATED
                entry.external_attr = 0o644 << 16
                out.writestr(entry, data)
                rows.append(record_line(name, data))
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows([*rows, [record_name, "", ""]])
            entry = zipfile.ZipInfo(record_name, date_time=date_time)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            out.writestr(entry, text.getvalue().encode())


def _recompute(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> list[str]:
    return record_line(member.filename, archive.read(member))


def _copy_raw(raw, member: zipfile.ZipInfo, out: zipfile.ZipFile) -> None:
    """Append `member`'s local header, compressed data and data descriptor as they are in `raw`."""
    header = os.pread(raw.fileno(), _LOCAL.size, member.header_offset)
    fields = _LOCAL.unpack(header)
    if fields[0] != b"PK\x03\x04":
        raise Failed(f"{raw.name}: bad local header for {member.filename}")
    length = _LOCAL.size + fields[9] + fields[10] + member.compress_size
    if member.flag_bits & 0x08:
        tail = os.pread(raw.fileno(), 4, member.header_offset + length)
        zip64 = member.file_size >= 0xFFFFFFFF or member.compress_size >= 0xFFFFFFFF
        length += (4 if tail == _DESCRIPTOR_SIGNATURE else 0) + (20 if zip64 else 12)
    out.fp.seek(out.start_dir)
    placed = copy.copy(member)
    placed.header_offset = out.fp.tell()
    raw.seek(member.header_offset)
    remaining = length
    while remaining:
        chunk = raw.read(min(_COPY_CHUNK, remaining))
        if not chunk:
            raise Failed(f"{raw.name}: {member.filename} is cut short")
        out.fp.write(chunk)
        remaining -= len(chunk)
    out.start_dir = out.fp.tell()
    out.filelist.append(placed)
    out.NameToInfo[placed.filename] = placed


def retagged_wheel_file(text: str, tags: tuple[str, ...]) -> str:
    """A WHEEL file with its Tag lines replaced by `tags` (e.g. `cp38-abi3-manylinux_2_28_x86_64`)."""
    lines = [line for line in text.splitlines() if not line.startswith("Tag:")]
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join([*lines, *(f"Tag: {tag}" for tag in tags)]) + "\n"

