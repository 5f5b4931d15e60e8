"""A setuptools build writes stored members (carry/wheelbuild/pep517.py) and the stamp deflates them with ISA-L
(carry/binaries/wheelzip.py): a real setuptools build of a small package, in this interpreter, no isolation."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

from carry.binaries import buildinfo
from carry.wheelbuild import pep517

TEXT = "".join(f"VALUE_{i} = {i} * 'carried'\n" for i in range(2000)).encode()  # deflates well
NOISE = os.urandom(4096)  # does not shrink: stays stored


def project(root: Path) -> Path:
    (root / "tiny").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tiny"\nversion = "1.0"\n[tool.setuptools.package-data]\ntiny = ["*.bin"]\n'
    )
    (root / "tiny" / "__init__.py").write_bytes(b"")
    (root / "tiny" / "values.py").write_bytes(TEXT)
    (root / "tiny" / "noise.bin").write_bytes(NOISE)
    return root


def test_setuptools_stores_the_members_and_the_stamp_deflates_what_shrinks(tmp_path):
    src, out, log = project(tmp_path / "src"), tmp_path / "out", tmp_path / "build.log"
    with open(log, "wb") as handle:
        status = pep517.build_wheel(src, out, dict(os.environ), handle, False, sys.executable)
    assert status == 0, log.read_text()[-2000:]
    assert "{'--build-option': ['--compression=stored']}" in log.read_text()
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        built = {m.filename: (m.compress_type, archive.read(m)) for m in archive.infolist()}
    assert {kind for kind, _ in built.values()} == {zipfile.ZIP_STORED}, "setuptools wrote every member stored"

    size = wheel.stat().st_size
    stamped = buildinfo.stamp(wheel, {"format": buildinfo.FORMAT, "note": "stamped"})
    assert buildinfo.read(stamped) == {"format": buildinfo.FORMAT, "note": "stamped"}  # every member against RECORD
    with zipfile.ZipFile(stamped) as archive:
        assert archive.testzip() is None
        kinds = {m.filename: m.compress_type for m in archive.infolist()}
        same = [name for name in built if not name.endswith("/RECORD")]  # RECORD gains the buildinfo
        assert {name: archive.read(name) for name in same} == {name: built[name][1] for name in same}
        assert archive.getinfo("tiny/values.py").compress_size < len(TEXT) // 5
    assert kinds["tiny/values.py"] == zipfile.ZIP_DEFLATED
    assert kinds["tiny/noise.bin"] == zipfile.ZIP_STORED and kinds["tiny/__init__.py"] == zipfile.ZIP_STORED
    assert stamped.stat().st_size < size
