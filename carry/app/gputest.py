"""`test`, `prove` and `suite`: build.tests on this machine's GPU against one artifact or every prefix of the
series; the upstream's own tests on the fixed wheel and on the release it was made from."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from carry.util.errors import BadInput, Failed
from carry.util.record import record

if TYPE_CHECKING:
    from carry.app import App
    from carry.config.build import TestCommand
    from carry.gputest import prove, testrun, upstreamsuite
    from carry.platforms import Platform


@record(kw_only=True)
class TestRequest:
    __test__ = False  # not a pytest class
    artifact: str
    out: Path = Path("dist")
    timeout: float = 900


@record
class TestOutcome:
    __test__ = False  # not a pytest class
    report: testrun.TestReport
    path: Path


@record(kw_only=True)
class ProveRequest:
    arch: str | None = None
    out: Path = Path("dist")
    jobs: int | None = None
    timeout: float = 900


@record(kw_only=True)
class SuiteRequest:
    wheel: Path
    against: Path | None = None
    rerun: bool = False


def _tests(app: App) -> tuple[TestCommand, ...]:
    if not app.config.build.tests:
        raise BadInput(
            f"{app.config.path}: build.tests is empty; list the commands that prove the fix, "
            f'e.g. tests: ["python -m pkg.repro"]'
        )
    return app.config.build.tests


def run_tests(app: App, request: TestRequest) -> TestOutcome:
    """Run build.tests against a wheel or an image on this GPU (testrun.run_artifact)."""
    from carry.gputest import gpu, testrun

    commands = tuple(command for command in _tests(app) if not command.tree)
    if not commands:
        raise BadInput(
            f"{app.config.path}: every build.tests entry runs against the source tree (against: "
            f"tree), none against a wheel or image; `status --test` and `prove` run those"
        )
    found = gpu.require("test", commands)
    report, path = testrun.run_artifact(
        request.artifact, app.config, commands, found, app.cache.scratch, request.out, request.timeout
    )
    return TestOutcome(report, path)


def prove_series(app: App, request: ProveRequest) -> prove.Proof:
    """base and each prefix of the series built and tested (prove.run); the GPU and tests checked before any build."""
    from carry.gputest import gpu, prove

    commands = _tests(app)
    found = gpu.require("prove", commands)
    builder = app.builder(request.arch, request.jobs)
    suite = prove.Suite(commands=commands, gpu=found, timeout=request.timeout)
    return prove.run(app.config, app.cache, app.series(), builder, suite, request.out)


def suite(app: App, request: SuiteRequest) -> upstreamsuite.Outcome:
    """The upstream's own tests on `wheel` and on `against` (default: build.precompiled's), compared per test id."""
    from carry.gputest import upstreamsuite

    upstreamsuite.selection_of(app.config)  # no selection: bad input before any work
    wheel, against = request.wheel, request.against
    platform = _runs_here(wheel, "WHEEL")
    source = "--against"
    if against is None:
        from carry.wheelbuild import precompiled

        pin = precompiled.pin(app.config, app.cache, platform)
        if pin is None:
            raise BadInput(
                f"{app.config.path}: no wheel to compare {wheel.name} with: build.precompiled has none for "
                f"{platform}; pass --against WHEEL (the release it was made from)"
            )
        against, source = pin.path, f"build.precompiled.wheels.{platform}"
    else:
        _runs_here(against, "--against")
    checked = app.check()
    if checked.report.tree is None:
        raise Failed("the series does not apply; run `check` for details")
    inputs = upstreamsuite.Inputs(
        config=app.config,
        cache=app.cache,
        mirror=checked.mirror,
        commit=checked.report.base,
        tree=checked.report.tree,
        wheel=wheel,
        against=against,
        against_source=source,
        rerun=request.rerun,
    )
    return upstreamsuite.run(inputs)


def _runs_here(wheel: Path, what: str) -> Platform:
    """The platform a wheel's tests run on, which must be this machine's (a pure wheel runs anywhere)."""
    from carry.platforms import Platform

    if not wheel.is_file() or not wheel.name.endswith(".whl"):
        raise BadInput(f"{what} {wheel}: not a wheel file; pass the .whl that `wheel` printed")
    native = Platform.native()
    found = Platform.from_wheel_tag(wheel.name.removesuffix(".whl").rsplit("-", 1)[-1])
    if found is not None and found is not native:
        raise BadInput(
            f"{wheel.name} is a {found} wheel and this machine is {native}: its tests run on a {found} machine"
        )
    return native
