"""Recorded conflict resolutions in git rerere's format, committed with the series: `patches/resolutions/<patch>/<id>/`
preimage (the conflict, its sides in a stable order) and postimage (the resolution). `<id>` is rerere's hash of the
conflict's text, so an entry answers the same conflict wherever it comes back, and no other."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from carry.util.errors import BadInput

DIR_NAME = "resolutions"
IMAGES = ("preimage", "postimage")
REPLAYED_RE = re.compile(r"^(?:Resolved|Staged) '(.+)' using previous resolution\.$")


def install(patches_dir: Path, git_dir: Path) -> None:
    """Hand every recorded entry to rerere in `git_dir` (rr-cache/<id>/)."""
    for entry in _entries(patches_dir):
        target = git_dir / "rr-cache" / entry.name
        target.mkdir(parents=True, exist_ok=True)
        for image in entry.iterdir():
            shutil.copyfile(image, target / image.name)


def _entries(patches_dir: Path, name: str = "*") -> list[Path]:
    return sorted(p for p in (patches_dir / DIR_NAME).glob(f"{name}/*") if (p / "postimage").is_file())


def recorded_for(patches_dir: Path, name: str) -> tuple[str, ...]:
    """The ids of the entries recorded for patch `name`."""
    return tuple(p.name for p in _entries(patches_dir, name))


def current(git_dir: Path) -> dict[str, str]:
    """file -> rerere id of the conflict in progress (MERGE_RR: `<id>[.<variant>]<TAB><path><NUL>`)."""
    try:
        data = (git_dir / "MERGE_RR").read_bytes().decode("utf-8", errors="surrogateescape")
    except FileNotFoundError:
        return {}
    items = (item.partition("\t") for item in data.split("\0"))
    return {path: entry.split(".")[0] for entry, _, path in items if path}


def replayed(stderr: str) -> list[str]:
    """The files rerere resolved from a recorded entry, as git says it."""
    return [m.group(1) for line in stderr.splitlines() if (m := REPLAYED_RE.match(line.strip()))]


def record(git_dir: Path, merge_rr: dict[str, str], patches_dir: Path, name: str) -> list[Path]:
    """Copy what rerere just recorded for patch `name`'s conflict under `patches_dir`/resolutions/`name`/; the paths."""
    written = []
    for entry in sorted(set(merge_rr.values())):
        source = git_dir / "rr-cache" / entry
        if not (source / "postimage").is_file():
            continue
        target = patches_dir / DIR_NAME / name / entry
        target.mkdir(parents=True, exist_ok=True)
        for image in IMAGES:
            shutil.copyfile(source / image, target / image)
            written.append(target / image)
    return written


def forget(patches_dir: Path, name: str) -> bool:
    """Remove the entries of a patch that left the series; whether there were any."""
    found = patches_dir / DIR_NAME / name
    if not found.is_dir():
        return False
    shutil.rmtree(found)
    if not any((patches_dir / DIR_NAME).iterdir()):
        (patches_dir / DIR_NAME).rmdir()
    return True


def unresolved(name: str, where: Path, shown: str) -> BadInput:
    return BadInput(
        f"{name}: conflict markers are still in {where} ({shown}); resolve them there, then run "
        f"`follow --continue` again"
    )
