"""Apply the series in order onto a base commit in a private index: strict context, offsets reported."""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
from pathlib import Path

from carry.source import git
from carry.source.series import Hunk, Patch, Series
from carry.util.record import record

# git apply's report, read only when git ran: compiled then (re's cache), not when a check is read back
HUNK_OFFSET_RE = r"^Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)\."
CHECKING_RE = r"^Checking patch (.+)\.\.\.$"
FAILED_AT_RE = r"^error: patch failed: (.+):(\d+)$"
FILE_ERROR_RE = r"^error: (.+?): (does not exist in index|already exists in index|patch does not apply)$"


class PatchStatus(enum.Enum):
    CLEAN = "clean"
    OFFSET = "offset"
    FAILED = "failed"


@record
class Mismatch:
    """Where a hunk stopped matching: the file, the hunk header and the first context line that differs."""

    file: str
    hunk: str | None
    line: int | None
    expected: str | None
    found: str | None

    def to_json(self) -> dict:
        return {"file": self.file, "hunk": self.hunk, "line": self.line, "expected": self.expected, "found": self.found}

    def describe(self) -> str:
        where = f"{self.file}, hunk {self.hunk}" if self.hunk else self.file
        if self.expected is None:
            return f"{where}: {self.found}"
        return f"{where}: line {self.line} expected {self.expected!r}, found {self.found!r}"


@record
class PatchResult:
    patch: Patch
    status: PatchStatus
    offsets: tuple[str, ...] = ()
    failure: Mismatch | None = None

    def to_json(self) -> dict:
        return {
            **self.patch.summary(),
            "status": self.status.value,
            "offsets": list(self.offsets),
            "failure": self.failure.to_json() if self.failure else None,
        }


@record
class CheckReport:
    base: str
    series_hash: str
    tree: str | None
    results: tuple[PatchResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.status is not PatchStatus.FAILED for r in self.results)

    def patched_tree(self) -> str:
        """The patched tree; a series that does not apply is a failed job, named with its first failing patch."""
        if self.tree is not None:
            return self.tree
        from carry.util.errors import Failed

        failed = next(r for r in self.results if r.status is PatchStatus.FAILED)
        why = f" ({failed.failure.describe()})" if failed.failure else ""
        raise Failed(
            f"the series does not apply on {self.base[:12]}: {failed.patch.name} failed{why}; nothing was built; "
            f"run `check` for details"
        )

    def to_json(self) -> dict:
        return {
            "base": self.base,
            "series_hash": self.series_hash,
            "tree": self.tree,
            "ok": self.ok,
            "patches": [r.to_json() for r in self.results],
        }


def check(mirror: Path, base: str, series: Series, scratch: Path) -> CheckReport:
    """Apply each patch on base + all earlier patches; the tree id is set only when every patch applied. The answer
    depends only on the base commit and the patches' bytes, so it is kept in the mirror (carry/checks/) and read
    back by a second check of the same series on the same base while the tree it names is still there."""
    if (known := _known(mirror, base, series)) is not None:
        return known
    report = _check(mirror, base, series, scratch)
    _remember(mirror, report)
    return report


def _check(mirror: Path, base: str, series: Series, scratch: Path) -> CheckReport:
    with git.temp_index(mirror, scratch) as env:
        git.read_tree(mirror, base, env)
        results = _all_at_once(mirror, base, series, env)
        if results is None:
            results = tuple(apply_patch(mirror, patch, env) for patch in series.patches)
        ok = all(r.status is not PatchStatus.FAILED for r in results)
        tree = git.write_tree(mirror, env) if ok else None
    return CheckReport(base=base, series_hash=series.hash, tree=tree, results=results)


RESULT_FORMAT = 1


def _result_path(mirror: Path, base: str, series_hash: str) -> Path:
    return mirror / "carry" / "checks" / f"{base}-{series_hash}.json"


def _known(mirror: Path, base: str, series: Series) -> CheckReport | None:
    """The remembered report of this series on this base, or None (never checked, or its tree is gone)."""
    if len(base) != 40:
        return None
    try:
        data = json.loads(_result_path(mirror, base, series.hash).read_text())
        if data["format"] != RESULT_FORMAT or [r["name"] for r in data["results"]] != [p.name for p in series.patches]:
            return None
        tree = data["tree"]
        if tree is not None and not (mirror / "objects" / tree[:2] / tree[2:]).is_file():
            return None  # only a loose tree is known to be there without asking git: check again
        results = tuple(
            PatchResult(
                patch, PatchStatus(r["status"]), tuple(r["offsets"]), Mismatch(**r["failure"]) if r["failure"] else None
            )
            for patch, r in zip(series.patches, data["results"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return CheckReport(base=base, series_hash=series.hash, tree=tree, results=results)


def _remember(mirror: Path, report: CheckReport) -> None:
    if len(report.base) != 40:
        return
    path = _result_path(mirror, report.base, report.series_hash)
    data = {
        "format": RESULT_FORMAT,
        "tree": report.tree,
        "results": [
            {
                "name": r.patch.name,
                "status": r.status.value,
                "offsets": list(r.offsets),
                "failure": r.failure.to_json() if r.failure else None,
            }
            for r in report.results
        ],
    }
    with contextlib.suppress(OSError):  # only a cache
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)


def _all_at_once(mirror: Path, base: str, series: Series, env: dict[str, str]) -> tuple[PatchResult, ...] | None:
    """The usual case in one git process: the whole series applies (each patch's part of git's report found by its
    files' "Checking patch" lines); None, the index as it was, when a patch fails: one by one then says which."""
    if len(series.patches) < 2:
        return None
    status, report = git.apply_cached_all(mirror, [p.path for p in series.patches], env)
    if status != 0:
        return None
    parts = re.split(r"(?m)^(?=Checking patch )", report)
    checks = [part for part in parts if part.startswith("Checking patch ")]
    if len(checks) != sum(len(p.diffs) for p in series.patches):
        git.read_tree(mirror, base, env)  # git reported otherwise than expected: do it one by one
        return None
    results, index = [], 0
    for patch in series.patches:
        mine = "".join(checks[index : index + len(patch.diffs)])
        index += len(patch.diffs)
        results.append(_applied(patch, mine))
    return tuple(results)


def apply_patch(mirror: Path, patch: Patch, env: dict[str, str]) -> PatchResult:
    """Apply one patch into the index in `env`; on failure the index is left as it was."""
    status, report = git.apply_cached(mirror, patch.path, env)
    if status == 0:
        return _applied(patch, report)
    return PatchResult(patch, PatchStatus.FAILED, failure=_diagnose(mirror, patch, report, env))


def _applied(patch: Patch, report: str) -> PatchResult:
    """The patch applied: CLEAN, or OFFSET with each hunk git applied elsewhere, named from its report."""
    current = "?"
    found = []
    for line in report.splitlines():
        if checking := re.match(CHECKING_RE, line):
            current = checking.group(1)
        if offset := re.match(HUNK_OFFSET_RE, line):
            number, at, delta = offset.groups()
            found.append(f"{current}: hunk #{number} applied at line {at} (offset {delta} lines)")
    return PatchResult(patch, PatchStatus.OFFSET if found else PatchStatus.CLEAN, tuple(found))


def _diagnose(mirror: Path, patch: Patch, report: str, env: dict[str, str]) -> Mismatch:
    """Name the file, hunk and first mismatching line from git's report and the index's blob."""
    for line in report.splitlines():
        if failed := re.match(FAILED_AT_RE, line):
            name, start = failed.group(1), int(failed.group(2))
            hunk = _find_hunk(patch, name, start)
            blob = git.show_blob(mirror, f":{name}", env)
            if hunk is None or blob is None:
                return Mismatch(name, hunk.header if hunk else None, start, None, "does not apply")
            return _first_mismatch(name, hunk, blob.split("\n"))
        if file_error := re.match(FILE_ERROR_RE, line):
            return Mismatch(file_error.group(1), None, None, None, file_error.group(2))
    lines = [line for line in report.splitlines() if line.startswith("error:")]
    first = patch.files[0] if patch.files else "?"
    return Mismatch(first, None, None, None, lines[0] if lines else "git apply failed")


def _find_hunk(patch: Patch, name: str, start: int) -> Hunk | None:
    diff = next((d for d in patch.diffs if name in (d.old_path, d.new_path)), None)
    hunks = diff.hunks if diff is not None else ()
    return next((h for h in hunks if h.old_start == start), hunks[0] if hunks else None)


def _first_mismatch(name: str, hunk: Hunk, lines: list[str]) -> Mismatch:
    first = max(hunk.old_start - 1, 0)
    for offset, expected in enumerate(hunk.old_lines):
        index = first + offset
        found = lines[index] if index < len(lines) else None
        if found != expected:
            return Mismatch(name, hunk.header, index + 1, expected, found if found is not None else "<end of file>")
    return Mismatch(name, hunk.header, hunk.old_start, None, "context matches here but git could not apply it")
