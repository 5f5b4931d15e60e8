"""Small real wheels for tests: a zip with METADATA, WHEEL and a RECORD of every member, as pip and uv read it."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    entry_points: str = "",
    executable: tuple[str, ...] = (),
) -> Path:
    dist_info = f"{name}-{version}.dist-info"
    members = dict(files)
    members[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    members[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if entry_points:
        members[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    record = []
    for path, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    members[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in members.items():
            info = zipfile.ZipInfo(member)
            info.external_attr = (0o755 if member in executable else 0o644) << 16
            archive.writestr(info, data)
    return path
