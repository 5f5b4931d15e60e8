"""What each CLI command does, wired from the modules in data-flow order; returns results for the CLI to print.

Modules that only some commands need are imported inside those commands: `check` and `version` start without
the wheel, image, gate and registry modules and the libraries behind them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from carry import config
from carry.arch import ArchList, given
from carry.util.cache import Cache
from carry.util.errors import BadInput, Failed
from carry.util.record import record

if TYPE_CHECKING:
    from collections.abc import Callable

    from carry.binaries.gate import GateReport
    from carry.binaries.gatepolicy import GatePolicy
    from carry.config import TestCommand
    from carry.gputest import prove, testrun, upstreamsuite
    from carry.image.attest import Attester
    from carry.image.buildkit import crossbuild, image
    from carry.image.buildkit.image import ImageOptions
    from carry.image.locked import lockedimage, runtimelock
    from carry.platforms import Platform
    from carry.source import apply, series
    from carry.source.series import Series
    from carry.trust.keys import PublicKey
    from carry.verdicts import drop, refresh, verdicts
    from carry.wheelbuild import pins, verify, wheel
    from carry.wheelbuild.wheel import Builder


def read_version(config_path: Path) -> str:
    from carry import version

    return str(version.read(_version_file(config_path)))


def bump_version(config_path: Path) -> str:
    from carry import version

    return str(version.bump(_version_file(config_path)))


def _version_file(config_path: Path) -> Path:
    """VERSION's path: from the config when it loads, else beside it (so `version` works on a broken config)."""
    if config_path.exists():
        return config.load(config_path).version_file
    return config_path.absolute().parent / "VERSION"


@record
class FetchResult:
    base: str
    notes: tuple[str, ...]


@record
class CheckResult:
    report: apply.CheckReport
    notes: tuple[str, ...]
    series: series.Series
    mirror: Path


@record
class TestOutcome:
    __test__ = False  # not a pytest class
    report: testrun.TestReport
    path: Path


@record
class LockResult:
    """What `lock` did per platform (outcomes), or with --check, per platform None (fresh) or why it is stale."""

    outcomes: tuple[runtimelock.Outcome, ...]
    stale: tuple[tuple[Platform, str | None], ...]
    index: str


@record
class Session:
    config: config.Config
    cache: Cache

    @classmethod
    def open(cls, config_path: Path) -> Session:
        return cls(config.load(config_path), Cache.from_env())

    def series(self) -> series.Series:
        from carry.source import series

        return series.load(self.config.patches_dir)

    def fetch(self, update_pin: bool = False) -> FetchResult:
        from carry.source import upstream

        report = upstream.fetch(self.config, self.cache)
        notes = list(report.notes)
        pr_head = report.pr_head
        if pr_head is not None:
            warning = pr_head.describe(self.config.upstream.commit)
            if update_pin and pr_head.sha != self.config.upstream.commit:
                from carry import version

                notes += self.repin(pr_head.sha)
                bumped = version.following(self.config.version_file)  # another pin: another artifact
                upstream.update_pin(self.config, pr_head.sha)
                version.write(self.config.version_file, bumped)
                notes.append(
                    f"pin moved {self.config.upstream.commit[:12]} -> {pr_head.sha} in {self.config.path}; "
                    f"VERSION {bumped}"
                )
                return FetchResult(pr_head.sha, tuple(notes))
            if warning:
                notes.append(f"warning: {warning}")
        elif update_pin:
            raise BadInput(f"{self.config.path}: --update-pin needs upstream.pr and a reachable upstream")
        return FetchResult(report.base, tuple(notes))

    def check(self, against: str | None = None) -> CheckResult:
        from carry.source import apply, upstream

        patches = self.series()
        mirror, notes = upstream.ensure_base(self.config, self.cache)
        base = self.config.upstream.commit
        if against:
            base, more = upstream.resolve_ref(self.config, self.cache, against)
            notes += more
        report = apply.check(mirror, base, patches, self.cache.scratch)
        return CheckResult(report, notes, patches, mirror)

    def version(self) -> str:
        from carry import version

        return str(version.read(self.config.version_file))

    def arches(self, arch: str | None, platform: Platform | None = None) -> ArchList:
        """--arch, else the platform's own cuda_arches, else build.cuda_arches (config.build_arches)."""
        return self.config.build_arches(given(arch), platform)

    def policy(self, arch: str | None, platform: Platform | None = None) -> GatePolicy:
        """The gate policy of a build: its arches (as `arches` resolves them) and build.gate's rules."""
        from carry.binaries import gatepolicy

        return gatepolicy.for_config(self.config, self.arches(arch, platform))

    def expected(self, checked: CheckResult | None = None) -> verify.Expected:
        """What an artifact built from this repo now must say about itself; with the `checked` series, also the
        patched tree (so that a wheel's files can be compared with it) and the precompiled pins."""
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

    def wheel(
        self,
        arch: str | None,
        out: Path,
        jobs: int | None,
        platform: Platform | None = None,
        from_source: bool = False,
        one_artifact: bool = False,
    ) -> wheel.WheelResult:
        """check -> (precompiled: prove the binaries match) -> plan -> reuse or build the wheel -> publish; with
        `one_artifact` (the `wheel` command), refused when `out` holds another wheel under this VERSION."""
        if not from_source:
            self.require_pins((platform,) if platform else ())
        builder = self.wheel_builder(arch, jobs, platform, from_source)
        checked = self.check()
        self._dropped_are_in_the_pin(checked)
        if one_artifact:
            pin = builder.pin.wheel.pinned.sha256 if builder.pin else None
            self._one_artifact(checked, out, builder.platform, pin)
        return builder(checked.mirror, checked.report, checked.series, out)

    def require_pins(self, platforms: tuple[Platform, ...]) -> None:
        """With build.precompiled.nightly, a build for each of `platforms` (none: this machine's) needs the pin
        `carry pin` writes: bad input before any work, never a silent build from source."""
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

    def pin(self, check: bool) -> pins.Pinned:
        """The precompiled wheels of the merge-base of upstream.commit and main, found on build.precompiled.nightly's
        per-commit index (walking back where needed), downloaded, proven and, unless `check`, written."""
        from carry.wheelbuild import nightly, pins

        nightly.Index.of(self.config)  # no nightly block, an unset ${NAME}: bad input before any work
        checked = self.check()
        if checked.report.tree is None:
            raise Failed("the series does not apply; run `check` for details")
        return pins.pin(self.config, self.cache, checked.mirror, checked.report.tree, check)

    def repin(self, commit: str, tree: str | None = None) -> list[str]:
        """What every command that moves upstream.commit runs before it writes it: the precompiled pins of `commit`
        found and written as `pin` does (pins.repin: nothing without build.precompiled.nightly; a failure changes
        nothing). `tree` is the patched tree on `commit` where the caller has it."""
        settings = self.config.build.precompiled
        if settings is None or settings.nightly is None:
            return []
        from carry.wheelbuild import pins

        return pins.repin(self.config, self.cache, commit, tree)

    def precompiled_for(self, platform: Platform) -> bool:
        """Whether build.precompiled has a wheel for `platform` (then a build for it runs here, nothing compiled)."""
        settings = self.config.build.precompiled
        return settings is not None and settings.wheel_for(platform) is not None

    def wheel_builder(
        self, arch: str | None, jobs: int | None, platform: Platform | None = None, from_source: bool = False
    ) -> Builder:
        """What every build of this command shares, resolved now (wheel.Builder); calling it builds one checked
        tree."""
        from carry.wheelbuild import wheel

        return wheel.Builder.resolve(
            self.config, self.cache, self.policy(arch, platform), jobs, self.version(), platform, from_source
        )

    def _tests(self) -> tuple[TestCommand, ...]:
        if not self.config.build.tests:
            raise BadInput(
                f"{self.config.path}: build.tests is empty; list the commands that prove the fix, "
                f'e.g. tests: ["python -m pkg.repro"]'
            )
        return self.config.build.tests

    def test(self, artifact: str, out: Path, timeout: float) -> TestOutcome:
        """Run build.tests against a wheel or an image on this GPU (testrun.run_artifact)."""
        from carry.gputest import gpu, testrun

        commands = tuple(command for command in self._tests() if not command.tree)
        if not commands:
            raise BadInput(
                f"{self.config.path}: every build.tests entry runs against the source tree (against: "
                f"tree), none against a wheel or image; `status --test` and `prove` run those"
            )
        found = gpu.require("test", commands)
        report, path = testrun.run_artifact(artifact, self.config, commands, found, self.cache.scratch, out, timeout)
        return TestOutcome(report, path)

    def suite(self, wheel: Path, against: Path | None, rerun: bool) -> upstreamsuite.Outcome:
        """The upstream's own tests (build.upstream_tests) on `wheel` and on `against` (default: build.precompiled's
        wheel for its platform), compared per test id (carry/gputest/upstreamsuite.py)."""
        from carry.gputest import upstreamsuite

        upstreamsuite.selection_of(self.config)  # no selection: bad input before any work
        platform = self._runs_here(wheel, "WHEEL")
        source = "--against"
        if against is None:
            from carry.wheelbuild import precompiled

            pin = precompiled.pin(self.config, self.cache, platform)
            if pin is None:
                raise BadInput(
                    f"{self.config.path}: no wheel to compare {wheel.name} with: build.precompiled has none for "
                    f"{platform}; pass --against WHEEL (the release it was made from)"
                )
            against, source = pin.path, f"build.precompiled.wheels.{platform}"
        else:
            self._runs_here(against, "--against")
        checked = self.check()
        if checked.report.tree is None:
            raise Failed("the series does not apply; run `check` for details")
        inputs = upstreamsuite.Inputs(
            config=self.config,
            cache=self.cache,
            mirror=checked.mirror,
            commit=checked.report.base,
            tree=checked.report.tree,
            wheel=wheel,
            against=against,
            against_source=source,
            rerun=rerun,
        )
        return upstreamsuite.run(inputs)

    @staticmethod
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

    def verify_suite_report(self, path: Path) -> upstreamsuite.ReportCheck:
        """A suite report against the wheel beside it and this repository now (selection, patched tree, pins)."""
        from carry.gputest import upstreamsuite

        return upstreamsuite.check_report(path, upstreamsuite.expected_of(self.config, self.check().report.tree))

    def prove(self, arch: str | None, out: Path, jobs: int | None, timeout: float) -> prove.Proof:
        """base and each prefix of the series built and tested (prove.run); the GPU and the tests are checked
        before anything is resolved or built."""
        from carry.gputest import gpu, prove

        commands = self._tests()
        found = gpu.require("prove", commands)
        builder = self.wheel_builder(arch, jobs)
        suite = prove.Suite(commands=commands, gpu=found, timeout=timeout)
        return prove.run(self.config, self.cache, self.series(), builder, suite, out)

    def platform_wheel(
        self,
        platform: Platform,
        arch: str | None,
        out: Path,
        hermetic: bool,
        wheelhouse: Path | None,
    ) -> crossbuild.CrossWheel:
        """check -> context -> that platform's build stage (emulated where foreign) -> checked wheel in `out`."""
        from carry.image.buildkit import container, crossbuild

        policy = self.policy(arch, platform)
        builder = container.resolve_builder(self.config, (platform,))
        checked = self._checked()
        self._one_artifact(checked, out, platform, None)
        requirements = container.build_requirements(self._upstream_pyproject(checked))
        target = crossbuild.Target(
            tree=checked.report.patched_tree(),  # a series that does not apply fails here, before any build
            platform=platform,
            policy=policy,
            expected=self.expected(checked),
            requirements=requirements,
            hermetic=hermetic,
            wheelhouse=wheelhouse,
            upstream_version=self._upstream_version(checked),
        )
        return crossbuild.build(self.config, self.cache, checked.mirror, target, builder, out)

    def image(self, options: image.ImageOptions, arch: str | None) -> image.ImageResult:
        """check -> context (carry + config + bundle) -> a BuildKit build per platform -> tags and labels -> push
        -> shared tags as manifest lists."""
        from carry.config import CompilerCache
        from carry.image.buildkit import container, image
        from carry.wheelbuild import toolchain

        attester = self.attester(options.push)
        self.registry_answers(options.push)
        platforms = image.platforms_to_build(self.config, options)
        self.require_pins(platforms)
        arches = {platform: self.arches(arch, platform) for platform in platforms}
        builder = container.resolve_builder(self.config, platforms)
        image.check_options(self.config, builder, options)
        current = self.version()
        checked = self._checked()
        pyproject = self._upstream_pyproject(checked)
        tools = toolchain.probe(dict(os.environ), CompilerCache.NONE, self.cache.root)
        subject = image.Subject(
            report=checked.report,
            series=checked.series,
            version=current,
            dist_name=container.distribution_name(self.config, pyproject),
            cuda=image.cuda_tag(tools.nvcc_version),
            created=image.created_at(checked.mirror, checked.report.base, os.environ),
            upstream_version=self._upstream_version(checked),
        )
        plan = image.plan(self.config, subject, arches, options)
        inputs = image.Sources(mirror=checked.mirror, requirements=container.build_requirements(pyproject))
        # One image build of a tree at a time per cache (its log, its context): a second run waits, and says so.
        with self.cache.held(f"image-{plan.tree[:12]}", "image"):
            return image.build(self.config, self.cache, inputs, plan, options, builder, attester)

    def locked_image(
        self, options: ImageOptions, arch: str | None, smoke: str, discard_wheels: bool = False
    ) -> lockedimage.LockedImageResult:
        """image.lock set: locks read and checked (before any work) -> with --push, each platform's previous image
        in the registry and its record -> check -> each platform's fixed wheel here (native or precompiled) -> carry
        writes the layers (lockedimage), reusing what the registry has -> push or load -> smoke test -> record.
        `smoke`: auto, full or off."""
        from carry.config import CompilerCache
        from carry.image import registry
        from carry.image.buildkit import image
        from carry.image.locked import lockedimage
        from carry.wheelbuild import toolchain

        if (
            options.hermetic
            or options.wheelhouse
            or any(spec.exporting or spec.mode or spec.is_spec for spec in options.cache)
        ):
            raise BadInput(
                f"{self.config.path}: image.lock is set: carry writes the layers itself (no BuildKit "
                f"build), so --hermetic, --wheelhouse, --cache-to and --cache-from inline/registry/type=… do not "
                f"apply; --cache-from IMAGE names an image whose record the push reuses"
            )
        if (options.cache or discard_wheels) and not options.push:
            raise BadInput(
                f"{self.config.path}: --cache-from IMAGE and --discard-wheels are for a push (the registry keeps the "
                f"layers): add --push"
            )
        attester = self.attester(options.push)
        self.registry_answers(options.push)
        platforms = image.platforms_to_build(self.config, options)
        self.require_pins(platforms)
        client = registry.client()
        previous = self.previous_images(platforms, options, attester) if options.push else {}
        prepared = lockedimage.prepare(
            self.config,
            self.cache,
            platforms,
            client,
            {p: found.record.base for p, found in previous.items() if found.record is not None and found.record.base},
        )
        checked = self._checked()
        arches = {platform: self.arches(arch, platform) for platform in platforms}
        tools = toolchain.probe(dict(os.environ), CompilerCache.NONE, self.cache.root)
        cuda = image.cuda_tag(tools.nvcc_version) if any("{cuda}" in t for t in self.config.image.tags) else "none"
        subject = image.Subject(
            report=checked.report,
            series=checked.series,
            version=self.version(),
            dist_name=self.config.build.distribution,
            cuda=cuda,
            created=image.created_at(checked.mirror, checked.report.base, os.environ),
        )
        plan = image.plan(self.config, subject, arches, options)
        offers = {}
        if options.push:
            from carry.image.locked import imagewheel, layerplan

            for platform in platforms:
                venv = layerplan.venv_of(prepared.locks[platform])
                offers[platform] = imagewheel.offer(previous.get(platform), venv, self.cache.scratch)
        wheels = self.image_wheels(platforms, arch, offers)
        if not plan.named:  # the distribution name from the wheel itself (its file name)
            plan = plan.with_distribution(next(iter(wheels.values())).name.split("-", 1)[0])
        delivery = lockedimage.Delivery(
            push=options.push,
            smoke=smoke != "off",
            attester=attester,
            smoke_mode=smoke,
            previous=previous,
            discard_wheels=discard_wheels,
        )
        with self.cache.held(f"image-{plan.tree[:12]}", "image"):
            return lockedimage.build(self.config, self.cache, prepared, plan, wheels, delivery, client)

    def previous_images(
        self, platforms: tuple[Platform, ...], options: ImageOptions, attester: Attester | None
    ) -> dict:
        """Each platform's previous image in the registry and its record (registrycache.find): at --cache-from's refs
        ({arch}, {version} filled), else this VERSION's own tags (a rerun) and image.tags (`latest`: the VERSION
        this one replaces). The record is trusted only signed when $CARRY_SIGNING_KEY is set."""
        from carry.config import CompilerCache
        from carry.image import registry, registryhttp
        from carry.image.buildkit import image
        from carry.image.locked import registrycache
        from carry.util import reporter
        from carry.wheelbuild import toolchain

        name, version = self.config.image.name, self.version()
        several = len({t.platform for t in self.config.image.platforms} | set(platforms)) > 1
        key = attester.key.public if attester is not None and attester.key is not None else None
        found = {}
        with registry.credentials(name, self.config.image.docker) as login:
            repo = registryhttp.Repository.of(name, login.auth)
            for platform in platforms:
                if options.cache:
                    refs = tuple(spec.text.format(arch=platform.tag, version=version) for spec in options.cache)
                else:
                    cuda = "none"
                    if any("{cuda}" in t for t in self.config.image.tags):
                        tools = toolchain.probe(dict(os.environ), CompilerCache.NONE, self.cache.root)
                        cuda = image.cuda_tag(tools.nvcc_version)
                    tags = image.render_tags(self.config, version, self.series(), cuda) + options.extra_tags
                    own = (image.own_tag(version, platform),) if several else ()
                    refs = (*own, *tags)
                refs = registrycache.candidates(refs, name)
                found[platform] = registrycache.find(repo, name, platform, refs, key)
                reporter.phase("cache", found[platform].line())
        return found

    def attester(self, push: bool, dist: Path = Path("dist")) -> Attester | None:
        """With --push, what signs and attests the pushed images (carry.image.attest), the key of
        $CARRY_SIGNING_KEY loaded now: a bad key or passphrase is bad input before any work."""
        if not push:
            return None
        from carry import __version__
        from carry.image.attest import Attester
        from carry.image.inspect import hermetic
        from carry.trust import keys

        key = keys.from_environment(os.environ)  # nothing printed yet: a later bad input stays one line
        return Attester(
            key,
            self.config,
            self.series(),
            self.version(),
            __version__,
            dist,
            read_installed=hermetic.distributions,
        )

    def registry_answers(self, push: bool) -> None:
        """With --push, image.name's registry asked once before any work: one that cannot be reached or refuses the
        login is bad input naming $CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD (carry.image.registry.probe)."""
        if push:
            from carry.image import registry

            registry.probe(self.config.image.name)

    def image_wheels(self, platforms: tuple[Platform, ...], arch: str | None, offers: dict | None = None) -> dict:
        """The fixed wheel of each platform of a locked image, in dist/: made here for this machine's CPU and for
        each platform with a precompiled wheel; for another, this machine's own when it is pure Python (as `lock`
        takes it: a `py3-none-any` wheel installs anywhere), never a wheel of this CPU's code. `offers`: per
        platform, a base a derivation may start from when this machine has none (wheel.Builder.offer)."""
        from carry.platforms import Platform
        from carry.util import reporter

        native = Platform.native()
        here = [p for p in platforms if p is native or self.precompiled_for(p)]
        if any(p not in here for p in platforms) and native not in here:
            here.append(native)
        built = {}
        for platform in here:
            self.require_pins((platform,))
            builder = self.wheel_builder(arch, None, platform)
            builder.offer = (offers or {}).get(platform)
            checked = self.check()
            self._dropped_are_in_the_pin(checked)
            made = builder(checked.mirror, checked.report, checked.series, Path("dist"))
            built[platform] = made.path
            reporter.phase("wheel", f"{platform}: {made.path.name}{' (reused)' if made.reused else ''}")
        for platform in platforms:
            if platform not in built:
                if not built[native].name.endswith("-none-any.whl"):
                    raise Failed(
                        f"{built[native].name} holds {native.machine} code: a locked image for {platform} needs "
                        f"build.precompiled.wheels.{platform}"
                    )
                built[platform] = built[native]
                reporter.phase("wheel", f"{platform}: {built[native].name} (pure Python, made on {native})")
        return {platform: built[platform] for platform in platforms}

    def manifest(self, platforms: tuple[Platform, ...], extra_tags: tuple[str, ...]) -> dict[str, str]:
        """Every shared tag -> a manifest list of the platforms' `<VERSION>-<arch>` images already pushed."""
        from carry.config import CompilerCache
        from carry.image.buildkit import container, image
        from carry.wheelbuild import toolchain

        options = image.ImageOptions(True, extra_tags, platforms, False, None)
        chosen = image.platforms_to_build(self.config, options)
        if len(chosen) < 2:
            raise BadInput(
                f"{self.config.path}: a manifest list joins several platforms; list them in "
                f"image.platforms or pass --platform twice or more"
            )
        tools = toolchain.probe(dict(os.environ), CompilerCache.NONE, self.cache.root)
        shared = image.render_tags(self.config, self.version(), self.series(), image.cuda_tag(tools.nvcc_version))
        refs = tuple(dict.fromkeys(f"{self.config.image.name}:{tag}" for tag in shared + extra_tags))
        attester = self.attester(True)
        self.registry_answers(True)  # after every check of the input: bad input never waits on the network
        builder = container.resolve_builder(self.config, ())
        return image.join_pushed(self.config, self.version(), refs, chosen, builder, attester)

    def lock(self, platforms: tuple[Platform, ...], check: bool, upgrade: bool) -> LockResult:
        """The runtime lock of each platform (image.platforms, or those given): the base image's facts first (bad
        input before any work), then the fixed wheel as `wheel` makes it, then uv; with `check`, only whether each
        lock is fresh."""
        from carry.image.locked import runtimelock
        from carry.util import reporter
        from carry.util.fsutil import temp_dir

        chosen = runtimelock.platforms_to_lock(self.config, platforms)
        self.require_pins(chosen)
        facts = runtimelock.bases(self.config, chosen, self.cache)
        with temp_dir(self.cache.scratch, "lock-wheels-") as out:
            wheels = self.lock_wheels(chosen, out)
            if check:
                return LockResult((), runtimelock.check(self.config, facts, wheels), "")
            index = runtimelock.choose_index(os.environ, self.config.root)
            reporter.phase("index", index.source)
            outcomes = runtimelock.lock(self.config, self.cache, facts, wheels, index, upgrade)
        return LockResult(outcomes, (), index.source)

    def lock_wheels(self, platforms: tuple[Platform, ...], out: Path) -> dict[Platform, Path]:
        """The fixed wheel of each platform, made as `wheel` makes it (cached by content): here where it can be
        (this machine's CPU, or build.precompiled's wheel for the platform), else this machine's own wheel when it
        is pure Python (`py3-none-any` installs anywhere), else in that platform's build stage."""
        from carry.platforms import Platform

        native = Platform.native()
        here = [p for p in platforms if p is native or self.precompiled_for(p)]
        if any(p not in here for p in platforms) and native not in here and not self.config.arches_for(native):
            here.append(native)  # no CUDA code expected: probably pure, which serves every platform
        wheels: dict[Platform, Path] = {}
        if here:
            checked = self.check()
            for platform in here:
                built = self.wheel_builder(None, None, platform)(checked.mirror, checked.report, checked.series, out)
                wheels[platform] = built.path
        pure = next((w for w in wheels.values() if w.name.endswith("-none-any.whl")), None)
        for platform in platforms:
            if platform not in wheels:
                wheels[platform] = pure or self.platform_wheel(platform, None, out, False, None).path
        return {platform: wheels[platform] for platform in platforms}

    def _checked(self) -> CheckResult:
        from carry.util import reporter

        checked = self.check()
        reporter.phase(
            "check",
            f"{len(checked.series.patches)} patch(es) on {checked.report.base[:12]}: "
            f"tree {checked.report.patched_tree()[:12]}",
        )
        self._dropped_are_in_the_pin(checked)
        return checked

    def _one_artifact(self, checked: CheckResult, out: Path, platform: Platform, precompiled: str | None) -> None:
        """Bad input when `out` holds another artifact under this VERSION (wheel.refuse_another_artifact)."""
        from carry.config import public_url
        from carry.wheelbuild import wheel

        wheel.refuse_another_artifact(
            out,
            self.version(),
            public_url(self.config.upstream.url),
            checked.report.base,
            checked.report.patched_tree(),
            platform,
            precompiled,
        )

    def _dropped_are_in_the_pin(self, checked: CheckResult) -> None:
        """Bad input when patches/DROPPED.md says upstream merged a dropped patch at a commit the pin lacks."""
        from carry.util import reporter
        from carry.verdicts import droplog

        for note in droplog.check_pin(self.config, self.cache, checked.mirror, self.config.patches_dir):
            reporter.phase("dropped", note)

    def _upstream_version(self, checked: CheckResult) -> str | None:
        """The upstream's own version for a build stage to put in front of +carry.VERSION (None: build.wheel_version
        says the version), found here, where upstream's tags are (carry/source/upstreamversion.py)."""
        from carry.util import reporter

        if self.config.build.wheel_version is not None:
            return None
        from carry.source import upstreamversion

        found = upstreamversion.resolve(self.config, self.cache, checked.mirror, checked.report.patched_tree())
        reporter.phase(
            "version", f"upstream {found.version} ({found.source}): the wheel is {found.version}+carry.{self.version()}"
        )
        return found.version

    def _upstream_pyproject(self, checked: CheckResult) -> dict:
        from carry.image.buildkit import container
        from carry.source import git

        tree = checked.report.patched_tree()
        return container.upstream_pyproject(git.show_blob(checked.mirror, f"{tree}:pyproject.toml"))

    def verify(
        self,
        artifact: str,
        platform: Platform | None,
        arch: str | None,
        key: PublicKey | None = None,
        local: bool = False,
    ) -> tuple[verify.Verification, ...]:
        """A wheel file (and the test report beside it), or every platform (or the one asked) of an image
        reference; with `key` (a loaded public key) the image's signature, SBOM and provenance too."""
        from carry.gputest import testrun
        from carry.wheelbuild import verify

        if not testrun.names_a_wheel(artifact):
            from carry.image.inspect import imageverify

            patches = tuple((p.name, p.sha256) for p in self.series().patches) if key is not None else ()
            expected = self.expected()
            request = imageverify.Request(
                ref=artifact, platform=platform, arches=given(arch), local=local, key=key, patches=patches
            )
            return imageverify.verify_image(request, self.config, expected, self.cache.scratch)
        if local:
            raise BadInput("--local is for image references; a wheel is always the file given")
        if platform is not None:
            raise BadInput("--platform is for image tags; a wheel's platform is in its file name")
        path = Path(artifact)
        if not path.is_file():
            from carry.util import prog

            raise BadInput(
                f"{artifact}: no such wheel file; give the path `{prog.command('wheel')}` printed "
                f"(dist/NAME-VERSION-TAGS.whl)"
            )
        from carry.gputest import upstreamsuite

        checked = self.check()
        result = testrun.with_test_report(path, verify.verify_wheel(path, self.expected(checked), given(arch)))
        suite = upstreamsuite.expected_of(self.config, checked.report.tree)
        return (upstreamsuite.with_suite_report(path, result, suite),)

    def status(self, against: tuple[str, ...] = (), test: bool = False) -> verdicts.StatusReport:
        """A verdict per patch against each ref (default: upstream.main, and the PR head when pr is set); with
        `test`, each patch's test is run on the ref without it too (carry/gputest/behaviour.py)."""
        from carry.verdicts import verdicts

        patches = self.series()
        report = verdicts.status(self.config, self.cache, patches, against, trees=test)
        if not test:
            return report
        from carry.gputest import behaviour

        return behaviour.judge(self.config, self.cache, self._builder_for, report, patches)

    def drop(
        self, name: str, against: str | None, force: bool, test: bool = False, onto: str | None = None
    ) -> drop.Dropped:
        from carry.verdicts import drop

        request = drop.Request(name=name, against=against, force=force, onto=onto)
        return drop.drop(self.config, self.cache, self.series(), request, judge=self._judge(test), repin=self.repin)

    def refresh(self, onto: str | None, test: bool = False) -> refresh.Refreshed:
        from carry.verdicts import refresh

        return refresh.refresh(self.config, self.cache, self.series(), onto, self._judge(test), self.repin)

    def _judge(self, test: bool) -> Callable[[verdicts.StatusReport, Series], verdicts.StatusReport] | None:
        """With `test`, what drop and refresh call to judge a status report by the patches' tests too."""
        if not test:
            return None
        from carry.gputest import behaviour

        return lambda report, patches: behaviour.judge(self.config, self.cache, self._builder_for, report, patches)

    def _builder_for(self, from_source: bool) -> Builder:
        """The configured build of a tree, from source when asked: what `status --test` builds REF with."""
        return self.wheel_builder(None, None, from_source=from_source)


def gate(
    config_path: Path, targets: tuple[str, ...], arch: str | None, platform: Platform | None, strict: bool = False
) -> GateReport:
    """Gate a wheel, an unpacked tree or `.so` files, upstream's own releases included: by build.yaml's policy
    when there is a config (its arches, or --arch), by the strict rule when not; the CPU of every `.so` against
    --platform, else the wheel's tag."""
    from carry.binaries import gate as gating
    from carry.binaries import sharedobjects as binaries
    from carry.platforms import Platform

    loaded = config.load(config_path) if config_path.exists() else None
    objects, tag = binaries.read(targets)
    found_platform = platform or (Platform.from_wheel_tag(tag) if tag else None)
    arches = given(arch)
    if arches is None and loaded is not None:
        arches = loaded.arches_for(found_platform)
    if arches is None:
        where = f"{config_path} has no build.cuda_arches" if loaded else f"no config at {config_path}"
        raise BadInput(f"{where}: pass --arch LIST (e.g. --arch 12.1,10.0,9.0) to say which GPUs to gate for")
    from carry.binaries import gatepolicy

    policy = (
        gatepolicy.for_config(loaded, arches) if loaded is not None and not strict else gatepolicy.GatePolicy(arches)
    )
    return gating.check(objects, policy, found_platform)


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
