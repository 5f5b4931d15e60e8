"""`patches/DROPPED.md`: one line per patch `drop` or `refresh` removed, with the verdict, the upstream commit and the
new pin; and the check `wheel` and `image` make of it, so that a dropped patch's bug never ships again from a pin
that lacks upstream's fix.

    - 2026-12-02 0001-fix.patch: MERGED-EXACT against main; upstream commit <sha>; pin <sha>; VERSION 20261202.2
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from carry import version
from carry.config import Config
from carry.util.cache import Cache
from carry.util.errors import BadInput, read_input

LOG_NAME = "DROPPED.md"
# What DROPPED.md records a patch as when upstream has what it did at a known commit (a forced drop says "forced").
HELD_UPSTREAM = ("MERGED-EXACT", "MERGED-MODIFIED", "DELETED-UPSTREAM", "PR-ONLY", "FIXED-UPSTREAM")
ENTRY_RE = re.compile(
    r"^- \d{4}-\d{2}-\d{2} (?P<name>\S+): (?P<verdict>[A-Z-]+) against (?P<ref>.+?); "
    r"upstream commit (?P<commit>[0-9a-f]{40}|unknown)(?:;|$)"
)


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    verdict: str
    ref: str
    commit: str  # the 40-hex upstream commit (entries naming none are not held_entries')


def read_log(path: Path) -> str:
    """DROPPED.md as it is, ending with a newline ('' when there is none yet)."""
    text = read_input(path, lambda exc: f"{path}: cannot read ({exc}); fix or move the file") or ""
    return text if not text or text.endswith("\n") else text + "\n"


def log_line(name: str, what: str, commit: str | None, current: str, pin: str | None = None) -> str:
    """One DROPPED.md entry: date, patch, verdict, upstream commit, the pin it moved to (if it did), VERSION."""
    moved = f"; pin {pin}" if pin else ""
    return (
        f"- {version.today_utc():%Y-%m-%d} {name}: {what}; upstream commit {commit or 'unknown'}{moved}; "
        f"VERSION {current}"
    )


def held_entries(path: Path) -> list[Entry]:
    """The entries of patches dropped because upstream has what they did at a known commit (not forced ones)."""
    found = []
    for line in read_log(path).splitlines():
        match = ENTRY_RE.match(line)
        if match and match["verdict"] in HELD_UPSTREAM and match["commit"] != "unknown" and "forced" not in line:
            found.append(Entry(match["name"], match["verdict"], match["ref"], match["commit"]))
    return found


def check_pin(config: Config, cache: Cache, mirror: Path, patches_dir: Path) -> None:
    """Bad input when DROPPED.md says upstream has a dropped patch's change at a commit the pin does not contain (the
    build would ship its bug again); a `dropped` line for each commit nobody can tell about (offline)."""
    from carry.source import git, upstream
    from carry.util import prog, reporter

    pin = config.upstream.commit
    for entry in held_entries(patches_dir / LOG_NAME):
        if entry.commit == pin or (git.has_commit(mirror, entry.commit) and git.is_ancestor(mirror, entry.commit, pin)):
            continue
        if not git.has_commit(mirror, entry.commit):
            try:
                upstream.resolve_ref(config, cache, entry.commit)
            except BadInput:
                reporter.phase(
                    "dropped",
                    f"{LOG_NAME} says upstream has {entry.name} at {entry.commit[:12]}, which upstream cannot "
                    f"give now: not checked that the pin holds it",
                )
                continue
        found, _ = upstream.merge_base(config, cache, mirror, pin, entry.commit)
        if found == entry.commit:
            continue
        raise BadInput(
            f"{patches_dir.name}/{LOG_NAME} records {entry.name} as {entry.verdict} at upstream commit "
            f"{entry.commit[:12]}, which the pin {pin[:12]} does not contain: this build would ship its bug again; "
            f"move the pin there with `{prog.command('refresh', '--onto', entry.commit)}`"
        )
