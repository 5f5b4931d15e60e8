"""`refresh`: move the series onto a new upstream base with a 3-way merge, then rewrite the patches that moved.

Nothing in the project changes until every patch has been carried over (carry/verdicts/rebase.py); then the patches,
DROPPED.md, the pin and VERSION are written (`write`, which `drop` uses too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from carry import version
from carry.config import Config
from carry.source import apply, series, upstream
from carry.util.cache import Cache
from carry.util.errors import Failed
from carry.util.fsutil import atomic_write_text, temp_dir
from carry.verdicts import droplog, rebase


@dataclasses.dataclass(frozen=True)
class Carried:
    """The series on `new_base`: each patch's new text where its substance moved, those emptied, the rest, the tree."""

    old_base: str
    new_base: str
    changed: dict[str, str]
    emptied: tuple[str, ...]
    unchanged: tuple[str, ...]
    tree: str
    replays: tuple[rebase.Replay, ...] = ()

    @property
    def moved(self) -> bool:
        return self.old_base != self.new_base

    def lines(self) -> list[str]:
        rows = [f"pin {self.old_base[:12]} -> {self.new_base}" if self.moved else "pin unchanged"]
        rows += [f"rewritten  {name}" for name in self.changed]
        rows += [f"unchanged  {name}" for name in self.unchanged]
        logged = f"already upstream; removed and logged in {droplog.LOG_NAME}"
        rows += [f"emptied    {name}: {logged}" for name in self.emptied]
        return rows + [replay.line() for replay in self.replays]


@dataclasses.dataclass(frozen=True)
class Refreshed:
    carried: Carried
    version: str | None  # VERSION after the refresh; None when nothing changed (VERSION neither)

    def lines(self) -> list[str]:
        return self.carried.lines() + ([f"VERSION {self.version}"] if self.version else [])


Repin = Callable[[str, str], None]


def refresh(
    config: Config,
    cache: Cache,
    patches: series.Series,
    onto: str | None,
    judge: Callable | None = None,
    repin: Repin | None = None,
) -> Refreshed:
    """Rebase `patches` onto `onto` (default upstream.main); a conflict changes nothing and names the patches REF
    needs no more (`judge` adds their tests' verdict); `repin` moves the precompiled pins before the pin moves."""
    mirror = upstream.ensure_base(config, cache)
    ref = onto or config.upstream.main
    new_base = upstream.resolve_ref(config, cache, ref)
    try:
        carried = carry_over(config, cache, mirror, patches, new_base)
    except rebase.Conflict as conflict:
        raise Failed(_conflict_message(config, cache, patches, ref, new_base, conflict, judge)) from None
    moved_pins(carried, repin)
    bumped = write(config, patches, carried, f"empty after refresh onto {ref} {new_base[:12]} (already upstream)")
    return Refreshed(carried, bumped)


def carry_over(
    config: Config, cache: Cache, mirror: Path, patches: series.Series, new_base: str, leave_out: str | None = None
) -> Carried:
    """The series (less `leave_out`) moved onto `new_base`, nothing written; Conflict names the first that won't go."""
    pin = config.upstream.commit
    kept = tuple(p for p in patches.patches if p.name != leave_out)
    exact = apply.check(mirror, new_base, series.Series(patches.directory, kept), cache.scratch)
    if all(result.status is apply.PatchStatus.CLEAN for result in exact.results):
        # Every patch applies there as it is written (exact context, no offset): nothing to rewrite, and no worktree.
        return Carried(pin, new_base, {}, (), tuple(p.name for p in kept), str(exact.tree))
    with cache.lock(mirror.name), temp_dir(cache.scratch, "refresh-") as work:
        space = rebase.Workspace.open(mirror, pin, new_base, patches, work / "tree", (leave_out,) if leave_out else ())
        space.advance(patches)
        texts, tree = space.texts()
        changed = {
            name: text for name, text in texts.items() if text and substance_moved(patches.find(name), text, work)
        }
    emptied = tuple(name for name, text in texts.items() if text is None)
    unchanged = tuple(name for name in texts if name not in changed and name not in emptied)
    return Carried(pin, new_base, changed, emptied, unchanged, tree, tuple(space.replays))


def moved_pins(carried: Carried, repin: Repin | None) -> None:
    """When the pin moves: `repin` the precompiled pins to the new base and tree, before anything else is written."""
    if repin is not None and carried.moved:
        repin(carried.new_base, carried.tree)


def _conflict_message(
    config: Config,
    cache: Cache,
    patches: series.Series,
    ref: str,
    new_base: str,
    conflict: rebase.Conflict,
    judge: Callable | None,
) -> str:
    """One line: the patch that conflicts, and the way out: `drop` for the patches REF needs no more, else by hand."""
    from carry.verdicts import verdicts

    head = f"{conflict.patch.name} conflicts with {ref} {new_base[:12]} in {conflict.files}; nothing was changed"
    report = verdicts.status(config, cache, patches, (ref,), with_pr=False, trees=judge is not None)
    if judge is not None:
        report = judge(report, patches)
    found = report.reports[0]
    droppable = [v for v in found.verdicts if v.verdict.droppable]
    mine = found.find(conflict.patch.name)
    if droppable:
        names = "; ".join(f"{v.patch.name} is {v.verdict.value} ({v.evidence[0].splitlines()[0]})" for v in droppable)
        commands = " and ".join(f"`{verdicts.drop_command(v.patch.name, ref)}`" for v in droppable)
        return f"{head}. {ref} needs no more: {names}: drop it with {commands}, then refresh again"
    return (
        f"{head}: {mine.patch.name} is {mine.verdict.value} against {ref}; rebase that patch by hand, then "
        f"refresh again"
    )


def substance_moved(patch: series.Patch, text: str, work: Path) -> bool:
    """Whether the new text differs in substance (diff, description, mail headers), not just index lines or diffstat."""
    candidate = work / patch.name
    candidate.write_text(text)
    new = series.parse_patch(candidate, patch.number)
    if (new.diffs, new.description.strip()) != (patch.diffs, patch.description.strip()):
        return True
    return patch.author is not None and (new.subject, new.author, new.date) != (patch.subject, patch.author, patch.date)


def write(
    config: Config, patches: series.Series, carried: Carried, emptied_why: str, dropped: tuple[str, str] | None = None
) -> str | None:
    """Write what `carried` (and `dropped`: name, DROPPED.md line) changed, each file atomically, and bump VERSION
    once (a new pin or series is another artifact); None when nothing changed, else the new VERSION."""
    if not (carried.moved or carried.changed or carried.emptied or dropped):
        return None
    bumped = version.following(config.version_file)
    log = patches.directory / droplog.LOG_NAME
    lines = [dropped[1]] if dropped else []
    lines += [droplog.log_line(name, emptied_why, None, str(bumped)) for name in carried.emptied]
    log_text = droplog.read_log(log) + "".join(line + "\n" for line in lines)
    for name, text in carried.changed.items():
        atomic_write_text(patches.directory / name, text)
    if lines:
        atomic_write_text(log, log_text)
    for name in (*carried.emptied, *([dropped[0]] if dropped else [])):
        (patches.directory / name).unlink()
    if carried.moved:
        upstream.update_pin(config, carried.new_base)
    version.write(config.version_file, bumped)
    return str(bumped)
