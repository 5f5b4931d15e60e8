"""Status verdicts: is each carried patch still needed against a newer upstream ref, and what proves it.

Patches are judged in series order on REF, in a private index that holds REF plus the earlier patches as far as
they still apply. A second private index follows the same series on the pinned base, so each hunk can be
compared with the pre- and post-image it was written against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
from pathlib import Path

from carry import git, intent, upstream
from carry.cache import Cache
from carry.config import Config
from carry.errors import BadInput
from carry.fsutil import temp_dir
from carry.series import HUNK_RE, FileDiff, Hunk, Patch, Series, UpstreamState

LOG_FORMAT = "--format=commit %H"
CLEANLY = "cleanly"
IGNORING_WHITESPACE = "ignoring whitespace"


class Verdict(enum.Enum):
    """What REF says about one carried patch."""

    MERGED_EXACT = "MERGED-EXACT"
    MERGED_MODIFIED = "MERGED-MODIFIED"
    PARTIAL = "PARTIAL"
    CONFLICT = "CONFLICT"
    NEEDED = "NEEDED"

    @property
    def merged(self) -> bool:
        return self in (Verdict.MERGED_EXACT, Verdict.MERGED_MODIFIED)

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

    @property
    def merged(self) -> bool:
        return self in (HunkState.IN_EXACT, HunkState.IN_MODIFIED)


@dataclasses.dataclass(frozen=True)
class HunkFinding:
    file: str
    target: str | None
    header: str
    state: HunkState
    detail: str
    difference: str = ""

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


@dataclasses.dataclass(frozen=True)
class Section:
    """One file of a patch: its parsed diff, its header lines and each hunk's raw lines."""

    diff: FileDiff
    header: tuple[str, ...]
    hunks: tuple[tuple[str, ...], ...]

    def text(self, hunks: tuple[int, ...] | None = None, target: str | None = None) -> str:
        """This file's diff with only `hunks` (all by default), its path moved to `target` when given."""
        header = self.header
        if target and self.diff.old_path == self.diff.new_path and target != self.diff.old_path:
            header = tuple(_retarget(line, target) for line in header)
        chosen = range(len(self.hunks)) if hunks is None else hunks
        return "\n".join([*header, *itertools.chain.from_iterable(self.hunks[i] for i in chosen)]) + "\n"


def sections(patch: Patch) -> tuple[Section, ...]:
    """Split the patch file into per-file sections, paired with the parsed diffs."""
    lines = patch.path.read_text().split("\n")
    found = []
    index = 0
    while index < len(lines) and len(found) < len(patch.diffs):
        if _starts_file(lines, index):
            section, index = _read_section(lines, index, patch.diffs[len(found)])
            found.append(section)
        else:
            index += 1
    return tuple(found)


def _starts_file(lines: list[str], index: int) -> bool:
    line = lines[index]
    if line.startswith("diff --git "):
        return True
    return line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ ")


def _read_section(lines: list[str], index: int, diff: FileDiff) -> tuple[Section, int]:
    header = [lines[index]]
    index += 1
    while index < len(lines) and not lines[index].startswith(("@@", "diff --git ")):
        if not lines[index].strip() or lines[index] == "-- ":
            break
        header.append(lines[index])
        index += 1
    hunks = []
    for hunk in diff.hunks:
        start = index
        old, new = len(hunk.old_lines), len(hunk.new_lines)
        index += 1
        while old > 0 or new > 0:
            marker = lines[index][:1]
            old -= marker in (" ", "-", "")
            new -= marker in (" ", "+", "")
            index += 1
        while index < len(lines) and lines[index].startswith("\\"):
            index += 1
        hunks.append(tuple(lines[start:index]))
    return Section(diff, tuple(header), tuple(hunks)), index


def _retarget(line: str, target: str) -> str:
    if line.startswith("diff --git "):
        return f"diff --git a/{target} b/{target}"
    if line.startswith("--- a/"):
        return f"--- a/{target}"
    if line.startswith("+++ b/"):
        return f"+++ b/{target}"
    return line


def new_start(hunk: Hunk) -> int:
    return int(HUNK_RE.match(hunk.header).group(3))


class Assessor:
    """Judge a series against one ref; holds the two private indexes and the ref's rename map."""

    def __init__(self, mirror: Path, base: str, ref: str, commit: str, scratch: Path, indexes: tuple[dict, dict]):
        self.mirror = mirror
        self.base = base
        self.ref = ref
        self.commit = commit
        self.scratch = scratch
        self.ref_env, self.base_env = indexes
        self.counter = itertools.count()
        self.renames = _renames(mirror, base, commit)
        self.since = git.run(mirror, "show", "-s", "--format=%ct", base)

    def assess(self, patch: Patch) -> PatchVerdict:
        parts = sections(patch)
        pre = {d.old_path: self._read(d.old_path, self.base_env) for d in patch.diffs if d.old_path}
        applied_on_base = self._apply(self._whole(parts, self.base_env), self.base_env, check=False)
        post = {d.new_path: self._read(d.new_path, self.base_env) for d in patch.diffs if d.new_path}
        if not applied_on_base:
            self._apply_units(self._units(parts), self.base_env)
            pre, post = {}, {}
        verdict = self._judge(patch, parts, pre, post, applied_on_base)
        self._carry_forward(parts, verdict)
        return dataclasses.replace(verdict, advice=advice(patch, verdict.verdict))

    def _judge(self, patch: Patch, parts, pre: dict, post: dict, applied_on_base: bool) -> PatchVerdict:
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

    # --- applying -------------------------------------------------------------------------------------

    def _units(self, parts: tuple[Section, ...]):
        """(section, hunk index) pairs; a file change without hunks (a pure rename) is one unit."""
        for section in parts:
            if section.hunks:
                yield from ((section, (i,)) for i in range(len(section.hunks)))
            else:
                yield section, ()

    def _whole(self, parts: tuple[Section, ...], env: dict[str, str]) -> str:
        return "".join(s.text(target=self._target(s.diff, env)) for s in parts)

    def _unit_text(self, section: Section, hunks: tuple[int, ...], env: dict[str, str]) -> str:
        return section.text(hunks, self._target(section.diff, env))

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

    def _apply_units(self, units, env: dict[str, str]) -> None:
        """Apply each (section, hunks) unit that still applies, one by one."""
        for section, hunks in units:
            self._apply(self._unit_text(section, hunks, env), env, check=False)

    def _carry_forward(self, parts: tuple[Section, ...], verdict: PatchVerdict) -> None:
        """Put what REF still lacks into the REF index, so later patches see the series as far as it applies."""
        if verdict.verdict is Verdict.NEEDED:
            self._apply(self._whole(parts, self.ref_env), self.ref_env, check=False)
        elif verdict.hunks:
            merged = {(f.file, f.header) for f in verdict.hunks if f.state.merged}
            units = [(s, i) for s, i in self._units(parts) if (s.diff.path, _unit_header(s, i)) not in merged]
            self._apply_units(units, self.ref_env)

    # --- reading the indexes --------------------------------------------------------------------------

    def _read(self, path: str | None, env: dict[str, str]) -> list[str] | None:
        text = git.show_blob(self.mirror, f":{path}", env) if path else None
        return text.split("\n") if text is not None else None

    def _target(self, diff: FileDiff, env: dict[str, str]) -> str | None:
        """Where the file this diff changes lives in `env`'s index: its own path, else where upstream moved it."""
        for path in (diff.new_path, diff.old_path):
            if path and self._read(path, env) is not None:
                return path
        moved = self.renames.get(diff.old_path or diff.new_path)
        return moved if moved and self._read(moved, env) is not None else None

    # --- the tests ------------------------------------------------------------------------------------

    def _hunk_finding(self, section: Section, hunks: tuple[int, ...], pre: dict, post: dict) -> HunkFinding:
        diff = section.diff
        target = self._target(diff, self.ref_env)
        header = _unit_header(section, hunks)
        text = self._unit_text(section, hunks, self.ref_env)
        forward = self._apply(text, self.ref_env)
        reverse = self._apply(text, self.ref_env, reverse=True)
        moved = f" (at {target}, renamed upstream)" if target and target not in (diff.old_path, diff.new_path) else ""
        found = self._intent(section, hunks, target, pre, post)
        if reverse == CLEANLY and (forward != CLEANLY or found.present):
            return HunkFinding(diff.path, target, header, HunkState.IN_EXACT, f"reverse-applies cleanly{moved}")
        if found.present or (reverse and forward != CLEANLY):
            detail = found.detail if found.present else f"reverse-applies ignoring whitespace{moved}"
            return HunkFinding(diff.path, target, header, HunkState.IN_MODIFIED, detail, found.difference)
        if forward == CLEANLY:
            return HunkFinding(diff.path, target, header, HunkState.NEEDED, f"applies cleanly{moved}")
        why = (
            "applies only when ignoring whitespace: upstream reformatted its context; regenerate the patch"
            if forward else f"does not apply to {target or diff.path}; {found.detail}"
        )
        lines = [why, *itertools.chain.from_iterable(section.hunks[i] for i in hunks)]
        return HunkFinding(diff.path, target, header, HunkState.CONFLICT, "\n".join(lines))

    def _moves(self, parts: tuple[Section, ...]) -> tuple[str, ...]:
        """Evidence lines for the files this patch touches that upstream renamed."""
        moves = []
        for section in parts:
            target = self._target(section.diff, self.ref_env)
            if target and target not in (section.diff.old_path, section.diff.new_path):
                moves.append(f"{section.diff.path} is {target} in REF (renamed upstream); refresh rewrites the path")
        return tuple(moves)

    def _intent(self, section: Section, hunks: tuple[int, ...], target, pre: dict, post: dict) -> intent.Found:
        diff = section.diff
        if not hunks:
            return intent.renamed(diff, target)
        hunk = diff.hunks[hunks[0]]
        if diff.new_path is None:
            return intent.deleted(diff, target)
        if target is None:
            return intent.Found(False, f"{diff.path} is not in REF")
        ref_lines = self._read(target, self.ref_env)
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
        return sorted(paths | {self.renames[p] for p in paths if p in self.renames})

    def _range(self) -> tuple[str, ...]:
        """Commits on REF newer than the base and not in it (the mirror may be shallow)."""
        return (f"--max-age={self.since}", self.commit, "--not", self.base)

    def _same_patch_id(self, patch: Patch) -> tuple[str, ...] | None:
        """(commit, evidence...) for an upstream commit whose change to these files has this patch's patch-id."""
        mine = git.run(self.mirror, "patch-id", "--stable", stdin=patch.path).split()
        if not mine:
            return None
        log = self.scratch / f"log-{next(self.counter)}.txt"
        log.write_text(
            git.run(self.mirror, "log", "-p", "--no-merges", "--no-color", "--full-index", LOG_FORMAT,
                    *self._range(), "--", *self._paths(patch), strip=False)
        )
        ids = git.run(self.mirror, "patch-id", "--stable", stdin=log).splitlines()
        commit = next((line.split()[1] for line in ids if line.split()[0] == mine[0]), None)
        if commit is None:
            return None
        touched = git.run(self.mirror, "diff-tree", "--no-commit-id", "--name-only", "-r", "--root", commit).split()
        others = sorted(set(touched) - set(self._paths(patch)))
        how = f"together with {len(others)} other file(s) (squash)" if others else "and nothing else"
        return (
            commit,
            f"upstream commit {commit[:12]} {_subject(self.mirror, commit)!r} has the same patch-id "
            f"(git patch-id --stable) over the files this patch touches",
            f"that commit changes these files exactly as the patch does, {how}",
        )

    def _introduced_by(self, patch: Patch, parts: tuple[Section, ...]) -> str | None:
        """The oldest commit in range that added the longest added line REF holds verbatim (git log -S)."""
        candidates = []
        for section in parts:
            target = self._target(section.diff, self.ref_env)
            text = "\n".join(self._read(target, self.ref_env) or []) if target else ""
            added = (line.strip() for hunk in section.diff.hunks for line in hunk.added if intent.is_code(line))
            candidates += [line for line in added if line in text]
        if not candidates:
            return None
        needle = max(candidates, key=len)
        found = git.run(self.mirror, "log", "--reverse", "--format=%H", f"-S{needle}", *self._range(),
                        "--", *self._paths(patch)).split()
        return found[0] if found else None


def _unit_header(section: Section, hunks: tuple[int, ...]) -> str:
    return section.diff.hunks[hunks[0]].header if hunks else "(file header)"


def _combine(
    patch: Patch, findings: tuple[HunkFinding, ...], forward: str | None, commit: str | None, moves: tuple[str, ...]
) -> PatchVerdict:
    """The patch's verdict from its hunks' states."""
    states = [f.state for f in findings]
    merged = [f for f in findings if f.state.merged]
    listed = (*moves, *(_describe(f) for f in findings))
    if len(merged) == len(findings):
        exact = all(s is HunkState.IN_EXACT for s in states)
        verdict = Verdict.MERGED_EXACT if exact else Verdict.MERGED_MODIFIED
        return PatchVerdict(patch, verdict, "reverse-apply per hunk" if exact else "intent", commit, listed, findings)
    if HunkState.CONFLICT in states:
        return PatchVerdict(patch, Verdict.CONFLICT, "apply", commit, listed, findings)
    if merged:
        return PatchVerdict(patch, Verdict.PARTIAL, "intent", commit, listed, findings)
    if forward != CLEANLY:
        evidence = ("each hunk applies on its own but the patch does not apply as a whole", *listed)
        return PatchVerdict(patch, Verdict.CONFLICT, "apply", None, evidence, findings)
    evidence = ("the patch applies cleanly on REF and none of its hunks is there", *listed)
    return PatchVerdict(patch, Verdict.NEEDED, "forward-apply", None, evidence, findings)


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
    if verdict is Verdict.NEEDED and status.state in (UpstreamState.ACCEPTED, UpstreamState.BACKPORT):
        return f"contradiction: Upstream-Status says {status.state.value}, but REF does not contain it"
    return None


def _renames(mirror: Path, base: str, commit: str) -> dict[str, str]:
    """old path -> new path for files upstream renamed between the base and REF (tree diff; no history needed)."""
    out = git.run(mirror, "diff", "--find-renames", "--name-status", "-z", base, commit, strip=False)
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


def _subject(mirror: Path, commit: str) -> str:
    return git.run(mirror, "show", "-s", "--format=%s", commit)


def assess(mirror: Path, base: str, ref: str, commit: str, series: Series, scratch: Path) -> RefReport:
    """Verdicts for every patch of `series` against `commit` (named `ref`), in series order."""
    with contextlib.ExitStack() as stack:
        work = stack.enter_context(temp_dir(scratch, "status-"))
        ref_env = stack.enter_context(git.temp_index(mirror, work / "ref"))
        base_env = stack.enter_context(git.temp_index(mirror, work / "base"))
        git.read_tree(mirror, commit, ref_env)
        git.read_tree(mirror, base, base_env)
        assessor = Assessor(mirror, base, ref, commit, work, (ref_env, base_env))
        verdicts = tuple(assessor.assess(patch) for patch in series.patches)
    return RefReport(ref, commit, verdicts)


def table(status: StatusReport) -> str:
    """The verdicts as readable text, one block per ref."""
    rows = [f"base {status.base}", ""]
    for report in status.reports:
        rows.append(f"against {report.ref} ({report.commit[:12]})")
        width = max([len(v.patch.name) for v in report.verdicts] + [5])
        for v in report.verdicts:
            commit = f"  upstream {v.commit[:12]}" if v.commit else ""
            rows.append(f"  {v.patch.name:<{width}}  {v.verdict.value:<15}  decided by {v.test}{commit}")
            for line in v.evidence:
                rows.extend(f"      {part}" for part in line.splitlines())
            for finding in v.hunks:
                if finding.difference:
                    rows.append(f"      remaining difference in {finding.file} {finding.header.split(' @@')[0]} @@:")
                    rows.extend(f"        {part}" for part in finding.difference.splitlines())
            if v.advice:
                rows.append(f"      note: {v.advice}")
        rows.append("")
    return "\n".join(rows).rstrip("\n")


@dataclasses.dataclass(frozen=True)
class StatusReport:
    base: str
    reports: tuple[RefReport, ...]
    notes: tuple[str, ...]

    @property
    def occurred(self) -> frozenset[Verdict]:
        return frozenset(v.verdict for report in self.reports for v in report.verdicts)

    def to_json(self) -> dict:
        return {"base": self.base, "refs": [r.to_json() for r in self.reports]}


def default_refs(config: Config) -> tuple[str, ...]:
    """upstream.main, and the PR head when upstream.pr is set."""
    return (config.upstream.main,) + ((config.upstream.pr_ref,) if config.upstream.pr_ref else ())


def status(config: Config, cache: Cache, series: Series, refs: tuple[str, ...] = ()) -> StatusReport:
    """Verdicts for the series against each ref (default: `default_refs`), every ref resolved before any work."""
    mirror, notes = upstream.ensure_base(config, cache)
    resolved = []
    for ref in dict.fromkeys(refs or default_refs(config)):
        commit, more = upstream.resolve_ref(config, cache, ref)
        resolved.append((ref, commit))
        notes += more
    base = config.upstream.commit
    reports = tuple(assess(mirror, base, ref, commit, series, cache.scratch) for ref, commit in resolved)
    return StatusReport(base, reports, tuple(notes))
