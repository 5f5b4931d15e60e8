"""`lock`: image.lock, the fixed wheel's Requires-Dist resolved with uv into pinned, hashed wheels per platform."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from carry.util import reporter
from carry.util.record import record

if TYPE_CHECKING:
    from carry.app import App
    from carry.image.locked import runtimelock
    from carry.platforms import Platform


@record(kw_only=True)
class LockRequest:
    platforms: tuple[Platform, ...] = ()
    check: bool = False
    upgrade: bool = False


@record
class LockResult:
    """What `lock` did per platform (outcomes), or with --check, per platform None (fresh) or why it is stale."""

    outcomes: tuple[runtimelock.Outcome, ...]
    stale: tuple[tuple[Platform, str | None], ...]
    index: str


def lock(app: App, request: LockRequest) -> LockResult:
    """The runtime lock of each platform (image.platforms, or those given): the base image's facts first, then the
    fixed wheel as `wheel` makes it, then uv; with `check`, only whether each lock is fresh."""
    from carry.image.locked import runtimelock
    from carry.util.fsutil import temp_dir

    chosen = runtimelock.platforms_to_lock(app.config, request.platforms)
    app.require_pins(chosen)
    if request.check:  # a garbled lock, or one whose CUDA toolkit mixes releases: bad input before any work
        for platform in chosen:
            if runtimelock.lock_path(app.config, platform).exists():
                runtimelock.read(app.config, platform)
    facts = runtimelock.bases(app.config, chosen, app.cache)
    with temp_dir(app.cache.scratch, "lock-wheels-") as out:
        wheels = lock_wheels(app, chosen, out)
        if request.check:
            return LockResult((), runtimelock.check(app.config, facts, wheels), "")
        index = runtimelock.choose_index(os.environ, app.config.root)
        reporter.phase("index", index.source)
        outcomes = runtimelock.lock(app.config, app.cache, facts, wheels, index, request.upgrade)
    return LockResult(outcomes, (), index.source)


def lock_wheels(app: App, platforms: tuple[Platform, ...], out: Path) -> dict[Platform, Path]:
    """The fixed wheel of each platform, made as `wheel` makes it, where the placement rule says (producer.choose):
    here, else this machine's own wheel when it is pure Python, else in that platform's build stage."""
    from carry.app import wheel
    from carry.platforms import Platform
    from carry.wheelbuild import producer

    native = Platform.native()
    facts = {p: producer.Facts(platform=p, native=native, precompiled=wheel.precompiled_for(app, p)) for p in platforms}
    here = [p for p in platforms if producer.here(facts[p])]
    if any(p not in here for p in platforms) and native not in here and not app.config.arches_for(native):
        here.append(native)  # no CUDA code expected: probably pure, which serves every platform
    wheels: dict[Platform, Path] = {}
    if here:
        checked = app.check()
        for platform in here:
            built = app.builder(None, None, platform)(checked.mirror, checked.report, checked.series, out)
            wheels[platform] = built.path
    pure = next((w for w in wheels.values() if producer.serves_every_platform(w.name)), None)
    for platform in platforms:
        if platform in wheels:
            continue
        kind = producer.choose(dataclasses.replace(facts[platform], made_here=pure.name if pure else None))
        if kind is producer.Kind.PURE and pure is not None:
            wheels[platform] = pure
        else:  # the platform's build stage
            wheels[platform] = wheel.platform_wheel(app, platform, None, out).path
    return {platform: wheels[platform] for platform in platforms}
