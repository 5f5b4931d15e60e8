"""A tar archive read front to back from a stream through one reused buffer: the standard library's stream mode copies
every block several times (about 20 MB/s of small files); this reads at the inflater's speed. ustar, GNU (long names,
base-256 sizes) and pax (path, linkpath, size) headers, as image layers are written."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import TYPE_CHECKING

from carry.util.errors import Failed

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

BLOCK = 512
CHUNK = 1 << 20
ZERO = bytes(BLOCK)
REGULAR = (b"0", b"\0", b"7")


@dataclasses.dataclass(frozen=True)
class Header:
    name: str
    mode: int
    size: int
    kind: bytes  # the typeflag: b"0" file, b"1" hard link, b"2" symlink, b"5" directory, ...
    linkname: str

    @property
    def is_file(self) -> bool:
        return self.kind in REGULAR

    @property
    def is_dir(self) -> bool:
        return self.kind == b"5"

    @property
    def is_symlink(self) -> bool:
        return self.kind == b"2"

    @property
    def is_hardlink(self) -> bool:
        return self.kind == b"1"


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _number(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax(data: bytes) -> dict[str, str]:
    records, at = {}, 0
    while at < len(data):
        space = data.index(b" ", at)
        length = int(data[at:space])
        key, _, value = data[space + 1 : at + length - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        at += length
    return records


class Reader:
    """Members of the tar in `stream`, one at a time: `next()` the next header (skipping what was not read),
    `read_data(sink)` its data in chunks (memoryviews valid only during the call), `member_stream()` it as a stream."""

    def __init__(self, stream: io.BufferedIOBase, where: str):
        self.stream, self.where = stream, where
        self.buffer = memoryview(bytearray(CHUNK))
        self.pending = 0  # data bytes of the current member not read yet
        self.padding = 0

    def _exact(self, size: int) -> bytes:
        data = self.stream.read(size)
        if len(data) != size:
            raise Failed(f"{self.where}: the tar ends in the middle of a member")
        return data

    def next(self) -> Header | None:
        self.read_data(None)
        overrides: dict[str, str] = {}
        while True:
            block = self.stream.read(BLOCK)
            if len(block) < BLOCK or block == ZERO:
                return None
            name, size, kind = _text(block[0:100]), _number(block[124:136]), block[156:157]
            if block[257:262] == b"ustar" and block[345:500].strip(b"\0"):
                name = f"{_text(block[345:500])}/{name}"
            padding = -size % BLOCK
            if kind in (b"x", b"g", b"L", b"K"):
                data = self._exact(size)
                self._exact(padding)
                if kind == b"x":
                    overrides.update(_pax(data))
                elif kind == b"L":
                    overrides["path"] = _text(data)
                elif kind == b"K":
                    overrides["linkpath"] = _text(data)
                continue  # global pax headers hold nothing a layer's paths depend on
            if "size" in overrides:
                size = int(overrides["size"])
                padding = -size % BLOCK
            link = overrides.get("linkpath", _text(block[157:257]))
            self.pending, self.padding = size, padding
            return Header(overrides.get("path", name), _number(block[100:108]), size, kind, link)

    def read_data(self, sink: Callable[[memoryview], None] | None) -> None:
        while self.pending:
            size = self.stream.readinto(self.buffer[: min(CHUNK, self.pending)])
            if not size:
                raise Failed(f"{self.where}: the tar ends in the middle of a member")
            if sink is not None:
                sink(self.buffer[:size])
            self.pending -= size
        if self.padding:
            self._exact(self.padding)
            self.padding = 0

    def member_stream(self) -> io.BufferedReader:
        return io.BufferedReader(_Member(self), CHUNK)


class _Member(io.RawIOBase):
    def __init__(self, reader: Reader):
        self.reader = reader

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        if not self.reader.pending:
            return 0
        view = memoryview(buffer)[: self.reader.pending]
        size = self.reader.stream.readinto(view)
        if not size:
            raise Failed(f"{self.reader.where}: the tar ends in the middle of a member")
        self.reader.pending -= size
        return size
