"""`wheel` and `pin`: the patched tree built into a gated wheel here, or in a platform's build stage (which of the
two: the one placement rule, carry/wheelbuild/producer.py); the precompiled pins found and written. What the image
and lock families share of a build is here too."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from carry.util import reporter
from carry.util.errors import BadInput, Failed
from carry.util.record import record

if TYPE_CHECKING:
    from carry.app import App, CheckResult
    from carry.image.buildkit import crossbuild
    from carry.platforms import Platform
    from carry.wheelbuild import pins, producer, wheel


@record(kw_only=True)
class WheelRequest:
    arch: str | None = None
    out: Path = Path("dist")
    jobs: int | None = None
    platform: Platform | None = None
    hermetic: bool = False
    wheelhouse: Path | None = None
    from_source: bool = False
    as_json: bool = False


@record
class WheelOutcome:
    """A wheel made here (`made`) or in a platform's build stage (`staged`): exactly one is set."""

    made: wheel.WheelResult | None = None
    staged: crossbuild.CrossWheel | None = None


def wheel_command(app: App, request: WheelRequest) -> WheelOutcome:
    """Here or in --platform's build stage, as the placement rule says; the other place's flags are bad input."""
    from carry.wheelbuild import producer

    target = request.platform
    here = target is None or producer.here(_facts(app, target, request.from_source))
    if here and (request.hermetic or request.wheelhouse):
        raise BadInput("--hermetic and --wheelhouse go with --platform (a build in a container); see --help")
    if not here and (request.jobs is not None or request.as_json):
        raise BadInput("--jobs and --json apply to builds on this machine; the build stage picks its jobs; see --help")
    if not request.from_source:
        app.require_pins((target,) if target else ())
    if not here:
        assert target is not None  # not here: a --platform was given
        staged = platform_wheel(app, target, request.arch, request.out, request.hermetic, request.wheelhouse)
        reporter.phase("done", f"{staged.platform} wheel, gate passed for {staged.gate.policy.arches}")
        return WheelOutcome(staged=staged)
    made = wheel_here(app, request)
    reporter.phase("done", "reused from cache" if made.reused else "built")
    return WheelOutcome(made=made)


def _facts(app: App, platform: Platform, from_source: bool) -> producer.Facts:
    """What the placement rule needs of `wheel --platform P`: it names P's build stage."""
    from carry.platforms import Platform
    from carry.wheelbuild import producer

    precompiled = not from_source and precompiled_for(app, platform)
    return producer.Facts(platform=platform, native=Platform.native(), precompiled=precompiled, staged=True)


def wheel_here(app: App, request: WheelRequest) -> wheel.WheelResult:
    """check -> (precompiled: binaries proven) -> plan -> reuse or build -> publish; refused when `out` has another."""
    builder = app.builder(request.arch, request.jobs, request.platform, request.from_source)
    checked = app.check()
    dropped_are_in_the_pin(app, checked)
    pin = builder.pin.wheel.pinned.sha256 if builder.pin else None
    one_artifact(app, checked, request.out, builder.platform, pin)
    return builder(checked.mirror, checked.report, checked.series, request.out)


def precompiled_for(app: App, platform: Platform) -> bool:
    """Whether build.precompiled has a wheel for `platform` (then a build for it runs here, nothing compiled)."""
    settings = app.config.build.precompiled
    return settings is not None and settings.wheel_for(platform) is not None


def platform_wheel(
    app: App,
    platform: Platform,
    arch: str | None,
    out: Path,
    hermetic: bool = False,
    wheelhouse: Path | None = None,
) -> crossbuild.CrossWheel:
    """check -> context -> that platform's build stage (emulated where foreign) -> checked wheel in `out`."""
    from carry.image.buildkit import container, crossbuild

    policy = app.policy(arch, platform)
    builder = container.resolve_builder(app.config, (platform,))
    checked = checked_said(app)
    one_artifact(app, checked, out, platform, None)
    requirements = container.build_requirements(upstream_pyproject(checked))
    target = crossbuild.Target(
        tree=checked.report.patched_tree(),  # a series that does not apply fails here, before any build
        platform=platform,
        policy=policy,
        expected=app.expected(checked),
        requirements=requirements,
        hermetic=hermetic,
        wheelhouse=wheelhouse,
        upstream_version=upstream_version(app, checked),
    )
    return crossbuild.build(app.config, app.cache, checked.mirror, target, builder, out)


def pin(app: App, check: bool) -> pins.Pinned:
    """The precompiled wheels of the merge-base of upstream.commit and main, found on build.precompiled.nightly's
    per-commit index (walking back where needed), downloaded, proven and, unless `check`, written."""
    from carry.wheelbuild import nightly, pins

    nightly.Index.of(app.config)  # no nightly block, an unset ${NAME}: bad input before any work
    checked = app.check()
    if checked.report.tree is None:
        raise Failed("the series does not apply; run `check` for details")
    return pins.pin(app.config, app.cache, checked.mirror, checked.report.tree, check)


def checked_said(app: App) -> CheckResult:
    """The series checked on the pin, said in one line, and the dropped patches checked against the pin."""
    checked = app.check()
    reporter.phase(
        "check",
        f"{len(checked.series.patches)} patch(es) on {checked.report.base[:12]}: "
        f"tree {checked.report.patched_tree()[:12]}",
    )
    dropped_are_in_the_pin(app, checked)
    return checked


def one_artifact(app: App, checked: CheckResult, out: Path, platform: Platform, precompiled: str | None) -> None:
    """Bad input when `out` holds another artifact under this VERSION (wheel.refuse_another_artifact)."""
    from carry.config.reader import public_url
    from carry.wheelbuild import wheel

    report, upstream = checked.report, public_url(app.config.upstream.url)
    wheel.refuse_another_artifact(
        out, app.version(), upstream, report.base, report.patched_tree(), platform, precompiled
    )


def dropped_are_in_the_pin(app: App, checked: CheckResult) -> None:
    """Bad input when patches/DROPPED.md says upstream merged a dropped patch at a commit the pin lacks."""
    from carry.verdicts import droplog

    droplog.check_pin(app.config, app.cache, checked.mirror, app.config.patches_dir)


def upstream_version(app: App, checked: CheckResult) -> str | None:
    """The upstream's own version to go before +carry.VERSION (None: build.wheel_version), found here from its tags."""
    if app.config.build.wheel_version is not None:
        return None
    from carry.source import upstreamversion

    found = upstreamversion.resolve(app.config, app.cache, checked.mirror, checked.report.patched_tree())
    reporter.phase(
        "version", f"upstream {found.version} ({found.source}): the wheel is {found.version}+carry.{app.version()}"
    )
    return found.version


def upstream_pyproject(checked: CheckResult) -> dict:
    from carry.source import upstreamversion

    return upstreamversion.pyproject(checked.mirror, checked.report.patched_tree())
