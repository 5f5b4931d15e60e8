"""The application layer: `App`, the context every command is handed (the config, the cache, VERSION, the series,
its check on the pin and the toolchain, each computed once, when first asked), and one module per family of
commands, each entry taking `App` and its command's frozen request record.

This `__init__` is the context itself, not a re-export: `check` and `version` load it and nothing else of app/
(tests/test_spine.py); what only some commands need is imported inside them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from carry import config
from carry.arch import ArchList, given
from carry.util.cache import Cache
from carry.util.errors import BadInput
from carry.util.record import record

if TYPE_CHECKING:
    from carry.binaries.gatepolicy import GatePolicy
    from carry.platforms import Platform
    from carry.source import apply, series
    from carry.wheelbuild import toolchain, verify
    from carry.wheelbuild.toolchain import BuildTools
    from carry.wheelbuild.wheel import Builder


def read_version(config_path: Path) -> str:
    from carry import version

    return str(version.read(_version_file(config_path)))


def bump_version(config_path: Path) -> str:
    from carry import version

    return str(version.bump(_version_file(config_path)))


def _version_file(config_path: Path) -> Path:
    """VERSION's path: from the config when it loads, else beside it (so `version` works on a broken config)."""
    return config.load(config_path).version_file if config_path.exists() else config_path.absolute().parent / "VERSION"


@record
class CheckResult:
    report: apply.CheckReport
    series: series.Series
    mirror: Path


class App:
    """What every command shares, each fact computed once and only when first asked: the config, the cache,
    VERSION, the series, the series checked on the pin (one apply per command, whoever asks), the toolchain."""

    def __init__(self, loaded: config.Config, cache: Cache):
        self.config, self.cache = loaded, cache
        self._version: str | None = None
        self._series: series.Series | None = None
        self._checked: CheckResult | None = None
        self._tools: toolchain.Toolchain | None = None
        self._build_tools: BuildTools | None = None

    @classmethod
    def open(cls, config_path: Path) -> App:
        return cls(config.load(config_path), Cache.from_env())

    def version(self) -> str:
        if self._version is None:
            from carry import version

            self._version = str(version.read(self.config.version_file))
        return self._version

    def series(self) -> series.Series:
        if self._series is None:
            from carry.source import series

            self._series = series.load(self.config.patches_dir)
        return self._series

    def check(self, against: str | None = None) -> CheckResult:
        """The series applied onto the pin (once a command: the answer is kept) or onto `against` (each time)."""
        if against is None and self._checked is not None:
            return self._checked
        from carry.source import apply, upstream

        patches = self.series()
        mirror = upstream.ensure_base(self.config, self.cache)
        base = upstream.resolve_ref(self.config, self.cache, against) if against else self.config.upstream.commit
        checked = CheckResult(apply.check(mirror, base, patches, self.cache.scratch), patches, mirror)
        if against is None:
            self._checked = checked
        return checked

    def toolchain(self) -> toolchain.Toolchain:
        """nvcc and the host compiler as build.env finds them: probed once a command (`{cuda}`, builds)."""
        if self._tools is None:
            import os

            from carry.wheelbuild import toolchain

            self._tools = toolchain.probe({**os.environ, **self.config.build.env}, self.cache.root)
        return self._tools

    def build_tools(self) -> BuildTools:
        """What every platform's build of this command compiles with: `toolchain` and build.compiler_cache, the remote
        cache resolved now (a bad $CARRY_REMOTE_CACHE_URL is bad input before any work)."""
        if self._build_tools is None:
            import os

            from carry.wheelbuild import compilecache, distbuild, toolchain

            distributed = distbuild.setting(self.config, os.environ)
            if distributed is not None:
                distbuild.token(os.environ)  # a token file that cannot be read is bad input before any work
            self._build_tools = toolchain.BuildTools(
                self.toolchain,
                self.config.build.compiler_cache,
                {**os.environ, **self.config.build.env},
                compilecache.remote_setting(self.config, os.environ),
                distributed,
            )
        return self._build_tools

    def arches(self, arch: str | None, platform: Platform | None = None) -> ArchList:
        """--arch, else the platform's own cuda_arches, else build.cuda_arches (config.build_arches)."""
        return self.config.build_arches(given(arch), platform)

    def policy(self, arch: str | None, platform: Platform | None = None) -> GatePolicy:
        """The gate policy of a build: its arches (as `arches` resolves them) and build.gate's rules."""
        from carry.binaries import gatepolicy

        return gatepolicy.for_config(self.config, self.arches(arch, platform))

    def expected(self, checked: CheckResult | None = None) -> verify.Expected:
        """What an artifact built from here now must say; with `checked`, also the patched tree and precompiled pins."""
        from carry.wheelbuild import verify

        if checked is None:
            return verify.Expected(self.version(), self.series().hash, self.config.upstream.commit)
        settings = self.config.build.precompiled
        pins = {str(w.platform): w.pinned.sha256 for w in settings.wheels} if settings else {}
        return verify.Expected(
            self.version(),
            checked.series.hash,
            self.config.upstream.commit,
            checked.report.tree,
            checked.mirror,
            self.config.build.generated,
            pins,
        )

    def require_pins(self, platforms: tuple[Platform, ...]) -> None:
        """With build.precompiled.nightly, a build for `platforms` without its pin is bad input, not a source build."""
        settings = self.config.build.precompiled
        if settings is None or settings.nightly is None:
            return
        from carry.platforms import Platform

        missing = [str(p) for p in platforms or (Platform.native(),) if settings.wheel_for(p) is None]
        if missing:
            raise BadInput(
                f"{self.config.path}: build.precompiled.wheels has no pin for {', '.join(missing)}: run `carry pin` "
                f"(it finds them through build.precompiled.nightly) and commit build.yaml, or build from source "
                f"(wheel --from-source)"
            )

    def builder(
        self, arch: str | None, jobs: int | None, platform: Platform | None = None, from_source: bool = False
    ) -> Builder:
        """What every build of this command shares, resolved now (wheel.Builder); calling it builds a checked tree."""
        from carry.wheelbuild import wheel

        policy = self.policy(arch, platform)
        return wheel.Builder.resolve(
            self.config, self.cache, policy, jobs, self.version(), platform, from_source, self.build_tools()
        )

    def repin(self, commit: str, tree: str | None = None) -> None:
        """Run by every command that moves upstream.commit, before it writes it: the precompiled pins of `commit` found,
        written and said as `pin` does (a failure changes nothing). `tree`: the patched tree on `commit`, if at hand."""
        settings = self.config.build.precompiled
        if settings is None or settings.nightly is None:
            return
        from carry.wheelbuild import pins

        pins.repin(self.config, self.cache, commit, tree)
