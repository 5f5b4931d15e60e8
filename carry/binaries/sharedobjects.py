"""The shared objects the gate judges, read where they lie: inside a wheel (inflated in memory, several members at
once, nothing written to disk), in an unpacked tree, or as `.so` files. For each: its path as shown, its ELF
machine and the cubins and PTX of its `.nv_fatbin` section."""

from __future__ import annotations

import dataclasses
import os
import struct
import zipfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from carry.binaries import fatbin
from carry.binaries.fatbin import ELF_MAGIC, FatbinEntry, is_elf
from carry.binaries.wheelzip import member_bytes
from carry.util.errors import BadInput, Failed


@dataclasses.dataclass(frozen=True)
class SharedObject:
    """One ELF shared object: where it is (inside the wheel, or relative to the tree), its CPU and CUDA code."""

    path: str
    machine: int | None
    entries: tuple[FatbinEntry, ...]

    @property
    def has_cuda(self) -> bool:
        return bool(self.entries)


def may_be_shared_object(name: str) -> bool:
    """Whether a file name looks like a shared object the gate checks (`x.so`, `x.cpython-311.so`, `x.so.1`)."""
    return ".so" in PurePosixPath(name).suffixes


def read(targets: Iterable[str | Path]) -> tuple[list[SharedObject], str | None]:
    """The shared objects in `targets` (one wheel, directories, `.so` files) and the wheel's platform tag if one
    wheel was given; a target that does not exist or a wheel mixed with others is bad input."""
    paths = [Path(target) for target in targets]
    if not paths:
        raise BadInput("no wheel, directory or .so file given; pass what to gate")
    for path in paths:
        if not path.exists():
            raise BadInput(f"{path} does not exist; pass a wheel, an unpacked tree or .so files")
    wheels = [path for path in paths if path.is_file() and path.suffix == ".whl"]
    if wheels:
        if len(paths) > 1:
            raise BadInput(f"{wheels[0]}: gate one wheel at a time (or directories and .so files without a wheel)")
        return from_wheel(wheels[0]), wheels[0].name.removesuffix(".whl").rsplit("-", 1)[-1]
    return from_paths(paths), None


def from_paths(paths: Iterable[Path]) -> list[SharedObject]:
    """Every ELF shared object among `paths`: files as given, directories searched for `*.so*` (shown relative)."""
    found = []
    for path in paths:
        if path.is_dir():
            files = sorted(
                p for p in path.rglob("*.so*") if p.is_file() and not p.is_symlink() and may_be_shared_object(p.name)
            )
            found += [_parse(p.relative_to(path).as_posix(), p.read_bytes()) for p in files if is_elf(p)]
        elif is_elf(path):
            found.append(_parse(str(path), path.read_bytes()))
        else:
            raise BadInput(f"{path} is not an ELF shared object; pass a wheel, a directory or .so files")
    return found


def named(name: str, path: Path) -> SharedObject:
    """The shared object in `path`, shown as `name` (e.g. its path under site-packages)."""
    return _parse(name, path.read_bytes())


def from_bytes(name: str, data: bytes) -> SharedObject | None:
    """The shared object in `data` (e.g. a file in an image layer), shown as `name`; None when it is not ELF."""
    return _parse(name, data) if data.startswith(ELF_MAGIC) else None


def from_wheel(wheel: Path) -> list[SharedObject]:
    """Every ELF shared object inside `wheel`, named by its path in the archive, biggest first in parallel."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.infolist() if not m.is_dir() and may_be_shared_object(m.filename)]
    except (OSError, zipfile.BadZipFile) as exc:
        raise BadInput(f"{wheel}: not a readable wheel ({exc}); pass a .whl file") from None
    members.sort(key=lambda member: -member.file_size)
    workers = max(1, min(len(members), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2, 4))
    with ThreadPoolExecutor(workers) as pool:
        found = list(pool.map(lambda member: from_bytes(member.filename, member_bytes(wheel, member)), members))
    return sorted((obj for obj in found if obj is not None), key=lambda obj: obj.path)


def _parse(name: str, data: bytes) -> SharedObject:
    try:
        entries = tuple(fatbin.read_bytes(data))
    except Failed as exc:
        raise Failed(f"{name}: {exc}") from None
    return SharedObject(name, elf_machine(data), entries)


def elf_machine(header: bytes) -> int | None:
    """The e_machine of ELF bytes (183 aarch64, 62 x86-64), None when they are not ELF."""
    if len(header) < 20 or not header.startswith(ELF_MAGIC):
        return None
    return struct.unpack(">H" if header[5] == 2 else "<H", header[18:20])[0]
