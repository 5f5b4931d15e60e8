"""`refresh`: move the series onto a new upstream base with a 3-way merge, then rewrite the patches that moved.

The work happens in a temporary worktree of the cache mirror: each patch is committed on the pin (`git am`),
cherry-picked onto the new base, and written back with `git format-patch` in one stable form. Nothing in the
project changes until every patch has been carried over; then the patches, DROPPED.md, the pin and VERSION are
written (`write`, which `drop` uses too: a new pin or a changed series is a new VERSION).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from carry import version
from carry.config import Config
from carry.source import apply, git, series, upstream
from carry.util.cache import Cache
from carry.util.errors import Failed
from carry.util.fsutil import atomic_write_text, temp_dir
from carry.verdicts import droplog

# The rewritten files must not depend on the user's git configuration.
CLEAN_ENV = {"GIT_CONFIG_GLOBAL": os.devnull}
FORMAT_PATCH = ("format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "--full-index", "--no-color")


@dataclasses.dataclass(frozen=True)
class Carried:
    """The series carried over to `new_base`: the new text of each patch whose substance moved, the patches that
    came out empty (already upstream), the rest, unchanged, and the patched tree there."""

    old_base: str
    new_base: str
    changed: dict[str, str]
    emptied: tuple[str, ...]
    unchanged: tuple[str, ...]
    tree: str

    @property
    def moved(self) -> bool:
        return self.old_base != self.new_base

    def lines(self) -> list[str]:
        rows = [f"pin {self.old_base[:12]} -> {self.new_base}" if self.moved else "pin unchanged"]
        rows += [f"rewritten  {name}" for name in self.changed]
        rows += [f"unchanged  {name}" for name in self.unchanged]
        logged = f"already upstream; removed and logged in {droplog.LOG_NAME}"
        rows += [f"emptied    {name}: {logged}" for name in self.emptied]
        return rows


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
    """Rebase `patches` onto `onto` (default upstream.main); on a conflict raise Failed and change nothing, naming
    the patches REF needs no more (`drop` is their way out; `judge` adds the verdict by their tests). Before the pin
    moves, `repin(new_base, tree)` moves what follows it (the precompiled pins) and says what it did; when it fails,
    nothing changes."""
    mirror = upstream.ensure_base(config, cache)
    ref = onto or config.upstream.main
    new_base = upstream.resolve_ref(config, cache, ref)
    try:
        carried = carry_over(config, cache, mirror, patches, new_base)
    except Conflict as conflict:
        raise Failed(_conflict_message(config, cache, patches, ref, new_base, conflict, judge)) from None
    moved_pins(carried, repin)
    bumped = write(config, patches, carried, f"empty after refresh onto {ref} {new_base[:12]} (already upstream)")
    return Refreshed(carried, bumped)


def carry_over(
    config: Config, cache: Cache, mirror: Path, patches: series.Series, new_base: str, leave_out: str | None = None
) -> Carried:
    """The series (less `leave_out`, which upstream merged) moved onto `new_base`; Conflict names the first patch
    that does not go there. Nothing is written."""
    pin = config.upstream.commit
    kept = tuple(p for p in patches.patches if p.name != leave_out)
    exact = apply.check(mirror, new_base, series.Series(patches.directory, kept), cache.scratch)
    if all(result.status is apply.PatchStatus.CLEAN for result in exact.results):
        # Every patch applies there as it is written (exact context, no offset): nothing to rewrite, and no worktree.
        return Carried(pin, new_base, {}, (), tuple(p.name for p in kept), str(exact.tree))
    with cache.lock(mirror.name), temp_dir(cache.scratch, "refresh-") as work:
        texts, tree = _rebase(mirror, pin, new_base, patches, work, leave_out)
        changed = {p.name: texts[p.name] for p in kept if texts[p.name] and _moved(p, texts[p.name], work)}
    emptied = tuple(p.name for p in kept if texts[p.name] is None)
    unchanged = tuple(p.name for p in kept if p.name not in changed and p.name not in emptied)
    return Carried(pin, new_base, changed, emptied, unchanged, tree)


def moved_pins(carried: Carried, repin: Repin | None) -> None:
    """When the pin moves: `repin` (the precompiled pins found for the new base and its patched tree, written or
    refused before anything else is; it says what it did)."""
    if repin is not None and carried.moved:
        repin(carried.new_base, carried.tree)


def _rebase(
    mirror: Path, pin: str, new_base: str, patches: series.Series, work: Path, leave_out: str | None = None
) -> tuple[dict, str]:
    """patch name -> its text on `new_base` (None when it became empty), and the patched tree there, via a temporary
    worktree; every patch is committed on the pin (later ones may need an earlier one's context), `leave_out` is not
    carried over."""
    tree = work / "tree"
    git.run(mirror, "worktree", "add", "--detach", "--quiet", str(tree), pin, env=CLEAN_ENV)
    try:
        commits = [_commit(tree, patch, pin) for patch in patches.patches]
        git.run(tree, "checkout", "--detach", "--quiet", new_base, env=CLEAN_ENV)
        texts: dict[str, str | None] = {}
        for patch, commit in zip(patches.patches, commits):
            if patch.name == leave_out:
                continue
            _cherry_pick(tree, patch, commit)
            if git.run(tree, "rev-parse", "HEAD^{tree}") == git.run(tree, "rev-parse", "HEAD^^{tree}"):
                texts[patch.name] = None
            else:
                texts[patch.name] = git.run(tree, *FORMAT_PATCH, "HEAD", env=CLEAN_ENV, strip=False)
        return texts, git.run(tree, "rev-parse", "HEAD^{tree}")
    finally:
        git.run_status(mirror, "worktree", "remove", "--force", str(tree))
        git.run_status(mirror, "worktree", "prune")


def _commit(tree: Path, patch: series.Patch, pin: str) -> str:
    """Commit the patch on top of the worktree's HEAD, keeping its author, date and message."""
    if patch.author:
        status, _, err = git.run_status(tree, "am", "--quiet", "--keep-cr", str(patch.path), env=CLEAN_ENV)
        if status != 0:
            git.run_status(tree, "am", "--abort", env=CLEAN_ENV)
    else:
        status, _, err = git.run_status(tree, "apply", "--index", str(patch.path), env=CLEAN_ENV)
        if status == 0:
            message = f"{patch.subject}\n\n{patch.description}" if patch.description else patch.subject
            git.run(tree, "commit", "--quiet", "--no-verify", "-m", message, env=CLEAN_ENV)
    if status != 0:
        raise Failed(f"{patch.name} does not apply on the pin {pin[:12]}; run `check` and fix the series first")
    return git.run(tree, "rev-parse", "HEAD")


class Conflict(Exception):
    """A patch that does not cherry-pick onto the new base, and the files it conflicts in."""

    def __init__(self, patch: series.Patch, files: str):
        super().__init__(patch.name)
        self.patch = patch
        self.files = files


def _cherry_pick(tree: Path, patch: series.Patch, commit: str) -> None:
    status, _, err = git.run_status(tree, "cherry-pick", "--keep-redundant-commits", commit, env=CLEAN_ENV)
    if status == 0:
        return
    conflicted = git.run(tree, "diff", "--name-only", "--diff-filter=U").split("\n")
    git.run_status(tree, "cherry-pick", "--abort", env=CLEAN_ENV)
    files = ", ".join(name for name in conflicted if name) or (err.strip().splitlines() or ["?"])[-1]
    raise Conflict(patch, files)


def _conflict_message(
    config: Config,
    cache: Cache,
    patches: series.Series,
    ref: str,
    new_base: str,
    conflict: Conflict,
    judge: Callable | None,
) -> str:
    """One line: the patch that conflicts, and the way out: `drop` for every patch REF needs no more (by the
    verdicts of `status`), else rebasing that patch by hand."""
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


def _moved(patch: series.Patch, text: str, work: Path) -> bool:
    """Whether the new text differs from the file in substance: its diff, description or mail headers (when it has
    them); index lines and the diffstat are form only."""
    candidate = work / patch.name
    candidate.write_text(text)
    new = series.parse_patch(candidate, patch.number)
    if (new.diffs, new.description.strip()) != (patch.diffs, patch.description.strip()):
        return True
    return patch.author is not None and (new.subject, new.author, new.date) != (patch.subject, patch.author, patch.date)


def write(
    config: Config,
    patches: series.Series,
    carried: Carried,
    emptied_why: str,
    dropped: tuple[str, str] | None = None,
) -> str | None:
    """Write what `carried` changed: the moved patches, the emptied ones (and `dropped`: (name, its DROPPED.md
    line)) removed and logged, the pin moved; then VERSION bumped once, since a new pin or another series is
    another artifact. Each file atomically; nothing is written when nothing changed (None, else the new VERSION)."""
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
