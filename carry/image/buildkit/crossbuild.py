"""A wheel for another platform (`wheel --platform linux/arm64` on an x86-64 machine): the Dockerfile's build
stage runs `build.py wheel` as that platform (under QEMU where the CPU is foreign), BuildKit exports the `wheel`
stage to a local directory, and the result is checked here like a native wheel before it is published: its
platform tag, the CPU of every shared object, the arch gate for the platform's arches, and its buildinfo."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from carry.binaries.gatepolicy import GatePolicy
from carry.config import Config
from carry.image.buildkit import container
from carry.image.buildkit.container import Builder, StageBuild
from carry.platforms import Platform
from carry.util import reporter
from carry.util.cache import Cache
from carry.util.errors import Failed
from carry.util.fsutil import temp_dir
from carry.util.record import record
from carry.wheelbuild import verify
from carry.wheelbuild.artifacts import publish, write_gate_report
from carry.wheelbuild.verify import Expected

if TYPE_CHECKING:
    from carry.binaries.gate import GateReport


@dataclasses.dataclass(frozen=True)
class CrossWheel:
    path: Path
    platform: Platform
    checks: verify.Inspection

    @property
    def gate(self) -> GateReport:
        return self.checks.gate


@record(kw_only=True)
class Target:
    """One platform's wheel, resolved once: the patched `tree` built in `platform`'s build stage with the upstream's
    build `requirements` (from a `wheelhouse` with `hermetic`), gated by `policy` and checked against `expected`."""

    tree: str
    platform: Platform
    policy: GatePolicy
    expected: Expected
    requirements: list[str]
    hermetic: bool = False
    wheelhouse: Path | None = None
    upstream_version: str | None = None


def build(config: Config, cache: Cache, mirror: Path, target: Target, builder: Builder, out: Path) -> CrossWheel:
    """Build in `target.platform`'s build stage, check the exported wheel, publish it into `out` (atomically)."""
    tree, platform, policy, expected = target.tree, target.platform, target.policy, target.expected
    hermetic, wheelhouse, requirements = target.hermetic, target.wheelhouse, target.requirements
    arches = policy.arches
    log = cache.logs / f"wheel-{platform.tag}-{tree[:12]}.log"
    log.unlink(missing_ok=True)
    with temp_dir(cache.scratch, "crosswheel-") as scratch:
        context = scratch / "context"
        container.assemble_context(config, cache, mirror, context, requirements, (platform,))
        if hermetic:
            container.hermetic_wheelhouse(config, cache, (platform,), requirements, wheelhouse, context / "wheelhouse")
        reporter.phase("build", f"build stage for {platform}{platform.where()}, arches {arches}; log {log}")
        exported = scratch / "exported"
        access = container.stage_access(config, scratch, hermetic)
        args = container.stage_args(config, platform, str(arches), hermetic, target.upstream_version)
        stage = StageBuild(platform, container.WHEEL_STAGE, args, access.network, output_dir=exported)
        stage.run(builder, access.secret, context, log)
        wheel = _single_wheel(exported, log)
        reporter.phase("gate", f"{wheel.name}: {platform.machine} code for arches {arches}")
        report = _check(wheel, platform, policy, expected)
        write_gate_report(wheel, report.full_lines())
        published = publish(wheel, out)
    return CrossWheel(published, platform, report)


def _single_wheel(directory: Path, log: Path) -> Path:
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise Failed(f"the build stage exported {len(wheels)} wheels, expected 1; log: {log}")
    return wheels[0]


def _check(wheel: Path, platform: Platform, policy: GatePolicy, expected: Expected) -> verify.Inspection:
    """The wheel is what the build stage says it is (platform, CPU of tag and every `.so`, gate, tree, series); any
    problem fails the build, with the checks printed in full."""
    tag = wheel.name.removesuffix(".whl").rsplit("-", 1)[-1]
    if Platform.from_wheel_tag(tag) not in (platform, None):
        raise Failed(f"{wheel.name} is tagged {tag}, not for {platform}")
    checked = verify.verify_wheel(wheel, expected, policy.arches)
    checks = checked.checks
    assert checks is not None  # verify_wheel inspects every wheel (an image's verification may have no checks)
    for line in checks.lines() if checked.ok else checks.full_lines():
        reporter.phase("gate", line)
    if checked.info.get("platform") != str(platform):
        raise Failed(f"{wheel.name} says it was built on {checked.info.get('platform')}, not {platform}")
    if checked.mismatches:
        raise Failed(f"{wheel.name}: {checked.mismatches[0].describe()}")
    if not checks.ok:
        raise Failed(f"{wheel.name} failed its checks ({checks.summary()}); nothing was published")
    return checks
