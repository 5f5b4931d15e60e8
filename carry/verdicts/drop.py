"""`drop`: remove a patch REF needs no more, carry the rest of the series over to the new pin, bump VERSION once and
log it in `patches/DROPPED.md`.

A merged patch moves the pin (never back) to the commit that merged it, else REF's, or to `--onto REF`; with
`upstream.pr` set, to the PR head, which must hold that commit. Another droppable verdict moves it only with `--onto`.
DROPPED.md names the commit the pin must hold, and `wheel` and `image` refuse a pin without it (droplog.check_pin).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from carry import version
from carry.config import Config
from carry.source import upstream
from carry.source.series import Series
from carry.util import prog, reporter
from carry.util.cache import Cache
from carry.util.errors import BadInput, Failed
from carry.util.record import record
from carry.verdicts import droplog, rebase, refresh, verdicts


@dataclasses.dataclass(frozen=True)
class Dropped:
    name: str
    verdict: verdicts.PatchVerdict
    version: str
    line: str
    carried: refresh.Carried

    def lines(self) -> list[str]:
        return [self.line, *self.carried.lines(), f"VERSION {self.version}"]


@record(kw_only=True)
class Request:
    """What `drop` was asked: the patch `name`, the ref judged against (None: upstream.main), `force` and `onto`."""

    name: str
    against: str | None = None
    force: bool = False
    onto: str | None = None


@record(kw_only=True)
class _Move:
    """Where the pin must go for the dropped patch `name`: judged against `ref`, `needs` the commit the pin must
    hold (None when forced), `merged` the verdict's, `onto` the --onto asked."""

    name: str
    ref: str
    needs: str | None
    merged: bool
    onto: str | None


def drop(
    config: Config,
    cache: Cache,
    series: Series,
    request: Request,
    *,
    judge: Callable | None = None,
    repin: refresh.Repin | None = None,
) -> Dropped:
    """Drop `request.name` when REF (default upstream.main) needs it no more, else only with `force`; the pin moves
    (see the module's doc), `repin` moving the precompiled pins first (as for `refresh`)."""
    name, against, force, onto = request.name, request.against, request.force, request.onto
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
    mirror = upstream.ensure_base(config, cache)
    # Where upstream has what the patch did: the commit status named, else REF's own. The pin must come to hold it
    # (now for a merged patch; a refresh later for the others, until which `wheel` refuses; droplog.check_pin).
    needs = None if forced else (found.commit or report.reports[0].commit)
    move = _Move(name=patch.name, ref=ref, needs=needs, merged=found.verdict.merged, onto=onto)
    target = _new_pin(config, cache, mirror, move)
    try:
        carried = refresh.carry_over(config, cache, mirror, series, target, leave_out=patch.name)
    except rebase.Conflict as conflict:
        where = f"{onto} " if onto else ("the PR head " if config.upstream.pr is not None else "")
        raise Failed(
            f"{conflict.patch.name} conflicts with {where}{target[:12]} in {conflict.files}: the pin cannot move "
            f"there, where {ref} has {patch.name}; nothing was changed; rebase {conflict.patch.name} onto "
            f"{target[:12]} by hand, then drop again"
        ) from None
    refresh.moved_pins(carried, repin)
    bumped = str(version.following(config.version_file))
    what = f"{found.verdict.value} against {ref}" + ("; forced with --force, not merged upstream" if forced else "")
    line = droplog.log_line(patch.name, what, needs or found.commit, bumped, target if carried.moved else None)
    refresh.write(config, series, carried, f"empty on the new pin {target[:12]} (already upstream)", (patch.name, line))
    if (
        needs is not None
        and not carried.moved
        and target != needs
        and not _contains(config, cache, mirror, target, needs)
    ):
        reporter.note(
            f"the pin stays at {target[:12]}, which lacks {needs[:12]} ({ref}): a build from it would miss what "
            f"{patch.name} did, so `wheel` and `image` refuse it until `{prog.command('refresh', '--onto', ref)}` "
            f"moves the pin"
        )
    return Dropped(patch.name, found, bumped, line, carried)


def _new_pin(config: Config, cache: Cache, mirror: Path, move: _Move) -> str:
    """Where the pin goes: `onto`, else for a merged patch the PR head (upstream.pr set) or the commit that merged
    it (`needs`), which the new pin must hold; else it stays. Never back to a commit the pin already holds."""
    name, ref, needs, onto = move.name, move.ref, move.needs, move.onto
    pin = config.upstream.commit
    merged_at = needs if move.merged else None
    if onto is not None:
        target = upstream.resolve_ref(config, cache, onto)
        merged_at = needs
    elif merged_at is None:
        return pin
    elif config.upstream.pr is not None:
        fetched = upstream.fetch(config, cache)
        if fetched.pr_head is None:
            raise Failed(
                f"{name}: upstream.pr is set, so the pin stays on PR #{config.upstream.pr}, but its head could not be "
                f"read; nothing was changed; drop again once upstream answers"
            )
        target = fetched.pr_head.sha
    else:
        target = merged_at
    if target != pin and _contains(config, cache, mirror, pin, target):
        target = pin  # the pin is newer already: it stays
    if merged_at is not None and not _contains(config, cache, mirror, target, merged_at):
        if onto is not None:
            raise Failed(
                f"{onto} ({target[:12]}) does not contain {merged_at[:12]}, where {ref} has {name}: a wheel of it "
                f"would ship the bug again; nothing was changed; pass an --onto that holds it, or leave --onto out"
            )
        raise Failed(
            f"{ref} has {name} at {merged_at[:12]}, which the head of PR #{config.upstream.pr} ({target[:12]}) "
            f"does not contain, and the pin stays on the PR; nothing was changed; once the PR holds it, "
            f"`{prog.command('fetch', '--update-pin')}` moves the pin there (then drop again), or move the carry "
            f"off the PR with `{prog.command('refresh', '--onto', ref)}`"
        )
    return target


def _contains(config: Config, cache: Cache, mirror: Path, commit: str, ancestor: str) -> bool:
    """Whether `commit` holds `ancestor` in its history (a shallow mirror deepened to tell, else a note)."""
    if commit == ancestor:
        return True
    found, unknown = upstream.merge_base(config, cache, mirror, commit, ancestor)
    if unknown:
        reporter.note(unknown)
    return found == ancestor
