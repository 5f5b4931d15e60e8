"""VERSION: one line `YYYYMMDD.N`, the date of the build series and a counter within that day."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from carry.util.errors import BadInput, read_input
from carry.util.record import record

VERSION_RE = re.compile(r"(\d{4})(\d{2})(\d{2})\.([1-9]\d*)")
FORM = "one line YYYYMMDD.N with a real date and N >= 1, e.g. 20260906.1"


@record(order=True)
class Version:
    date: datetime.date
    number: int

    def __str__(self) -> str:
        return f"{self.date:%Y%m%d}.{self.number}"

    @classmethod
    def parse(cls, text: str, where: str = "VERSION") -> Version:
        match = VERSION_RE.fullmatch(text)
        if not match:
            raise BadInput(f"{where}: bad line {text!r}; expected {FORM}")
        year, month, day, number = (int(g) for g in match.groups())
        try:
            date = datetime.date(year, month, day)
        except ValueError:
            raise BadInput(f"{where}: {text!r} is not a real date; expected {FORM}") from None
        return cls(date, number)

    def bumped(self, today: datetime.date) -> Version:
        """The next version on `today`: `.N+1` on the same day, else `today.1`."""
        if self.date > today:
            raise BadInput(f"VERSION {self} is dated after today ({today:%Y%m%d}, UTC); fix the file by hand")
        return Version(today, self.number + 1) if self.date == today else Version(today, 1)


def today_utc() -> datetime.date:
    return datetime.datetime.now(datetime.timezone.utc).date()


def read(path: Path) -> Version:
    """Read VERSION; a missing file or anything but one well-formed line is bad input."""
    text = read_input(path, lambda exc: f"{path}: cannot read ({exc}); expected {FORM}")
    if text is None:
        from carry.util import prog

        raise BadInput(f"{path}: not found; create it with `{prog.command('version', 'bump')}`")
    version = Version.parse(text.removesuffix("\n"), str(path))
    if version.date > today_utc():
        raise BadInput(f"{path}: {version} is dated after today ({today_utc():%Y%m%d}, UTC); fix the date")
    return version


def following(path: Path) -> Version:
    """The version after the one in `path` (not written); a missing file gives today's `.1`."""
    return read(path).bumped(today_utc()) if path.exists() else Version(today_utc(), 1)


def bump(path: Path) -> Version:
    """Write the next version; a missing file starts at today's `.1`."""
    return write(path, following(path))


def write(path: Path, new: Version) -> Version:
    from carry.util.fsutil import atomic_write_text  # here, not on `version`'s path: only a bump writes

    atomic_write_text(path, f"{new}\n")
    return new
