"""What each CLI command does, wired from the modules in data-flow order; returns results for the CLI to print.

Modules that only some commands need are imported inside those commands: `check` and `version` start without
the wheel, image, gate and registry modules and the libraries behind them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from carry import config, version
from carry.arch import ArchList
from carry.cache import Cache
from carry.errors import BadInput

if TYPE_CHECKING:
    from carry import apply, drop, image, refresh, series, verdicts, verify, wheel
    from carry.progress import Progress


def read_version(config_path: Path) -> str:
    return str(version.read(_version_file(config_path)))


def bump_version(config_path: Path) -> str:
    return str(version.bump(_version_file(config_path)))


def _version_file(config_path: Path) -> Path:
    """VERSION's path: from the config when it loads, else beside it (so `version` works on a broken config)."""
    if config_path.exists():
        return config.load(config_path).version_file
    return config_path.absolute().parent / "VERSION"


@dataclasses.dataclass(frozen=True)
class FetchResult:
    base: str
    notes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CheckResult:
    report: apply.CheckReport
    notes: tuple[str, ...]
    series: series.Series
    mirror: Path


@dataclasses.dataclass(frozen=True)
class Session:
    config: config.Config
    cache: Cache

    @classmethod
    def open(cls, config_path: Path) -> Session:
        return cls(config.load(config_path), Cache.from_env())

    def series(self) -> series.Series:
        from carry import series

        return series.load(self.config.patches_dir)

    def fetch(self, update_pin: bool = False) -> FetchResult:
        from carry import upstream

        report = upstream.fetch(self.config, self.cache)
        notes = list(report.notes)
        pr_head = report.pr_head
        if pr_head is not None:
            warning = pr_head.describe(self.config.upstream.commit)
            if update_pin and pr_head.sha != self.config.upstream.commit:
                upstream.update_pin(self.config, pr_head.sha)
                notes.append(f"pin moved {self.config.upstream.commit[:12]} -> {pr_head.sha} in {self.config.path}")
                return FetchResult(pr_head.sha, tuple(notes))
            if warning:
                notes.append(f"warning: {warning}")
        elif update_pin:
            raise BadInput(f"{self.config.path}: --update-pin needs upstream.pr and a reachable upstream")
        return FetchResult(report.base, tuple(notes))

    def check(self, against: str | None = None) -> CheckResult:
        from carry import apply, upstream

        patches = self.series()
        mirror, notes = upstream.ensure_base(self.config, self.cache)
        base = self.config.upstream.commit
        if against:
            base, more = upstream.resolve_ref(self.config, self.cache, against)
            notes += more
        report = apply.check(mirror, base, patches, self.cache.scratch)
        return CheckResult(report, notes, patches, mirror)

    def version(self) -> str:
        return str(version.read(self.config.version_file))

    def arches(self, arch: str | None) -> ArchList:
        """--arch, else build.cuda_arches; the empty list (`none`, `[]`) builds a wheel with no CUDA code."""
        if arch is not None and not arch.strip():
            raise BadInput("--arch is empty; pass arches, e.g. --arch 9.0,12.1, or --arch none for a Python-only wheel")
        if arch is not None:
            return ArchList.parse(arch)
        if self.config.build.cuda_arches is None:
            raise BadInput(
                f"{self.config.path}: build.cuda_arches is not set; set it (e.g. '9.0,12.1', or [] for a "
                f"Python-only wheel) or pass --arch"
            )
        return self.config.build.cuda_arches

    def expected(self) -> verify.Expected:
        """What an artifact built from this repo now must say about itself."""
        from carry import verify

        return verify.Expected(self.version(), self.series().hash, self.config.upstream.commit)

    def wheel(self, arch: str | None, out: Path, jobs: int | None, progress: Progress) -> wheel.WheelResult:
        """check -> plan -> reuse or build the wheel -> publish into `out`."""
        from carry import toolchain, wheel

        arches = self.arches(arch)
        job_plan = toolchain.choose_jobs(jobs, self.config.build.env)
        current = self.version()
        checked = self.check()
        tools = toolchain.probe({**os.environ, **self.config.build.env}, self.config.build.compiler_cache,
                                self.cache.root)
        progress.phase("check", f"{len(checked.series.patches)} patch(es) on {checked.report.base[:12]}: "
                       f"tree {str(checked.report.tree)[:12]}")
        plan = wheel.plan(self.config, checked.report, current, arches, job_plan, tools)
        return wheel.build(self.config, self.cache, checked.mirror, checked.report, checked.series, plan, out,
                           progress)

    def image(self, options: image.ImageOptions, arch: str | None, progress: Progress) -> image.ImageResult:
        """check -> context (carry + config + bundle) -> BuildKit build -> tags and labels -> push."""
        from carry import git, image, toolchain
        from carry.config import CompilerCache

        arches = self.arches(arch)
        builder = image.resolve_builder(self.config, options)
        current = self.version()
        checked = self.check()
        progress.phase("check", f"{len(checked.series.patches)} patch(es) on {checked.report.base[:12]}: "
                       f"tree {str(checked.report.tree)[:12]}")
        pyproject = image.upstream_pyproject(git.show_blob(checked.mirror, f"{checked.report.tree}:pyproject.toml"))
        dist = image.distribution_name(pyproject)
        tools = toolchain.probe(dict(os.environ), CompilerCache.NONE, self.cache.root)
        plan = image.plan(self.config, checked.report, checked.series, current, arches, dist,
                          image.cuda_tag(tools.nvcc_version), options)
        return image.build(self.config, self.cache, checked.mirror, plan, options, builder,
                           image.build_requirements(pyproject), progress)

    def verify_image(self, ref: str) -> verify.Verification:
        from carry import image

        return image.verify_image(ref, self.config, self.expected())

    def verify_wheel(self, path: Path, arch: str | None) -> verify.Verification:
        from carry import verify

        arches = ArchList.parse(arch) if arch is not None else None
        return verify.verify_wheel(path, self.expected(), self.cache.scratch, arches)

    def status(self, against: tuple[str, ...] = ()) -> verdicts.StatusReport:
        """A verdict per patch against each ref (default: upstream.main, and the PR head when pr is set)."""
        from carry import verdicts

        return verdicts.status(self.config, self.cache, self.series(), against)

    def drop(self, name: str, against: str | None, force: bool) -> drop.Dropped:
        from carry import drop

        return drop.drop(self.config, self.cache, self.series(), name, against, force)

    def refresh(self, onto: str | None) -> refresh.Refreshed:
        from carry import refresh

        return refresh.refresh(self.config, self.cache, self.series(), onto)


def check_table(report: apply.CheckReport) -> str:
    """The check report as a readable table."""
    rows = [f"base   {report.base}", f"series {report.series_hash}", ""]
    width = max([len(r.patch.name) for r in report.results] + [5])
    rows.append(f"{'patch':<{width}}  {'status':<7} {'+':>4} {'-':>4}  files")
    for result in report.results:
        p = result.patch
        rows.append(f"{p.name:<{width}}  {result.status.value:<7} {p.added:>4} {p.removed:>4}  {', '.join(p.files)}")
        for offset in result.offsets:
            rows.append(f"{'':<{width}}  warning: {offset}")
        if result.failure:
            rows.append(f"{'':<{width}}  failed: {result.failure.describe()}")
    rows.append("")
    rows.append(f"tree   {report.tree}" if report.tree else "tree   (not written: a patch failed)")
    return "\n".join(rows)
