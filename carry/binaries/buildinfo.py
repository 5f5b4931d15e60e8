"""Provenance: `carry-buildinfo.json` in the wheel's .dist-info, stamped with carry.binaries.wheelzip (every other
member keeps its compressed bytes) and read back only once every member matches RECORD."""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

from carry.binaries import wheelzip
from carry.util.errors import Failed

FILENAME = "carry-buildinfo.json"
FORMAT = 1


def stamp(wheel_path: Path, info: dict, tags: tuple[str, ...] | None = None) -> Path:
    """Add the buildinfo to the wheel's .dist-info and RECORD (retagged with `tags`), replaced by rename: its path."""
    data = (json.dumps(info, indent=2, sort_keys=True) + "\n").encode()
    with zipfile.ZipFile(wheel_path) as archive:
        info_dir = wheelzip.dist_info(archive)
        changes: dict[str, bytes | None] = {f"{info_dir}/{FILENAME}": data}
        if tags:
            wheel_file = f"{info_dir}/WHEEL"
            changes[wheel_file] = wheelzip.retagged_wheel_file(archive.read(wheel_file).decode(), tags).encode()
    target = wheel_path.with_name(retagged_name(wheel_path.name, tags)) if tags else wheel_path
    tmp = wheel_path.with_name(f".{wheel_path.name}.stamp-{os.getpid()}.tmp")
    try:
        wheelzip.rewrite(wheel_path, tmp, changes)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    if target != wheel_path:
        wheel_path.unlink()
    return target


def retagged_name(name: str, tags: tuple[str, ...]) -> str:
    """`dist-version-cp311-cp311-linux_x86_64.whl` with its tags replaced by `tags` (compressed: `py2.py3-none-any`)."""
    stem = name.removesuffix(".whl").split("-")
    pythons, abis, platforms = (".".join(dict.fromkeys(tag.split("-")[i] for tag in tags)) for i in range(3))
    return "-".join([*stem[:-3], pythons, abis, platforms]) + ".whl"


def wheel_tags(wheel_path: Path) -> tuple[str, ...]:
    """The Tag lines of a wheel's WHEEL file."""
    with zipfile.ZipFile(wheel_path) as archive:
        text = archive.read(f"{wheelzip.dist_info(archive)}/WHEEL").decode()
    return wheelzip.tags_of(text)


def read(wheel_path: Path) -> dict | None:
    """The buildinfo in a wheel, or None; every member's RECORD hash is checked first."""
    try:
        with zipfile.ZipFile(wheel_path) as archive:
            wheelzip.check_record(wheel_path, archive)
            name = f"{wheelzip.dist_info(archive)}/{FILENAME}"
            return json.loads(archive.read(name)) if name in archive.NameToInfo else None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, Failed) as exc:
        raise Failed(f"{wheel_path}: not a valid wheel ({exc}); rebuild it") from None


def peek(wheel_path: Path) -> dict | None:
    """The buildinfo in a wheel, RECORD unchecked (to tell which artifact it is, not to trust it), or None."""
    try:
        with zipfile.ZipFile(wheel_path) as archive:
            return json.loads(archive.read(f"{wheelzip.dist_info(archive)}/{FILENAME}"))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, Failed):
        return None


def wheel_version(wheel_path: Path) -> str:
    match = re.match(r"^[^-]+-([^-]+)-", wheel_path.name)
    if not match:
        raise Failed(f"{wheel_path}: not a wheel file name; expected NAME-VERSION-...whl")
    return match.group(1)
