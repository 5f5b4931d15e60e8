"""`prove`: build every prefix of the series, run build.tests on each, and name the patch that flips each test. The
behavioural counterpart of `status`: base, base+0001, ... each become a wheel (cached by tree like every build) with
a test report beside it; a test that fails on one prefix and passes on the next was fixed by the patch it adds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from carry.gputest.gpu import Gpu
from carry.gputest.testrun import TestReport
from carry.source.series import Patch, Series
from carry.util import reporter
from carry.util.errors import Failed
from carry.util.record import record

if TYPE_CHECKING:
    from carry.config import Config
    from carry.config.build import TestCommand
    from carry.util.cache import Cache
    from carry.wheelbuild.wheel import Builder


@dataclasses.dataclass(frozen=True)
class Prefix:
    """The first `len(series.patches)` patches of the series; `added` is the one this prefix adds, if any."""

    series: Series
    added: Patch | None

    @property
    def label(self) -> str:
        return "+".join(["base", *(f"{patch.number:04d}" for patch in self.series.patches)])


def prefixes(series: Series) -> tuple[Prefix, ...]:
    """base, then base plus each patch in turn, ending with the whole series."""
    return tuple(
        Prefix(
            dataclasses.replace(series, patches=series.patches[:count]), series.patches[count - 1] if count else None
        )
        for count in range(len(series.patches) + 1)
    )


@dataclasses.dataclass(frozen=True)
class Step:
    """One prefix: the wheel it built, the report written beside it, and what the report says."""

    prefix: Prefix
    wheel: Path
    report_path: Path
    report: TestReport
    reused: bool


@dataclasses.dataclass(frozen=True)
class Flip:
    """A test whose outcome changed when `patch` was added."""

    patch: str
    command: str
    before: str
    after: str

    def describe(self) -> str:
        verb = "fixes" if self.after == "PASS" else "breaks"
        return f"{self.patch} {verb} `{self.command}`: {self.before} -> {self.after}"


def flips(steps: tuple[Step, ...]) -> tuple[Flip, ...]:
    """Every test whose verdict differs between a prefix and the one before it, named by the patch added."""
    found = []
    for before, after in zip(steps, steps[1:]):
        for old, new in zip(before.report.results, after.report.results):
            if old.passed != new.passed:
                assert after.prefix.added is not None  # only the first step, base, adds no patch
                found.append(Flip(after.prefix.added.name, new.command, old.verdict, new.verdict))
    return tuple(found)


@dataclasses.dataclass(frozen=True)
class Proof:
    gpu: Gpu
    steps: tuple[Step, ...]

    @property
    def flips(self) -> tuple[Flip, ...]:
        return flips(self.steps)

    @property
    def passed(self) -> bool:
        """The whole series passes every test."""
        return self.steps[-1].report.passed

    def learned(self) -> tuple[dict[str, list[str]], dict[str, str], str]:
        """For learned.record: patch name -> the tests it makes pass, each patch's sha256, the GPU."""
        fixes: dict[str, list[str]] = {}
        for flip in self.flips:
            if flip.after == "PASS":
                fixes.setdefault(flip.patch, []).append(flip.command)
        sha256 = {patch.name: patch.sha256 for step in self.steps for patch in step.prefix.series.patches}
        return fixes, sha256, self.gpu.describe()

    def to_json(self) -> dict:
        return {
            "gpu": self.gpu.to_json(),
            "passed": self.passed,
            "prefixes": [
                {
                    "label": step.prefix.label,
                    "patches": [patch.name for patch in step.prefix.series.patches],
                    "series_hash": step.prefix.series.hash,
                    "wheel": str(step.wheel),
                    "sha256": step.report.artifact.digest,
                    "report": str(step.report_path),
                    "reused": step.reused,
                    "passed": step.report.passed,
                    "tests": [
                        {
                            "command": result.command,
                            "passed": result.passed,
                            "exit_status": result.exit_status,
                            "last_line": result.last_line(),
                        }
                        for result in step.report.results
                    ],
                }
                for step in self.steps
            ],
            "flips": [dataclasses.asdict(flip) for flip in self.flips],
        }


def table(proof: Proof) -> str:
    """The proof for people: per prefix its verdict and wheel, per test its verdict and last output line."""
    width = max(len(step.prefix.label) for step in proof.steps)
    rows = [f"gpu {proof.gpu.describe()}", ""]
    for step in proof.steps:
        rows.append(f"{step.prefix.label:<{width}}  {'PASS' if step.report.passed else 'FAIL'}  {step.wheel}")
        for result in step.report.results:
            rows.append(f"  {result.verdict}  {result.command}  ({result.outcome()})")
            if result.last_line():
                rows.append(f"        {result.last_line()}")
    rows.append("")
    rows += [flip.describe() for flip in proof.flips] or ["no patch changes the outcome of any test"]
    return "\n".join(rows)


@record(kw_only=True)
class Suite:
    """What each prefix is tested with: the `commands`, on the `gpu` that answered, each within `timeout` seconds."""

    commands: tuple[TestCommand, ...]
    gpu: Gpu
    timeout: float


def run(config: Config, cache: Cache, series: Series, builder: Builder, suite: Suite, out: Path) -> Proof:
    """Every prefix checked first (the whole series must apply), then each built into out/prove/<prefix>/ and
    tested; each report is written beside its wheel and what the proof learned beside the patches."""
    from carry.gputest import learned, testrun
    from carry.source import apply, upstream

    commands, gpu, timeout = suite.commands, suite.gpu, suite.timeout
    mirror = upstream.ensure_base(config, cache)
    checked = [
        (prefix, apply.check(mirror, config.upstream.commit, prefix.series, cache.scratch))
        for prefix in prefixes(series)
    ]
    if not checked[-1][1].ok:
        failed = [result.patch.name for result in checked[-1][1].results if result.failure]
        raise Failed(f"the series does not apply ({', '.join(failed)} failed); run `check` for details")
    steps = []
    for prefix, report in checked:
        reporter.phase("prove", prefix.label)
        built = builder(mirror, report, prefix.series, out / "prove" / prefix.label)
        with testrun.tree_checkout(cache, mirror, report.tree, any(c.tree for c in commands)) as tree:
            tested = testrun.run_on_wheel(built.path, commands, gpu, cache.scratch, timeout, tree, config.root)
        path = testrun.write(tested, testrun.wheel_report_path(built.path))
        steps.append(Step(prefix, built.path, path, tested, built.reused))
    proof = Proof(gpu, tuple(steps))
    learned.record(series.directory, *proof.learned())
    return proof
