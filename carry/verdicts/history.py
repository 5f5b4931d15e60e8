"""Why a file a patch changes is not on REF, from upstream's history: deleted upstream, renamed, or only on the
carried PR's side. Their merge base M decides: a file M has and REF lacks went away upstream; a file M lacks was
added on the base's side, which REF does not contain.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from pathlib import Path

from carry.source import git
from carry.util import reporter

# A commit as the evidence names it: the full SHA and its subject.
FORMAT = "--format=%H%x00%s"


class Gone(enum.Enum):
    DELETED = "deleted upstream"
    PR_ONLY = "only the PR adds it"
    UNKNOWN = "not known why"


@dataclasses.dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    def describe(self) -> str:
        return f"{self.sha[:12]} {self.subject!r}"


@dataclasses.dataclass(frozen=True)
class Absence:
    """Why `path` is not on REF, the commit that shows it when history has it, and the evidence in words."""

    path: str
    why: Gone
    commit: Commit | None
    evidence: str


class History:
    """History between the pinned base and one REF; the merge base found through `deepen` when asked (else a note)."""

    def __init__(self, mirror: Path, base: str, ref: str, commit: str, deepen: Callable[[], tuple[str | None, str]]):
        self.mirror = mirror
        self.base = base
        self.ref = ref
        self.commit = commit
        self._deepen = deepen
        self._merge_base: tuple[str | None, str] | None = None
        self._renames: dict[tuple[str, str], dict[str, str]] = {}
        self._added: dict[str, list[str]] = {}
        self._absences: dict[str, Absence] = {}

    @property
    def merge_base(self) -> str | None:
        return self._lookup()[0]

    @property
    def unknown(self) -> str:
        """Why the merge base could not be found out (no common history fetched), once it was asked; else ""."""
        return self._merge_base[1] if self._merge_base else ""

    def _lookup(self) -> tuple[str | None, str]:
        if self._merge_base is None:
            self._merge_base = self._deepen()
            if self._merge_base[1]:
                reporter.note(self._merge_base[1])
        return self._merge_base

    def moved(self, path: str) -> str | None:
        """Where upstream renamed `path` between the merge base (else the base) and REF, or None."""
        start = self.merge_base or self.base
        return self._renames_for(start, path).get(path)

    def renamed_by(self, old: str, new: str) -> Commit | None:
        """The newest commit on REF's side that renamed `old` to `new`, when the history has it."""
        start = self.merge_base or self.base
        args = ("log", "-1", "-M", "--diff-filter=R", FORMAT, self.commit, "--not", start, "--", old, new)
        return _commit(git.run(self.mirror, *args))

    def absence(self, path: str) -> Absence:
        """Why `path` (on the base, not renamed) is not on REF; asked once per path (every hunk of a gone file asks)."""
        if path not in self._absences:
            self._absences[path] = self._absence(path)
        return self._absences[path]

    def _absence(self, path: str) -> Absence:
        merge_base = self.merge_base
        if merge_base is None:
            why = self.unknown or "the base and REF share no history"
            told = f"whether upstream deleted it or only the PR adds it cannot be told: {why}"
            return Absence(path, Gone.UNKNOWN, None, f"{path} is not in REF, and {told}")
        at = f"{merge_base[:12]} {git.subject(self.mirror, merge_base)!r}"
        if has(self.mirror, merge_base, path):
            args = ("log", "-1", "--diff-filter=D", FORMAT, self.commit, "--not", self.base, "--", path)
            deleted = _commit(git.run(self.mirror, *args))
            if deleted is None:
                told = "deleted upstream, by a commit this mirror's history does not reach"
                return Absence(path, Gone.DELETED, None, f"{path} is in the merge base {at} and not in REF: {told}")
            told = f"(it is in the merge base {at}, not in REF)"
            return Absence(path, Gone.DELETED, deleted, f"{path} was deleted upstream by {deleted.describe()} {told}")
        args = ("log", "--diff-filter=A", "--reverse", FORMAT, self.base, "--not", merge_base, "--", path)
        added = _commit(git.run(self.mirror, *args).split("\n", 1)[0])
        side = "only the PR's side of history has it" + (f", added by {added.describe()}" if added else "")
        shares = f"REF shares only the merge base {at} with it: the PR that adds this file is not in REF"
        return Absence(path, Gone.PR_ONLY, added, f"{path} is not in REF: {side}; {shares}")

    def _renames_for(self, start: str, path: str) -> dict[str, str]:
        """old -> new for files renamed between `start` and REF, with rename detection run only for `path` against
        the files REF added (a full rename search of a 9,600-file tree costs a quarter second)."""
        key = (start, path)
        if key not in self._renames:
            added = self._added_since(start)
            args = ("--find-renames", "--name-status", "-z", start, self.commit, "--", path, *added)
            self._renames[key] = parse_renames(git.run(self.mirror, "diff", *args, strip=False)) if added else {}
        return self._renames[key]

    def _added_since(self, start: str) -> list[str]:
        """The files REF added since `start` (one git diff per start, whatever the paths asked about)."""
        if start not in self._added:
            args = ("--no-renames", "--diff-filter=A", "--name-only", "-z", start, self.commit)
            out = git.run(self.mirror, "diff", *args, strip=False)
            self._added[start] = [name for name in out.split("\0") if name]
        return self._added[start]


def parse_renames(out: str) -> dict[str, str]:
    """old -> new from `git diff --name-status -z` output."""
    fields = out.split("\0")
    renames = {}
    index = 0
    while index < len(fields) and fields[index]:
        status = fields[index]
        if status.startswith(("R", "C")):
            renames[fields[index + 1]] = fields[index + 2]
            index += 3
        else:
            index += 2
    return renames


def _commit(line: str) -> Commit | None:
    sha, sep, subject = line.strip("\n").partition("\0")
    return Commit(sha, subject) if sep else None


def has(mirror: Path, commit: str, path: str) -> bool:
    status, _, _ = git.run_status(mirror, "cat-file", "-e", f"{commit}:{path}")
    return status == 0
