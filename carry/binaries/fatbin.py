"""List the cubins and PTX in a shared object's ``.nv_fatbin`` section, without cuobjdump.

Layout (observed on nvcc 13 output and cross-checked against cuobjdump in the tests): the section holds one or more
fatbins back to back, each starting at the section's alignment (the linker pads with zeros where a fatbin's size is
not a multiple of it, as aarch64 links do). A fatbin is a 16-byte header (u32 magic 0xBA55ED50, u16 version, u16
header size, u64 payload size) followed by entries. Each entry starts with u16 kind, u16 version, u32 header size,
u64 payload size; its u32 arch (e.g. 121) sits at 0x1C and its u32 flags at 0x28, where 0x100000 marks an 'a' and
0x200000 an 'f' target.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from carry.arch import Variant
from carry.util.errors import Failed

SECTION = ".nv_fatbin"
ELF_MAGIC = b"\x7fELF"
FATBIN_MAGIC = 0xBA55ED50
_FATBIN_HEADER = struct.Struct("<IHHQ")
_ENTRY_HEADER = struct.Struct("<HHIQ")
_ARCH_OFFSET = 0x1C
_FLAGS_OFFSET = 0x28
_ENTRY_HEADER_MIN = _FLAGS_OFFSET + 4
_VARIANT_FLAGS = {0x100000: Variant.ARCH_SPECIFIC, 0x200000: Variant.FAMILY}


class Kind(Enum):
    """What a fatbin entry holds; entries of other kinds (LTO IR and the like) are skipped."""

    PTX = 1
    CUBIN = 2


@dataclass(frozen=True)
class FatbinEntry:
    """One cubin or PTX image, by target architecture."""

    kind: Kind
    major: int
    minor: int
    variant: Variant = Variant.PLAIN

    @property
    def capability(self) -> tuple[int, int]:
        return (self.major, self.minor)

    def __str__(self) -> str:
        prefix = "sm" if self.kind is Kind.CUBIN else "compute"
        return f"{prefix}_{self.major}{self.minor}{self.variant.value}"


class _Corrupt(Exception):
    """A fatbin that does not follow the layout; reported as `Failed` with the file name."""


def is_elf(path: Path) -> bool:
    with open(path, "rb") as stream:
        return stream.read(len(ELF_MAGIC)) == ELF_MAGIC


def read(path: str | Path) -> list[FatbinEntry]:
    """Every cubin and PTX entry in `path`, in section order; [] for a non-ELF or CPU-only file."""
    path = Path(path)
    if not is_elf(path):
        return []
    try:
        return read_bytes(path.read_bytes())
    except Failed as exc:
        raise Failed(f"{path}: {exc}") from None


def read_bytes(data: bytes) -> list[FatbinEntry]:
    """Every cubin and PTX entry in the ELF file `data`, in section order; [] for non-ELF or CPU-only code."""
    return [entry for entry, _ in read_images(data)]


def read_images(data: bytes) -> list[tuple[FatbinEntry, bytes]]:
    """Every cubin and PTX entry in the ELF file `data` (a shared object or a relocatable object) with its image as
    stored (compressed where nvcc compressed it), in section order; [] for non-ELF or CPU-only code."""
    if not data.startswith(ELF_MAGIC):
        return []
    try:
        section, align = _section_data(data)
        return _parse_section(section, align) if section else []
    except (ELFError, _Corrupt, struct.error) as error:
        raise Failed(f"corrupt {SECTION} section ({error})") from None


def _section_data(data: bytes) -> tuple[bytes, int]:
    """The section's bytes and its alignment."""
    section = ELFFile(io.BytesIO(data)).get_section_by_name(SECTION)
    if section is None:
        return b"", 1
    return section.data(), max(1, section["sh_addralign"])


def _parse_section(data: bytes, align: int = 1) -> list[tuple[FatbinEntry, bytes]]:
    entries: list[tuple[FatbinEntry, bytes]] = []
    offset = 0
    while offset < len(data) and not _only_padding(data, offset):
        magic, _version, header_size, payload_size = _FATBIN_HEADER.unpack_from(data, offset)
        if magic != FATBIN_MAGIC:
            raise _Corrupt(f"bad fatbin magic {magic:#x} at offset {offset:#x}")
        start, offset = offset + header_size, offset + header_size + payload_size
        entries.extend(_parse_fatbin(data, start, _bounded(offset, len(data))))
        offset = _skip_alignment_padding(data, offset, align)
    return entries


def _skip_alignment_padding(data: bytes, offset: int, align: int) -> int:
    """The next fatbin's offset: `offset` rounded up to `align` when the bytes between are zeros."""
    aligned = min(-(-offset // align) * align, len(data))
    return aligned if data.count(0, offset, aligned) == aligned - offset else offset


def _parse_fatbin(data: bytes, offset: int, end: int) -> list[tuple[FatbinEntry, bytes]]:
    entries: list[tuple[FatbinEntry, bytes]] = []
    while offset < end:
        kind, _version, header_size, payload_size = _ENTRY_HEADER.unpack_from(data, offset)
        if header_size < _ENTRY_HEADER_MIN:
            raise _Corrupt(f"entry header of {header_size} bytes at offset {offset:#x}")
        start, after = offset + header_size, _bounded(offset + header_size + payload_size, end)
        if kind in (Kind.PTX.value, Kind.CUBIN.value):
            entries.append((_entry(data, offset, Kind(kind)), data[start:after]))
        offset = after
    return entries


def _entry(data: bytes, offset: int, kind: Kind) -> FatbinEntry:
    (arch,) = struct.unpack_from("<I", data, offset + _ARCH_OFFSET)
    (flags,) = struct.unpack_from("<I", data, offset + _FLAGS_OFFSET)
    variant = next((v for bit, v in _VARIANT_FLAGS.items() if flags & bit), Variant.PLAIN)
    major, minor = divmod(arch, 10)
    return FatbinEntry(kind, major, minor, variant)


def _only_padding(data: bytes, offset: int) -> bool:
    # A header starts with the non-zero magic, so the scan to the end runs once, at the padding, not per fatbin.
    return data[offset] == 0 and data.count(0, offset) == len(data) - offset


def _bounded(offset: int, end: int) -> int:
    if offset > end:
        raise _Corrupt(f"size runs past the end ({offset:#x} > {end:#x})")
    return offset
