"""Moving the series onto a new upstream base, patch by patch, in a workspace of its own: a clone of the cache
mirror that borrows its objects (nothing copied, no git state shared) where each patch is committed on the pin
(`git am`) and cherry-picked onto the new base with git's 3-way merge, the recorded resolutions replayed by rerere
(carry/verdicts/resolutions.py). `follow` keeps a workspace across a conflict for the maintainer to resolve in place.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

from carry.source import git, series
from carry.util.errors import Failed
from carry.verdicts import resolutions

# The rewritten files must not depend on the user's git configuration.
CLEAN_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_EDITOR": "true"}
FORMAT_PATCH = ("format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "--full-index", "--no-color")
MARKER_RE = re.compile(r"^(<{7}|>{7})(?: |$)")


@dataclasses.dataclass(frozen=True)
class Replay:
    """A recorded resolution git rerere replayed: the patch whose cherry-pick conflicted, the file, the entry."""

    patch: str
    file: str
    entry: str

    def line(self) -> str:
        return f"replayed  {self.patch}: the recorded resolution {self.entry[:12]} of {self.file}"


class Conflict(Exception):
    """A patch that won't cherry-pick onto the new base: each file's conflict-marker line ranges; unfit resolutions."""

    def __init__(self, patch: series.Patch, files: str, regions: dict[str, list[tuple[int, int]]], unfit: tuple = ()):
        super().__init__(patch.name)
        self.patch = patch
        self.files = files
        self.regions = regions
        self.unfit = unfit


@dataclasses.dataclass
class Workspace:
    """The clone at `path` of the series in `patches_dir`; `names` the patches carried over in order, `commits`
    each one committed on the pin, `done` how many are on the new base so far, `replays` what rerere replayed."""

    path: Path
    patches_dir: Path
    new_base: str
    names: list[str]
    commits: list[str]
    done: int = 0
    replays: list[Replay] = dataclasses.field(default_factory=list)

    @classmethod
    def open(
        cls, mirror: Path, pin: str, new_base: str, patches: series.Series, path: Path, leave_out: tuple[str, ...] = ()
    ) -> Workspace:
        """A new workspace at `path`: every patch committed on the pin, the new base checked out, the recorded
        resolutions of `patches.directory` handed to rerere. Failed when a patch does not apply on the pin."""
        git.run(path.parent, "init", "--quiet", path.name, env=CLEAN_ENV)
        # what `clone --shared` makes, which a shallow mirror would turn into a fetch: the mirror's objects borrowed
        (path / ".git/objects/info/alternates").write_text(f"{(mirror / 'objects').absolute()}\n")
        if (mirror / "shallow").exists():
            shutil.copyfile(mirror / "shallow", path / ".git/shallow")
        for key, value in (("rerere.enabled", "true"), ("rerere.autoUpdate", "true"), ("gc.auto", "0")):
            git.run(path, "config", key, value, env=CLEAN_ENV)
        git.run(path, "checkout", "--quiet", "--detach", pin, env=CLEAN_ENV)
        commits = [_commit(path, patch, pin) for patch in patches.patches]
        kept = [(p.name, c) for p, c in zip(patches.patches, commits) if p.name not in leave_out]
        git.run(path, "checkout", "--quiet", "--detach", new_base, env=CLEAN_ENV)
        resolutions.install(patches.directory, path / ".git")
        return cls(path, patches.directory, new_base, [n for n, _ in kept], [c for _, c in kept])

    def advance(self, patches: series.Series) -> None:
        """Cherry-pick the rest onto the new base (rerere replaying); a Conflict stops mid-pick, `done` at it."""
        while self.done < len(self.names):
            patch = patches.find(self.names[self.done])
            status, _, err = git.run_status(
                self.path, "cherry-pick", "--keep-redundant-commits", self.commits[self.done], env=CLEAN_ENV
            )
            if status != 0:
                self._settle(patch, err)
            self.done += 1

    def _settle(self, patch: series.Patch, err: str) -> None:
        """After a conflicted cherry-pick: go on when rerere resolved every file (and say which), else Conflict."""
        merge_rr = resolutions.current(self.path / ".git")
        unmerged = [name for name in git.run(self.path, "diff", "--name-only", "--diff-filter=U").split("\n") if name]
        replayed = resolutions.replayed(err)
        if not unmerged and replayed:
            self.replays += [Replay(patch.name, f, merge_rr.get(f) or self._entry(patch.name, f)) for f in replayed]
            self._continue()
            return
        if not unmerged:  # not a conflict: git refused for another reason
            raise Failed(f"{patch.name}: git cherry-pick failed onto {self.new_base[:12]}: {err.strip()[-300:]}")
        regions = {name: marker_regions(self.path / name) for name in unmerged}
        unfit = resolutions.recorded_for(self.patches_dir, patch.name)
        raise Conflict(patch, ", ".join(unmerged), regions, unfit)

    def _entry(self, name: str, file: str) -> str:
        """The recorded entry of patch `name` whose postimage `file` now is (rerere may leave no MERGE_RR to say)."""
        resolved = (self.path / file).read_bytes()
        directory = self.patches_dir / resolutions.DIR_NAME / name
        recorded = resolutions.recorded_for(self.patches_dir, name)
        return next((e for e in recorded if (directory / e / "postimage").read_bytes() == resolved), "?")

    def resume(self, patches_dir: Path) -> tuple[str, list[Path]]:
        """Record the maintainer's resolution under `patches_dir`, finish the cherry-pick: (patch, files recorded)."""
        name = self.names[self.done]
        merge_rr = resolutions.current(self.path / ".git")
        left = {f: r for f in merge_rr if (r := marker_regions(self.path / f))}
        if left:
            shown = "; ".join(f"{f} lines {', '.join(f'{a}-{b}' for a, b in r)}" for f, r in left.items())
            raise resolutions.unresolved(name, self.path, shown)
        git.run(self.path, "add", "--", *merge_rr, env=CLEAN_ENV)
        git.run(self.path, "rerere", env=CLEAN_ENV)
        recorded = resolutions.record(self.path / ".git", merge_rr, patches_dir, name)
        self._continue()
        self.done += 1
        return name, recorded

    def _continue(self) -> None:
        status, _, _ = git.run_status(self.path, "cherry-pick", "--continue", env=CLEAN_ENV)
        if status != 0:  # the resolution made the patch empty: keep an empty commit, as --keep-redundant-commits does
            git.run(self.path, "commit", "--quiet", "--allow-empty", "--no-verify", "--no-edit", env=CLEAN_ENV)

    def texts(self) -> tuple[dict[str, str | None], str]:
        """Each carried patch's text on the new base (None when it came out empty) and the patched tree there."""
        new = git.run(self.path, "rev-list", "--reverse", f"{self.new_base}..HEAD").split()
        if len(new) != len(self.names):
            raise Failed(f"{self.path}: {len(new)} commits on the new base for {len(self.names)} patches")
        found: dict[str, str | None] = {}
        for name, commit in zip(self.names, new):
            tree, parent = git.run(self.path, "rev-parse", f"{commit}^{{tree}}", f"{commit}^^{{tree}}").split()
            found[name] = (
                None if tree == parent else git.run(self.path, *FORMAT_PATCH, commit, env=CLEAN_ENV, strip=False)
            )
        # The patched tree is read later from the mirror (`pin` finds the precompiled wheels by it), after this
        # workspace is gone: its new objects are packed into the mirror the workspace borrows from.
        borrowed = Path((self.path / ".git/objects/info/alternates").read_text().strip())
        listed = git.run(self.path, "rev-list", "--objects", "HEAD", "--not", self.new_base, strip=False)
        if listed.strip():
            git.run_input(self.path, ("pack-objects", "--quiet", str(borrowed / "pack" / "pack")), listed)
        return found, git.run(self.path, "rev-parse", "HEAD^{tree}")


def _commit(tree: Path, patch: series.Patch, pin: str) -> str:
    """Commit the patch on top of the workspace's HEAD, keeping its author, date and message."""
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
        why = next((line.strip() for line in err.splitlines() if line.startswith(("error", "fatal"))), "")
        raise Failed(
            f"{patch.name} does not apply on the pin {pin[:12]}{': ' + why if why else ''}; run `check` and fix the "
            f"series first"
        )
    return git.run(tree, "rev-parse", "HEAD")


def marker_regions(path: Path) -> list[tuple[int, int]]:
    """The 1-based line ranges between conflict markers (<<<<<<< to >>>>>>>) in a file; [] when none is left."""
    try:
        lines = path.read_text(errors="replace").split("\n")
    except OSError:
        return []
    found, start = [], None
    for number, line in enumerate(lines, 1):
        match = MARKER_RE.match(line)
        if match and match.group(1).startswith("<"):
            start = number
        elif match and start is not None:
            found.append((start, number))
            start = None
    return found
