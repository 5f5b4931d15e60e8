"""`drop`: remove a patch REF needs no more (merged, fixed upstream, or its file deleted upstream or only in the PR),
bump VERSION and log it in `patches/DROPPED.md`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from carry import version
from carry.config import Config
from carry.source.series import Series
from carry.util.cache import Cache
from carry.util.errors import BadInput
from carry.util.fsutil import atomic_write_text
from carry.verdicts import verdicts

LOG_NAME = "DROPPED.md"


@dataclasses.dataclass(frozen=True)
class Dropped:
    name: str
    verdict: verdicts.PatchVerdict
    version: str
    line: str
    notes: tuple[str, ...]


def drop(
    config: Config,
    cache: Cache,
    series: Series,
    name: str,
    against: str | None,
    force: bool,
    judge: Callable | None = None,
) -> Dropped:
    """Drop `name` when REF (default upstream.main) needs it no more (a droppable verdict); anything else is refused
    unless `force`."""
    patch = series.find(name)
    ref = against or config.upstream.main
    report = verdicts.status(config, cache, series, (ref,), with_pr=False, trees=judge is not None)
    if judge is not None:  # --test: the patch's test decides too (FIXED-UPSTREAM)
        report = judge(report, series)
    found = report.reports[0].find(patch.name)
    forced = not found.verdict.droppable
    if forced and not force:
        raise BadInput(
            f"{patch.name} is {found.verdict.value} against {ref} (decided by {found.test}); drop needs one of "
            f"{verdicts.Verdict.droppable_names()} (FIXED-UPSTREAM comes from --test): keep the patch, or pass "
            f"--force to drop it anyway"
        )
    log = series.directory / LOG_NAME
    before = read_log(log)
    bumped = str(version.bump(config.version_file))
    what = f"{found.verdict.value} against {ref}" + ("; forced with --force, not merged upstream" if forced else "")
    line = log_line(patch.name, what, found.commit, bumped)
    atomic_write_text(log, before + line + "\n")
    patch.path.unlink()
    return Dropped(patch.name, found, bumped, line, report.notes)


def read_log(path: Path) -> str:
    """DROPPED.md as it is, ending with a newline ('' when there is none yet)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read ({exc}); fix or move the file") from None
    return text if not text or text.endswith("\n") else text + "\n"


def log_line(name: str, what: str, commit: str | None, current: str) -> str:
    """One DROPPED.md entry: date, patch, verdict, upstream commit, VERSION."""
    return f"- {version.today_utc():%Y-%m-%d} {name}: {what}; upstream commit {commit or 'unknown'}; VERSION {current}"
