"""Status verdicts: is each carried patch still needed against a newer upstream ref, and what proves it.

Patches are judged in series order in a private index of REF plus the earlier patches as far as they apply; a second
index follows the series on the pinned base, for the pre- and post-image each hunk was written against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import itertools
from pathlib import Path
from typing import TYPE_CHECKING

from carry.config import Config
from carry.source import git, upstream
from carry.source.series import HUNK_RE, FileDiff, Hunk, Patch, Series, UpstreamState
from carry.util import prog
from carry.util.cache import Cache
from carry.util.errors import BadInput
from carry.util.fsutil import temp_dir
from carry.verdicts import intent
from carry.verdicts.history import Absence, Gone, History
from carry.verdicts.history import has as has_path

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from carry.verdicts.prstate import PrState

CLEANLY = "cleanly"
IGNORING_WHITESPACE = "ignoring whitespace"


class Verdict(enum.Enum):
    """What REF says about one carried patch."""

    MERGED_EXACT = "MERGED-EXACT"
    MERGED_MODIFIED = "MERGED-MODIFIED"
    PARTIAL = "PARTIAL"
    CONFLICT = "CONFLICT"
    NEEDED = "NEEDED"
    DELETED_UPSTREAM = "DELETED-UPSTREAM"  # upstream deleted the file(s) the patch changes: nothing left to patch
    PR_ONLY = "PR-ONLY"  # only the carried PR has the file(s), and the PR is not in REF: nothing left to patch
    FIXED_UPSTREAM = "FIXED-UPSTREAM"  # the patch's test passes on REF without it (status --test)

    @property
    def merged(self) -> bool:
        return self in (Verdict.MERGED_EXACT, Verdict.MERGED_MODIFIED)

    @property
    def droppable(self) -> bool:
        """REF needs the patch no more: merged, fixed upstream its own way, or nothing left to patch."""
        return self.merged or self in (Verdict.DELETED_UPSTREAM, Verdict.PR_ONLY, Verdict.FIXED_UPSTREAM)

    @classmethod
    def droppable_names(cls) -> str:
        return ", ".join(v.value for v in cls if v.droppable)

    @classmethod
    def parse_list(cls, text: str, where: str) -> frozenset[Verdict]:
        """A comma list of verdict names, e.g. `CONFLICT,PARTIAL`."""
        allowed = ", ".join(v.value for v in cls)
        names = [name.strip() for name in text.split(",") if name.strip()]
        if not names:
            raise BadInput(f"{where}: no verdict given; use a comma list of: {allowed}")
        found = set()
        for name in names:
            try:
                found.add(cls(name.upper().replace("_", "-")))
            except ValueError:
                raise BadInput(f"{where}: unknown verdict {name!r}; use a comma list of: {allowed}") from None
        return frozenset(found)


class HunkState(enum.Enum):
    IN_EXACT = "in REF"
    IN_MODIFIED = "in REF, modified"
    NEEDED = "needed"
    CONFLICT = "conflict"
    DELETED = "file deleted upstream"
    PR_ONLY = "file only in the PR"

    @property
    def merged(self) -> bool:
        return self in (HunkState.IN_EXACT, HunkState.IN_MODIFIED)

    @property
    def gone(self) -> bool:
        """Nothing left to patch: REF has no such file, and never will through this patch."""
        return self in (HunkState.DELETED, HunkState.PR_ONLY)

    @property
    def settled(self) -> bool:
        return self.merged or self.gone


@dataclasses.dataclass(frozen=True)
class HunkFinding:
    file: str
    target: str | None
    header: str
    state: HunkState
    detail: str
    difference: str = ""
    commit: str | None = None  # the commit that deleted the file (DELETED) or added it on the PR's side (PR_ONLY)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "state": self.state.value}


@dataclasses.dataclass(frozen=True)
class PatchVerdict:
    """One patch's verdict, the test that decided it, the upstream commit when known, and the evidence."""

    patch: Patch
    verdict: Verdict
    test: str
    commit: str | None
    evidence: tuple[str, ...]
    hunks: tuple[HunkFinding, ...] = ()
    advice: str | None = None
    behaviour: dict | None = None  # what its test did on REF without it (status --test), see carry/gputest/behaviour.py
    # The tree of REF plus the earlier patches as far as they apply there (following upstream's renames): what
    # `--test` builds on; recorded only then, and not part of the verdict.
    before: str | None = dataclasses.field(default=None, compare=False)

    @property
    def difference(self) -> str:
        return "\n".join(h.difference for h in self.hunks if h.difference)

    def to_json(self) -> dict:
        return {
            "name": self.patch.name,
            "verdict": self.verdict.value,
            "test": self.test,
            "commit": self.commit,
            "evidence": list(self.evidence),
            "hunks": [h.to_json() for h in self.hunks],
            "difference": self.difference,
            "upstream_status": str(self.patch.upstream_status) if self.patch.upstream_status else None,
            "advice": self.advice,
            "droppable": self.verdict.droppable,
            "behaviour": self.behaviour,
        }


@dataclasses.dataclass(frozen=True)
class RefReport:
    ref: str
    commit: str
    verdicts: tuple[PatchVerdict, ...]

    def find(self, name: str) -> PatchVerdict:
        return next(v for v in self.verdicts if v.patch.name == name)

    def to_json(self) -> dict:
        return {"ref": self.ref, "commit": self.commit, "patches": [v.to_json() for v in self.verdicts]}


def new_start(hunk: Hunk) -> int:
    match = HUNK_RE.match(hunk.header)
    assert match is not None  # a Hunk's header was parsed with HUNK_RE (series._parse_hunk)
    return int(match.group(3))


class Assessor:
    """Judge a series against one ref; holds the two private indexes and the history between base and ref."""

    def __init__(self, mirror: Path, history: History, scratch: Path, indexes: tuple[dict, dict], trees: bool = False):
        self.mirror = mirror
        self.history = history
        self.base, self.ref, self.commit = history.base, history.ref, history.commit
        self.scratch = scratch
        self.ref_env, self.base_env = indexes
        self.counter = itertools.count()
        self.since = git.run(mirror, "show", "-s", "--format=%ct", self.base)
        self._moved: dict[str, str | None] = {}
        self.trees = trees

    def assess(self, patch: Patch) -> PatchVerdict:
        before = git.write_tree(self.mirror, self.ref_env) if self.trees else None
        parts = patch.diffs
        pre = {d.old_path: self._read(d.old_path, self.base_env) for d in patch.diffs if d.old_path}
        applied_on_base = self._apply(self._whole(parts, self.base_env), self.base_env, check=False)
        post = {d.new_path: self._read(d.new_path, self.base_env) for d in patch.diffs if d.new_path}
        if not applied_on_base:
            self._apply_units(self._units(parts), self.base_env)
            pre, post = {}, {}
        verdict = self._judge(patch, parts, pre, post, applied_on_base)
        self._carry_forward(parts, verdict)
        return dataclasses.replace(verdict, advice=advice(patch, verdict.verdict), before=before)

    def _judge(
        self, patch: Patch, parts: tuple[FileDiff, ...], pre: dict, post: dict, applied_on_base: str | None
    ) -> PatchVerdict:
        same = self._same_patch_id(patch)
        if same:
            return PatchVerdict(patch, Verdict.MERGED_EXACT, "patch-id", same[0], same[1:])
        whole = self._whole(parts, self.ref_env)
        forward = self._apply(whole, self.ref_env)
        reverse = self._apply(whole, self.ref_env, reverse=True)
        if reverse == CLEANLY and not forward:
            evidence = ["the whole patch reverse-applies cleanly on REF (git apply -R)", *self._moves(parts)]
            if not applied_on_base:
                evidence.append(f"already in the base {self.base[:12]}: the patch does not apply there")
            commit = self._introduced_by(patch, parts)
            return PatchVerdict(patch, Verdict.MERGED_EXACT, "reverse-apply", commit, tuple(evidence))
        findings = tuple(self._hunk_finding(s, i, pre, post) for s, i in self._units(parts))
        commit = self._introduced_by(patch, parts) if any(f.state.merged for f in findings) else None
        return _combine(patch, findings, forward, commit, self._moves(parts))

    def _units(self, parts: tuple[FileDiff, ...]) -> Iterator[tuple[FileDiff, tuple[int, ...]]]:
        """(file diff, hunk index) pairs; a file change without hunks (a pure rename) is one unit."""
        for diff in parts:
            if diff.hunks:
                yield from ((diff, (i,)) for i in range(len(diff.hunks)))
            else:
                yield diff, ()

    def _whole(self, parts: tuple[FileDiff, ...], env: dict[str, str]) -> str:
        return "".join(d.text(target=self._target(d, env)) for d in parts)

    def _apply(self, text: str, env: dict[str, str], reverse: bool = False, check: bool = True) -> str | None:
        """Apply `text` strictly, else ignoring whitespace; the way it applied, or None."""
        path = self.scratch / f"unit-{next(self.counter)}.patch"
        path.write_text(text)
        flags = (("--check",) if check else ()) + (("-R",) if reverse else ())
        for extra, how in (((), CLEANLY), (("--ignore-whitespace",), IGNORING_WHITESPACE)):
            status, _ = git.apply_cached(self.mirror, path, env, *flags, *extra)
            if status == 0:
                return how
        return None

    def _apply_units(self, units: Iterable[tuple[FileDiff, tuple[int, ...]]], env: dict[str, str]) -> None:
        """Apply each (file diff, hunks) unit that still applies, one by one."""
        for diff, hunks in units:
            self._apply(diff.text(hunks, self._target(diff, env)), env, check=False)

    def _carry_forward(self, parts: tuple[FileDiff, ...], verdict: PatchVerdict) -> None:
        """Put what REF still lacks into the REF index, so later patches see the series as far as it applies."""
        if verdict.verdict is Verdict.NEEDED:
            self._apply(self._whole(parts, self.ref_env), self.ref_env, check=False)
        elif verdict.hunks:
            settled = {(f.file, f.header) for f in verdict.hunks if f.state.settled}
            units = [(d, i) for d, i in self._units(parts) if (d.path, _unit_header(d, i)) not in settled]
            self._apply_units(units, self.ref_env)

    def _read(self, path: str | None, env: dict[str, str]) -> list[str] | None:
        text = git.show_blob(self.mirror, f":{path}", env) if path else None
        return text.split("\n") if text is not None else None

    def _target(self, diff: FileDiff, env: dict[str, str]) -> str | None:
        """Where the file this diff changes lives in `env`'s index: its own path, else where upstream moved it."""
        for path in (diff.new_path, diff.old_path):
            if path and self._read(path, env) is not None:
                return path
        moved = self._moved_to(diff.old_path or diff.path)
        return moved if moved and self._read(moved, env) is not None else None

    def _moved_to(self, path: str) -> str | None:
        """Where upstream renamed `path`, asked of the history once per path and only for a path not on REF."""
        if path not in self._moved:
            gone = self._read(path, self.ref_env) is None and has_path(self.mirror, self.base, path)
            self._moved[path] = self.history.moved(path) if gone else None
        return self._moved[path]

    def _hunk_finding(self, diff: FileDiff, hunks: tuple[int, ...], pre: dict, post: dict) -> HunkFinding:
        target = self._target(diff, self.ref_env)
        header = _unit_header(diff, hunks)
        if target is None and diff.old_path is not None and diff.new_path is not None:
            return self._gone(diff, header, self.history.absence(diff.old_path), hunks)
        text = diff.text(hunks, self._target(diff, self.ref_env))
        forward = self._apply(text, self.ref_env)
        reverse = self._apply(text, self.ref_env, reverse=True)
        moved = f" (at {target}, renamed upstream)" if target and target not in (diff.old_path, diff.new_path) else ""
        found = self._intent(diff, hunks, target, pre, post)
        if reverse == CLEANLY and (forward != CLEANLY or found.present):
            return HunkFinding(diff.path, target, header, HunkState.IN_EXACT, f"reverse-applies cleanly{moved}")
        if found.present or (reverse and forward != CLEANLY):
            detail = found.detail if found.present else f"reverse-applies ignoring whitespace{moved}"
            return HunkFinding(diff.path, target, header, HunkState.IN_MODIFIED, detail, found.difference)
        if forward == CLEANLY:
            return HunkFinding(diff.path, target, header, HunkState.NEEDED, f"applies cleanly{moved}")
        why = (
            "applies only when ignoring whitespace: upstream reformatted its context; regenerate the patch"
            if forward
            else f"does not apply to {target or diff.path}; {found.detail}"
        )
        lines = [why, *itertools.chain.from_iterable(diff.hunks[i].raw for i in hunks)]
        return HunkFinding(diff.path, target, header, HunkState.CONFLICT, "\n".join(lines))

    def _gone(self, diff: FileDiff, header: str, absence: Absence, hunks: tuple[int, ...]) -> HunkFinding:
        """A hunk whose file is not on REF and not renamed: nothing left to patch when history says why."""
        commit = absence.commit.sha if absence.commit else None
        state = {Gone.DELETED: HunkState.DELETED, Gone.PR_ONLY: HunkState.PR_ONLY}.get(absence.why)
        if state is not None:
            return HunkFinding(diff.path, None, header, state, absence.evidence, commit=commit)
        raw = itertools.chain.from_iterable(diff.hunks[i].raw for i in hunks)
        lines = [f"does not apply: {absence.evidence}", *raw]
        return HunkFinding(diff.path, None, header, HunkState.CONFLICT, "\n".join(lines))

    def _moves(self, parts: tuple[FileDiff, ...]) -> tuple[str, ...]:
        """Evidence lines for the files this patch touches that upstream renamed, with the commit that did it."""
        moves = []
        for diff in parts:
            target = self._target(diff, self.ref_env)
            if target and target not in (diff.old_path, diff.new_path):
                by = self.history.renamed_by(diff.old_path or diff.path, target)
                how = f"renamed upstream by {by.describe()}" if by else "renamed upstream"
                moves.append(f"{diff.path} is {target} in REF ({how}); refresh follows the rename")
        return tuple(moves)

    def _intent(
        self, diff: FileDiff, hunks: tuple[int, ...], target: str | None, pre: dict, post: dict
    ) -> intent.Found:
        if not hunks:
            return intent.renamed(diff, target)
        hunk = diff.hunks[hunks[0]]
        if diff.new_path is None:
            return intent.deleted(diff, target)
        ref_lines = self._read(target, self.ref_env) if target is not None else None
        if target is None or ref_lines is None:
            return intent.Found(False, f"{diff.path} is not in REF")
        return intent.find(
            hunk,
            new_start(hunk),
            pre.get(diff.old_path) if diff.old_path else [],
            post.get(diff.new_path),
            ref_lines,
            f"{self.ref}:{target}",
            intent.Lexer.for_path(target),
        )

    def _paths(self, patch: Patch) -> list[str]:
        paths = {p for d in patch.diffs for p in (d.old_path, d.new_path) if p}
        return sorted(paths | {moved for p in paths if (moved := self._moved.get(p))})

    def _range(self) -> tuple[str, ...]:
        """Commits on REF newer than the base and not in it (the mirror may be shallow)."""
        return (f"--max-age={self.since}", self.commit, "--not", self.base)

    def _same_patch_id(self, patch: Patch) -> tuple[str, ...] | None:
        """(commit, evidence...) for an upstream commit whose change to these files has this patch's patch-id."""
        mine = git.patch_id(self.mirror, patch.path.read_bytes().decode("utf-8", errors="surrogateescape"))
        if mine is None:
            return None
        commit = git.commit_with_patch_id(self.mirror, mine, *self._range(), "--", *self._paths(patch))
        if commit is None:
            return None
        touched = git.run(self.mirror, "diff-tree", "--no-commit-id", "--name-only", "-r", "--root", commit).split()
        others = sorted(set(touched) - set(self._paths(patch)))
        how = f"together with {len(others)} other file(s) (squash)" if others else "and nothing else"
        return (
            commit,
            f"upstream commit {commit[:12]} {git.subject(self.mirror, commit)!r} has the same patch-id "
            f"(git patch-id --stable) over the files this patch touches",
            f"that commit changes these files exactly as the patch does, {how}",
        )

    def _introduced_by(self, patch: Patch, parts: tuple[FileDiff, ...]) -> str | None:
        """The oldest commit in range that added the longest added line REF holds verbatim (git log -S)."""
        candidates = []
        for diff in parts:
            target = self._target(diff, self.ref_env)
            text = "\n".join(self._read(target, self.ref_env) or []) if target else ""
            added = (line.strip() for hunk in diff.hunks for line in hunk.added if intent.is_code(line))
            candidates += [line for line in added if line in text]
        if not candidates:
            return None
        needle = max(candidates, key=len)
        found = git.run(
            self.mirror, "log", "--reverse", "--format=%H", f"-S{needle}", *self._range(), "--", *self._paths(patch)
        ).split()
        return found[0] if found else None


def _unit_header(diff: FileDiff, hunks: tuple[int, ...]) -> str:
    return diff.hunks[hunks[0]].header if hunks else "(file header)"


def _combine(
    patch: Patch, findings: tuple[HunkFinding, ...], forward: str | None, commit: str | None, moves: tuple[str, ...]
) -> PatchVerdict:
    """The patch's verdict from its hunks' states; a hunk whose file is gone from REF has nothing left to do."""
    states = [f.state for f in findings]
    merged = [f for f in findings if f.state.merged]
    gone = [f for f in findings if f.state.gone]
    listed = (*moves, *(_describe(f) for f in findings))
    if gone and len(gone) == len(findings):
        deleted = [f for f in gone if f.state is HunkState.DELETED]
        verdict = Verdict.DELETED_UPSTREAM if deleted else Verdict.PR_ONLY
        found = (deleted or gone)[0].commit if deleted else None
        return PatchVerdict(patch, verdict, "history", found, _gone_evidence(gone), findings)
    if len(merged) + len(gone) == len(findings):
        exact = not gone and all(s is HunkState.IN_EXACT for s in states)
        verdict = Verdict.MERGED_EXACT if exact else Verdict.MERGED_MODIFIED
        return PatchVerdict(patch, verdict, "reverse-apply per hunk" if exact else "intent", commit, listed, findings)
    if HunkState.CONFLICT in states:
        return PatchVerdict(patch, Verdict.CONFLICT, "apply", commit, listed, findings)
    if merged or gone:
        return PatchVerdict(patch, Verdict.PARTIAL, "intent", commit, listed, findings)
    if forward != CLEANLY:
        evidence = ("each hunk applies on its own but the patch does not apply as a whole", *listed)
        return PatchVerdict(patch, Verdict.CONFLICT, "apply", None, evidence, findings)
    evidence = ("the patch applies cleanly on REF and none of its hunks is there", *listed)
    return PatchVerdict(patch, Verdict.NEEDED, "forward-apply", None, evidence, findings)


def _gone_evidence(gone: list[HunkFinding]) -> tuple[str, ...]:
    """One line per file (its hunks all say the same), then how many hunks that leaves with nothing to patch."""
    lines = list(dict.fromkeys(f.detail for f in gone))
    files = len({f.file for f in gone})
    lines.append(f"{len(gone)} hunk(s) in {files} file(s), none left to patch on REF")
    return tuple(lines)


def _describe(finding: HunkFinding) -> str:
    """One evidence entry per hunk; a conflicting hunk keeps its full text."""
    detail = finding.detail if finding.state is HunkState.CONFLICT else finding.detail.splitlines()[0]
    where = finding.header.split(" @@")[0] + " @@" if finding.header.startswith("@@") else finding.header
    return f"{finding.file} {where}: {finding.state.value}: {detail}"


def advice(patch: Patch, verdict: Verdict) -> str | None:
    """Compare the `Upstream-Status` trailer with the verdict."""
    status = patch.upstream_status
    if status is None:
        return None
    if verdict.merged and status.state in (UpstreamState.SUBMITTED, UpstreamState.PENDING):
        return f"Upstream-Status says {status.state.value}, but it is merged upstream: drop it"
    if verdict.droppable and status.state in (UpstreamState.SUBMITTED, UpstreamState.PENDING):
        return f"Upstream-Status says {status.state.value}, but REF needs it no more ({verdict.value}): drop it"
    if verdict is Verdict.NEEDED and status.state in (UpstreamState.ACCEPTED, UpstreamState.BACKPORT):
        return f"contradiction: Upstream-Status says {status.state.value}, but REF does not contain it"
    return None


def assess(mirror: Path, history: History, series: Series, scratch: Path, trees: bool = False) -> RefReport:
    """Verdicts for every patch of `series` against `history.commit`; `trees` records each one's tree for `--test`."""
    with contextlib.ExitStack() as stack:
        work = stack.enter_context(temp_dir(scratch, "status-"))
        ref_env = stack.enter_context(git.temp_index(mirror, work / "ref"))
        base_env = stack.enter_context(git.temp_index(mirror, work / "base"))
        git.read_tree(mirror, history.commit, ref_env)
        git.read_tree(mirror, history.base, base_env)
        assessor = Assessor(mirror, history, work, (ref_env, base_env), trees)
        verdicts = tuple(assessor.assess(patch) for patch in series.patches)
    return RefReport(history.ref, history.commit, verdicts)


def table(status: StatusReport) -> str:
    """The verdicts as readable text: the PR's state first, then one block per ref."""
    rows = [f"base {status.base}"]
    if status.pr is not None:
        rows.append(status.pr.describe())
    rows.append("")
    for report in status.reports:
        rows.append(f"against {report.ref} ({report.commit[:12]})")
        width = max([len(v.patch.name) for v in report.verdicts] + [5])
        for v in report.verdicts:
            commit = f"  upstream {v.commit[:12]}" if v.commit else ""
            rows.append(f"  {v.patch.name:<{width}}  {v.verdict.value:<16}  decided by {v.test}{commit}")
            for line in v.evidence:
                rows.extend(f"      {part}" for part in line.splitlines())
            for finding in v.hunks:
                if finding.difference:
                    rows.append(f"      remaining difference in {finding.file} {finding.header.split(' @@')[0]} @@:")
                    rows.extend(f"        {part}" for part in finding.difference.splitlines())
            if v.advice:
                rows.append(f"      note: {v.advice}")
            if v.verdict.droppable:
                rows.append(f"      way out: {drop_command(v.patch.name, report.ref)}")
        rows.append("")
    return "\n".join(rows).rstrip("\n")


def drop_command(name: str, ref: str) -> str:
    return prog.command("drop", name, "--against", ref)


@dataclasses.dataclass(frozen=True)
class StatusReport:
    base: str
    reports: tuple[RefReport, ...]
    pr: PrState | None = None

    @property
    def occurred(self) -> frozenset[Verdict]:
        return frozenset(v.verdict for report in self.reports for v in report.verdicts)

    def to_json(self) -> dict:
        return {
            "base": self.base,
            "pr": self.pr.to_json() if self.pr else None,
            "refs": [r.to_json() for r in self.reports],
        }


def default_refs(config: Config) -> tuple[str, ...]:
    """upstream.main, and the PR head when upstream.pr is set."""
    return (config.upstream.main,) + ((config.upstream.pr_ref,) if config.upstream.pr_ref else ())


def status(
    config: Config, cache: Cache, series: Series, refs: tuple[str, ...] = (), with_pr: bool = True, trees: bool = False
) -> StatusReport:
    """Verdicts for the series against each ref (default: `default_refs`), every ref resolved before any work."""
    mirror = upstream.ensure_base(config, cache)
    resolve = functools.cache(functools.partial(upstream.resolve_ref, config, cache))
    commits = {ref: resolve(ref) for ref in dict.fromkeys(refs or default_refs(config))}
    base = config.upstream.commit
    reports = []
    for ref, commit in commits.items():
        merge_base = functools.partial(upstream.merge_base, config, cache, mirror, base, commit)
        reports.append(assess(mirror, History(mirror, base, ref, commit, merge_base), series, cache.scratch, trees))
    pr = None
    if with_pr and config.upstream.pr is not None:
        from carry.verdicts import prstate

        pr = prstate.find(config, cache, mirror, resolve)
    return StatusReport(base, tuple(reports), pr)
