"""A verdict by behaviour (`status --test`): does the patch's own test pass on REF without the patch?

A patch names its test in a `Carry-Test:` trailer (one of build.tests, or a command of its own), or `prove` learned
which test it fixes (patches/PROVED.json). For each ref, REF plus the earlier patches that still apply there is built
and the test run on it: it passes -> FIXED-UPSTREAM whatever the text says (a MERGED-* verdict stays, the test
backing it); it fails -> still needed, the text's verdict stays (NEEDED is then decided by the test; CONFLICT still
says it needs rebasing, DELETED-UPSTREAM / PR-ONLY that nothing is left to patch); it needs a GPU and none answers ->
not run, said in one line, the text's verdict stands.
"""

from __future__ import annotations

import dataclasses
import enum
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from carry.config import Config
from carry.config.build import TestCommand
from carry.gputest import gpu
from carry.source.series import Patch, Series
from carry.util import reporter
from carry.util.errors import CarryError
from carry.util.record import record

if TYPE_CHECKING:
    from carry.gputest.testrun import CommandResult
    from carry.source.apply import CheckReport
    from carry.util.cache import Cache
    from carry.verdicts.verdicts import PatchVerdict, StatusReport
    from carry.wheelbuild.wheel import WheelResult

TEST_TIMEOUT_S = 900

# The configured wheel build of a tree (a wheel.Builder), from source when asked: what `judge` builds REF with.
BuilderFor = Callable[[bool], Callable]


class Outcome(enum.Enum):
    PASS = "pass"  # every test of the patch passes on REF without it
    FAIL = "fail"  # one fails: still needed
    NEEDS_GPU = "needs a GPU"  # a test needs a GPU and none answers: not run
    ERROR = "error"  # REF without the patch could not be built or tested (the series does not apply, a build failed)


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """What the patch's tests did on REF without it, in words (`lines`) and as data."""

    outcome: Outcome
    tests: tuple[str, ...]
    source: str  # where the tests came from: the trailer, or what prove learned
    mode: str  # how REF was made runnable: "tree" (checked out, nothing built) or "wheel"
    lines: tuple[str, ...]
    earlier: tuple[str, ...] = ()  # the earlier patches and their verdicts: REF had them built in as far as they apply

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "outcome": self.outcome.value}


def tests_for(config: Config, patch: Patch, learned: dict) -> tuple[tuple[TestCommand, ...], str] | None:
    """The patch's tests and their source: its Carry-Test trailers, else what prove learned; None if neither. A
    trailer naming a build.tests entry (same arguments) takes its settings; any other runs like a default entry."""
    if patch.tests:
        return tuple(_command(config, text) for text in patch.tests), "its Carry-Test trailer"
    found = learned.get(patch.name)
    if found is None:
        return None
    return tuple(
        _command(config, text) for text in found.fixes
    ), f"what prove learned on {found.proved} (patches/PROVED.json)"


def _command(config: Config, text: str) -> TestCommand:
    argv = tuple(shlex.split(text))
    return next((t for t in config.build.tests if t.argv == argv), TestCommand(argv, text.strip()))


@record(kw_only=True)
class Without:
    """What `run_without` tests: the patch's `tests` on REF (`commit`) with `series` (the series without it);
    `tree` is REF with `series` applied as far as it applies (status follows upstream's renames; `git apply` cannot)."""

    commit: str
    series: Series
    tree: str
    tests: tuple[TestCommand, ...]


def run_without(
    cache: Cache,
    project: Path,
    builder_for: BuilderFor,
    mirror: Path,
    target: Without,
    found: gpu.Gpu | None,
    timeout: float = TEST_TIMEOUT_S,
) -> Behaviour:
    """Build REF with `target.series` applied in the cheapest correct mode, run the patch's `target.tests` on it, and
    say PASS, FAIL, NEEDS_GPU (a test needs a GPU and `found`, the GPU that answered, is None: before anything is
    built) or ERROR (REF plus the series could not be built or tested, with the reason).

    When every test runs in the source tree (`against: tree`) nothing is built: each runs in a checkout of the tree.
    Otherwise `builder_for` (the command's `App.builder`, cached by tree like every build) builds a wheel (see
    `_build`) and testrun runs the tests in a fresh venv (tree tests in a checkout beside it)."""
    from carry.gputest import testrun
    from carry.source import apply
    from carry.util.fsutil import temp_dir

    series, tests = target.series, target.tests
    texts = tuple(t.text for t in tests)
    wheel_tests = any(not t.tree for t in tests)
    mode = "wheel" if wheel_tests else "tree"
    if found is None and any(t.gpu for t in tests):
        needing = ", ".join(f"`{t.text}`" for t in tests if t.gpu)
        line = f"its test {needing} needs a GPU and {gpu.missing()}: not run, the verdict is the text's"
        return Behaviour(Outcome.NEEDS_GPU, texts, "", mode, (line,))
    report = apply.CheckReport(target.commit, series.hash, target.tree, ())
    try:
        with testrun.tree_checkout(cache, mirror, report.tree, any(t.tree for t in tests)) as checkout:
            if wheel_tests:
                with temp_dir(cache.scratch, "behaviour-") as work:
                    built = _build(builder_for, mirror, report, series, work / "dist")
                    results = testrun.run_on_wheel(
                        built.path, tests, found or gpu.NONE, cache.scratch, timeout, checkout, project
                    ).results
            else:
                results = testrun.run_in_tree(checkout, tests, cache.scratch, timeout, project)
    except CarryError as exc:
        return Behaviour(Outcome.ERROR, texts, "", mode, (f"REF without the patch could not be tested: {exc}",))
    lines = tuple(_line(result) for result in results)
    outcome = Outcome.PASS if all(r.passed for r in results) else Outcome.FAIL
    return Behaviour(outcome, texts, "", mode, lines)


def _build(builder_for: BuilderFor, mirror: Path, report: CheckReport, series: Series, out: Path) -> WheelResult:
    """The wheel of REF without the patch, the cheapest correct way: precompiled where build.precompiled has a
    wheel whose compiled inputs REF still has, else the configured build (Python-only with cuda_arches [])."""
    from carry.wheelbuild.precompiled import InputsDiffer

    try:
        return builder_for(False)(mirror, report, series, out)
    except InputsDiffer as differ:
        reporter.phase("precompiled", f"not usable on REF ({differ}); building from source")
        return builder_for(True)(mirror, report, series, out)


def _line(result: CommandResult) -> str:
    last = f": {result.last_line()}" if result.last_line() else ""
    return f"{result.verdict} `{result.command}` on REF without the patch ({result.outcome()}){last}"


def judge(
    config: Config,
    cache: Cache,
    builder_for: BuilderFor,
    report: StatusReport,
    series: Series,
    timeout: float = TEST_TIMEOUT_S,
) -> StatusReport:
    """`report` with each patch that has a test judged by it too, against every ref of the report; a note for each
    patch judged by its text alone (no test, or one that needs a GPU here)."""
    from carry.gputest import learned
    from carry.source import upstream
    from carry.verdicts.verdicts import RefReport

    mirror = upstream.ensure_base(config, cache)
    known = learned.load(series.directory)
    refs = []
    probed: tuple[gpu.Gpu | None] | None = None
    for ref_report in report.reports:
        verdicts = []
        for index, verdict in enumerate(ref_report.verdicts):
            chosen = tests_for(config, verdict.patch, known)
            if chosen is None:
                reporter.note(
                    f"{verdict.patch.name}: no Carry-Test trailer and nothing learned by prove; judged by "
                    f"its text against {ref_report.ref}"
                )
                verdicts.append(verdict)
                continue
            tests, source = chosen
            # every caller assesses the report it judges with trees=True (verdicts.status): each verdict has one
            assert verdict.before is not None, f"{verdict.patch.name}: judged on a report assessed without trees"
            earlier = dataclasses.replace(series, patches=series.patches[:index])
            if probed is None:
                probed = (gpu.probe(),)  # once per judgement: nvidia-smi is slow where no GPU answers
            target = Without(commit=ref_report.commit, series=earlier, tree=verdict.before, tests=tests)
            found = run_without(cache, config.root, builder_for, mirror, target, probed[0], timeout)
            built_on = tuple(f"{v.patch.name} {v.verdict.value}" for v in ref_report.verdicts[:index])
            found = dataclasses.replace(found, source=source, earlier=built_on)
            if found.outcome is Outcome.NEEDS_GPU:
                reporter.note(f"{verdict.patch.name}: {found.lines[0]}")
            verdicts.append(combine(verdict, found))
        refs.append(RefReport(ref_report.ref, ref_report.commit, tuple(verdicts)))
    return dataclasses.replace(report, reports=tuple(refs))


def combine(verdict: PatchVerdict, behaviour: Behaviour) -> PatchVerdict:
    """The verdict once the patch's test has run on REF without it (see the module's docstring)."""
    from carry.verdicts.verdicts import Verdict, advice

    tests = ", ".join(f"`{t}`" for t in behaviour.tests)
    said = f"its test {tests} (from {behaviour.source})"
    earlier = f"REF with the earlier patches as far as they apply there ({', '.join(behaviour.earlier)})"
    how = "checked out, nothing built" if behaviour.mode == "tree" else "built into a wheel"
    lines = (*behaviour.lines, f"tested on {earlier if behaviour.earlier else 'REF as it is'}, {how}")
    data = behaviour.to_json()
    text = verdict.verdict
    if behaviour.outcome is Outcome.PASS and not text.merged:
        evidence = (
            f"{said} passes on REF without the patch: upstream fixed it its own way",
            *lines,
            f"the text alone says {text.value} (decided by {verdict.test}):",
            *verdict.evidence,
        )
        return dataclasses.replace(
            verdict,
            verdict=Verdict.FIXED_UPSTREAM,
            test="test",
            commit=None,
            evidence=evidence,
            behaviour=data,
            advice=advice(verdict.patch, Verdict.FIXED_UPSTREAM),
        )
    if behaviour.outcome is Outcome.PASS:
        return dataclasses.replace(
            verdict, evidence=(*verdict.evidence, f"{said} passes on REF too", *lines), behaviour=data
        )
    if behaviour.outcome is Outcome.FAIL:
        if text.merged:
            note = (
                f"{said} fails on REF although the patch's change is there: the failure has another cause; look "
                f"before dropping"
            )
            return dataclasses.replace(verdict, evidence=(*verdict.evidence, *lines), behaviour=data, advice=note)
        if text in (Verdict.DELETED_UPSTREAM, Verdict.PR_ONLY):
            return dataclasses.replace(
                verdict,
                evidence=(*verdict.evidence, f"{said} fails on REF too: the code it fixed is not there either", *lines),
                behaviour=data,
            )
        head = f"{said} fails on REF without the patch: still needed"
        decided = "test" if text is Verdict.NEEDED else verdict.test
        return dataclasses.replace(verdict, test=decided, evidence=(head, *lines, *verdict.evidence), behaviour=data)
    return dataclasses.replace(verdict, evidence=(*verdict.evidence, *lines), behaviour=data)
