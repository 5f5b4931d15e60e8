"""`refresh`: move the series onto a new upstream base with a 3-way merge, then rewrite the patches that moved.

The work happens in a temporary worktree of the cache mirror: each patch is committed on the pin (`git am`),
cherry-picked onto the new base, and written back with `git format-patch` in one stable form. Nothing in the
project changes until every patch has been carried over.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from carry import drop, git, series, upstream, version
from carry.cache import Cache
from carry.config import Config
from carry.errors import Failed
from carry.fsutil import atomic_write_text, temp_dir

# The rewritten files must not depend on the user's git configuration.
CLEAN_ENV = {"GIT_CONFIG_GLOBAL": os.devnull}
FORMAT_PATCH = ("format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "--full-index", "--no-color")


@dataclasses.dataclass(frozen=True)
class Refreshed:
    old_base: str
    new_base: str
    rewritten: tuple[str, ...]
    unchanged: tuple[str, ...]
    emptied: tuple[str, ...]
    notes: tuple[str, ...]

    def lines(self) -> list[str]:
        moved = f"pin {self.old_base[:12]} -> {self.new_base}" if self.old_base != self.new_base else "pin unchanged"
        rows = [moved]
        rows += [f"rewritten  {name}" for name in self.rewritten]
        rows += [f"unchanged  {name}" for name in self.unchanged]
        rows += [f"emptied    {name}: already upstream; removed and logged in {drop.LOG_NAME}" for name in self.emptied]
        return rows


def refresh(config: Config, cache: Cache, patches: series.Series, onto: str | None) -> Refreshed:
    """Rebase `patches` onto `onto` (default upstream.main); on a conflict raise Failed and change nothing."""
    mirror, notes = upstream.ensure_base(config, cache)
    ref = onto or config.upstream.main
    new_base, more = upstream.resolve_ref(config, cache, ref)
    pin = config.upstream.commit
    with cache.lock(mirror.name), temp_dir(cache.scratch, "refresh-") as work:
        texts = _rebase(mirror, pin, new_base, ref, patches, work)
        changed = {p.name: texts[p.name] for p in patches.patches if texts[p.name] and _moved(p, texts[p.name], work)}
    emptied = tuple(name for name, text in texts.items() if text is None)
    _write(config, patches, changed, emptied, ref, new_base)
    unchanged = tuple(p.name for p in patches.patches if p.name not in changed and p.name not in emptied)
    return Refreshed(pin, new_base, tuple(changed), unchanged, emptied, (*notes, *more))


def _rebase(mirror: Path, pin: str, new_base: str, ref: str, patches: series.Series, work: Path) -> dict:
    """patch name -> its text on `new_base` (None when it became empty), via a temporary worktree."""
    tree = work / "tree"
    git.run(mirror, "worktree", "add", "--detach", "--quiet", str(tree), pin, env=CLEAN_ENV)
    try:
        commits = [_commit(tree, patch, pin) for patch in patches.patches]
        git.run(tree, "checkout", "--detach", "--quiet", new_base, env=CLEAN_ENV)
        texts = {}
        for patch, commit in zip(patches.patches, commits):
            _cherry_pick(tree, patch, commit, ref, new_base)
            if git.run(tree, "rev-parse", "HEAD^{tree}") == git.run(tree, "rev-parse", "HEAD^^{tree}"):
                texts[patch.name] = None
            else:
                texts[patch.name] = git.run(tree, *FORMAT_PATCH, "HEAD", env=CLEAN_ENV, strip=False)
        return texts
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


def _cherry_pick(tree: Path, patch: series.Patch, commit: str, ref: str, new_base: str) -> None:
    status, _, err = git.run_status(tree, "cherry-pick", "--keep-redundant-commits", commit, env=CLEAN_ENV)
    if status == 0:
        return
    conflicted = git.run(tree, "diff", "--name-only", "--diff-filter=U").split("\n")
    git.run_status(tree, "cherry-pick", "--abort", env=CLEAN_ENV)
    files = ", ".join(name for name in conflicted if name) or (err.strip().splitlines() or ["?"])[-1]
    raise Failed(
        f"{patch.name} conflicts with {ref} {new_base[:12]} in {files}; nothing was changed: "
        f"rebase that patch by hand, then refresh again"
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


def _write(config: Config, patches: series.Series, changed: dict, emptied: tuple, ref: str, new_base: str) -> None:
    """Write the moved patches, log and remove the emptied ones, then move the pin; each file atomically."""
    log = patches.directory / drop.LOG_NAME
    if emptied:
        current = str(version.read(config.version_file))
        what = f"empty after refresh onto {ref} {new_base[:12]} (already upstream)"
        log_text = drop.read_log(log) + "".join(drop.log_line(name, what, None, current) + "\n" for name in emptied)
    for name, text in changed.items():
        atomic_write_text(patches.directory / name, text)
    if emptied:
        atomic_write_text(log, log_text)
        for name in emptied:
            (patches.directory / name).unlink()
    if new_base != config.upstream.commit:
        upstream.update_pin(config, new_base)
