"""Provenance: `carry-buildinfo.json` in the wheel's .dist-info, written and read through the `wheel` library."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from wheel.wheelfile import WheelError, WheelFile

from carry.errors import Failed

FILENAME = "carry-buildinfo.json"
FORMAT = 1


def stamp(wheel_path: Path, info: dict, scratch: Path) -> None:
    """Add the buildinfo to the wheel's .dist-info and list it in RECORD, changing the wheel in place.

    Callers stamp a wheel they own (a fresh build in their scratch dir), so nothing is copied first. When
    RECORD is the archive's last member, as wheel builders write it, only RECORD is replaced and every other
    member keeps its compressed bytes (a large .so is not inflated and deflated again); otherwise the wheel is
    unpacked and repacked by WheelFile, which regenerates RECORD, and renamed over the original.
    """
    data = (json.dumps(info, indent=2, sort_keys=True) + "\n").encode()
    if _replace_last_record(wheel_path, data):
        return
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="stamp-") as tmp:
        unpacked = Path(tmp) / "unpacked"
        with WheelFile(wheel_path) as wheel:
            wheel.extractall(unpacked)
            dist_info = wheel.dist_info_path
            _restore_modes(wheel.infolist(), unpacked)
        (unpacked / dist_info / "RECORD").unlink()
        (unpacked / dist_info / FILENAME).write_bytes(data)
        repacked = Path(tmp) / wheel_path.name
        with WheelFile(repacked, "w") as out:
            out.write_files(str(unpacked))
        os.replace(repacked, wheel_path)


def _replace_last_record(wheel_path: Path, data: bytes) -> bool:
    """Cut RECORD off the end of the archive and append the buildinfo and a new RECORD; False if RECORD is
    not the last member (or the buildinfo is already there), leaving the file as it was.

    This leans on two zipfile internals (`start_dir`, `NameToInfo`) so that append mode writes over the old
    RECORD; `read()` below re-checks every member against the new RECORD, and the tests do too.
    """
    with WheelFile(wheel_path) as wheel:
        dist_info = wheel.dist_info_path
    record_name, info_name = f"{dist_info}/RECORD", f"{dist_info}/{FILENAME}"
    with zipfile.ZipFile(wheel_path, "a") as archive:
        members = archive.infolist()
        names = {member.filename for member in members}
        last = max(members, key=lambda member: member.header_offset)
        if last.filename != record_name or info_name in names:
            return False
        rows = [row for row in csv.reader(archive.read(last).decode().splitlines()) if row and row[0] != record_name]
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows += [[info_name, f"sha256={digest}", str(len(data))], [record_name, "", ""]]
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows(rows)
        # Drop RECORD from the central directory and write over its bytes; closing truncates the rest.
        members.remove(last)
        del archive.NameToInfo[record_name]
        archive.start_dir = last.header_offset
        for name, payload in ((info_name, data), (record_name, record.getvalue().encode())):
            member = zipfile.ZipInfo(name, date_time=last.date_time)
            member.compress_type = zipfile.ZIP_DEFLATED
            member.external_attr = 0o644 << 16
            archive.writestr(member, payload)
    return True


def _restore_modes(members: list[zipfile.ZipInfo], unpacked: Path) -> None:
    """zipfile drops permission bits on extract; put them back so .so files stay executable."""
    for member in members:
        mode = (member.external_attr >> 16) & 0o777
        if mode and not member.is_dir():
            os.chmod(unpacked / member.filename, mode)


def read(wheel_path: Path) -> dict | None:
    """The buildinfo in a wheel, or None; every file's RECORD hash is checked while reading."""
    try:
        with WheelFile(wheel_path) as wheel:
            for member in wheel.infolist():
                wheel.read(member)
            name = f"{wheel.dist_info_path}/{FILENAME}"
            if name not in wheel.namelist():
                return None
            return json.loads(wheel.read(name))
    except (OSError, ValueError, KeyError, WheelError) as exc:
        raise Failed(f"{wheel_path}: not a valid wheel ({exc}); rebuild it") from None


def extract(wheel_path: Path, dest: Path, only: Callable[[str], bool] | None = None) -> None:
    """Unpack the wheel (with `only`, the members whose name it accepts), keeping permission bits."""
    dest.mkdir(parents=True, exist_ok=True)
    with WheelFile(wheel_path) as wheel:
        members = [m for m in wheel.infolist() if only is None or only(m.filename)]
        wheel.extractall(dest, members)
    _restore_modes(members, dest)


def wheel_version(wheel_path: Path) -> str:
    match = re.match(r"^[^-]+-([^-]+)-", wheel_path.name)
    if not match:
        raise Failed(f"{wheel_path}: not a wheel file name; expected NAME-VERSION-...whl")
    return match.group(1)
