"""A wheel of the patched tree: planned once, produced (the upstream's own PEP 517 build in a clean build dir, or in
precompiled mode after a Python-only change derived from the family's last such build: derive.py), then finished the
same way whoever produced it (gate, tree check, version, stamp, store) and published into `out`. A rerun with the
same plan key reuses the stored wheel and runs nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

import carry
from carry.binaries import buildinfo
from carry.binaries.gatepolicy import GatePolicy
from carry.config import Config
from carry.config.build import Distributed, RemoteCache
from carry.config.reader import public_url
from carry.platforms import Platform
from carry.source import git
from carry.source.apply import CheckReport
from carry.source.series import Series
from carry.util import reporter
from carry.util.cache import Cache
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import no_space_line, says_no_space, temp_dir, tree_size
from carry.util.logtail import tail
from carry.wheelbuild import artifacts, buildenv, compilecache, derive, pep517, producer, toolchain, verify
from carry.wheelbuild.artifacts import gate_report_path, publish

if TYPE_CHECKING:
    from carry.arch import ArchList
    from carry.wheelbuild import precompiled

ARCH_VARIABLES = ("TORCH_CUDA_ARCH_LIST", "CMAKE_CUDA_ARCHITECTURES")
# Bumped when what a build produces from the same inputs changes (2: the build dir is a git worktree, so
# setuptools-scm's file finder sees the upstream's tracked package data).
PRODUCER_FORMAT = 2


@dataclasses.dataclass(frozen=True)
class EnvPlan:
    """The environment a build without isolation runs the backend in: made by carry from `spec` (uv), or the one
    `$CARRY_BUILD_PYTHON` names (the image's build stage), already checked against `spec`."""

    spec: buildenv.EnvSpec
    provided: buildenv.BuildEnv | None = None

    @property
    def key(self) -> str:
        return self.provided.key if self.provided else self.spec.key

    def ensure(self, cache: Cache) -> buildenv.BuildEnv:
        return self.provided or buildenv.ensure(self.spec, cache.root)


def env_plan(config: Config, mirror: Path, tree: str) -> EnvPlan | None:
    """The build environment of `tree` ([build-system] requires plus build.environment); None with isolation."""
    if config.build.build_isolation:
        return None
    spec = buildenv.EnvSpec.resolve(buildenv.requires_of_tree(mirror, tree), config.build.environment)
    given = os.environ.get(buildenv.PROVIDED_ENV)
    return EnvPlan(spec, buildenv.provided(given, spec) if given else None)


@dataclasses.dataclass(frozen=True)
class WheelPlan:
    """Everything a wheel build depends on, resolved once; `key` addresses the artifact cache."""

    base: str
    tree: str
    version: str
    wheel_version: str
    policy: GatePolicy
    env: dict[str, str]
    unset: tuple[str, ...]  # inherited variables the build must not see
    jobs: toolchain.JobPlan
    tools: toolchain.Toolchain
    key: str
    remote: RemoteCache | None = None  # the shared compile cache; it changes no output, so it is not in `key`
    distributed: Distributed | None = None  # the build cluster; like `remote`, not in `key`
    platform: Platform = dataclasses.field(default_factory=Platform.native)  # whose CPU the shared objects are
    environment: EnvPlan | None = None  # None: an isolated build
    precompiled: precompiled.Plan | None = None  # the upstream wheel the compiled code comes from; None: compiled
    family: str = ""  # `key` without the tree and the series: plans whose wheels differ only in files of the tree
    lineage: str = ""  # `family` without the wheel's version: the same plan for another VERSION
    offered: derive.Offer | None = dataclasses.field(default=None, compare=False)  # a base the caller can make

    @property
    def arches(self) -> ArchList:
        return self.policy.arches


@dataclasses.dataclass(frozen=True)
class WheelResult:
    path: Path
    reused: bool
    plan: WheelPlan
    cache: compilecache.CacheOutcome | None = None  # what the compiler cache did; None when nothing was built
    checks: verify.Inspection | None = None  # the gate and tree check of a fresh build

    def to_json(self) -> dict:
        return {
            "wheel": str(self.path),
            "reused": self.reused,
            "version": self.plan.version,
            "wheel_version": self.plan.wheel_version,
            "tree": self.plan.tree,
            "cuda_arches": str(self.plan.arches),
            "cache_key": self.plan.key,
            "compiler_cache": self.cache.to_json() if self.cache else None,
            "gate": self.checks.gate.to_json() if self.checks else None,
            "tree_check": self.checks.tree.to_json() if self.checks and self.checks.tree else None,
            "gate_report": str(gate_report_path(self.path)),
            "precompiled": self.plan.precompiled.to_json() if self.plan.precompiled else None,
            "build_environment": self.plan.environment.key if self.plan.environment else None,
        }


def plan(
    builder: Builder,
    report: CheckReport,
    tools: toolchain.Toolchain,
    environment: EnvPlan | None = None,
    taken: precompiled.Plan | None = None,
    template: str | None = None,
) -> WheelPlan:
    """The plan of one build of `report`'s tree by `builder` with the probed `tools`; `template`: the wheel version with
    {version} for VERSION (build.wheel_version, else the upstream's own: carry/source/upstreamversion.py)."""
    config, version, policy, job_plan = builder.config, builder.version, builder.policy, builder.job_plan
    remote = builder.tools.remote
    tree = report.patched_tree()
    wheel_version = (template or config.build.wheel_version or "0+carry.{version}").format(version=version)
    arches = policy.arches
    key_material = {
        "carry": carry.__version__,
        "producer": PRODUCER_FORMAT,
        "tree": tree,
        "series": report.series_hash,  # the buildinfo names the patches: a reworded one is another artifact
        "arches": str(arches),
        "gate": policy.digest(),  # the checks the stored wheel passed
        "generated": [[g.glob, g.why] for g in config.build.generated],
        "build_env": config.build.env,
        "wheel_version": wheel_version,
        "version_env": list(config.build.version_env),
        "isolation": config.build.build_isolation,
        "toolchain": tools.to_json(),
        "build_environment": environment.key if environment else None,
        "precompiled": taken.key() if taken else None,
    }
    key = hashlib.sha256(json.dumps(key_material, sort_keys=True).encode()).hexdigest()
    kin = {name: value for name, value in key_material.items() if name not in ("tree", "series")}
    family = hashlib.sha256(json.dumps(kin, sort_keys=True).encode()).hexdigest()
    kin.pop("wheel_version")
    lineage = hashlib.sha256(json.dumps(kin, sort_keys=True).encode()).hexdigest()
    if taken is not None:  # nothing compiles: no launcher, and the upstream's mechanism gets the wheel
        tools, remote = dataclasses.replace(tools, launcher=None), None
    env = _build_env(config, arches, wheel_version, job_plan.max_jobs, tools)
    if taken is not None:
        env.update(taken.env)
    unset = () if arches.expects_cuda else ARCH_VARIABLES
    return WheelPlan(
        report.base,
        tree,
        version,
        wheel_version,
        policy,
        env,
        unset,
        job_plan,
        tools,
        key,
        remote,
        None if taken is not None else builder.tools.distributed,
        platform=taken.platform if taken else Platform.native(),
        environment=environment,
        precompiled=taken,
        family=family,
        lineage=lineage,
    )


def _build_env(config: Config, arches: ArchList, wheel_version: str, jobs: int, tools: toolchain.Toolchain) -> dict:
    """The variables carry sets for the upstream build (on top of the caller's environment). Without CUDA arches
    the arch variables are left out (and `unset` drops inherited ones): PyTorch and CMake both reject an empty list,
    and a Python-only build (vLLM's VLLM_TARGET_DEVICE=empty) reads neither."""
    env = dict(config.build.env)
    if arches.expects_cuda:  # TORCH_CUDA_ARCH_LIST, CMAKE_CUDA_ARCHITECTURES
        env.update(zip(ARCH_VARIABLES, (arches.torch_cuda_arch_list(), arches.cmake_cuda_architectures())))
    env["MAX_JOBS"] = str(jobs)
    env.update(dict.fromkeys(config.build.version_env, wheel_version))
    if tools.launcher:
        env.update({f"CMAKE_{language}_COMPILER_LAUNCHER": tools.launcher.path for language in ("CUDA", "C", "CXX")})
    return env


def build(
    config: Config, cache: Cache, mirror: Path, report: CheckReport, series: Series, the_plan: WheelPlan, out: Path
) -> WheelResult:
    """Reuse the stored wheel for this plan's key (checked by its sha256 as it is published), or produce and finish
    one; publish it into `out`. A stored wheel that is not what was recorded is removed, said, and built again."""
    with cache.held(f"wheel-{the_plan.key}", "cache"):
        if (hit := _published_hit(cache, the_plan.key, out)) is not None:
            return WheelResult(hit, True, the_plan)
        derivation = _derivation(config, cache, mirror, the_plan)
        derivable = derivation is not None and derivation.possible and derivation.base is not None
        taking = the_plan.precompiled is not None
        facts = producer.Facts(
            platform=the_plan.platform, native=Platform.native(), precompiled=taking, derivable=derivable
        )
        kind = producer.choose(facts)
        job = Job(config, cache, mirror, the_plan, derivation)
        with PRODUCERS[kind](job) as produced:
            stored, checks = finish(config, cache, mirror, report, series, the_plan, produced)
            outcome = produced.cache
        published = publish(stored, out, sealed=True)
    return WheelResult(published, False, the_plan, outcome, checks)


def _published_hit(cache: Cache, key: str, out: Path) -> Path | None:
    """The stored wheel of `key` published into `out`, checked by its recorded sha256 as it is copied; None when
    there is none, or when it was corrupt (then removed, and said in one line)."""
    stored = artifacts.cached(cache, key)
    if stored is None:
        return None
    try:
        published = publish(stored, out, sealed=True)
    except artifacts.CorruptEntry as exc:
        artifacts.discard(cache, key)
        reporter.phase("cache", exc.corrupt.line("removed; building it again"))
        return None
    reporter.phase("cache", f"hit {key[:12]}: reusing {stored.name} (sha256 as recorded)")
    return published


class Builder:
    """What every build of one command shares, resolved once before any work: the gate policy, the compile jobs,
    VERSION, the tools (`toolchain.BuildTools`, probed at the first build) and, unless building from source, the
    checked precompiled wheel (a wrong pin is bad input before anything is written). Calling it builds one tree."""

    def __init__(
        self,
        config: Config,
        cache: Cache,
        policy: GatePolicy,
        job_plan: toolchain.JobPlan,
        version: str,
        platform: Platform,
        pin: precompiled.Pin | None,
        tools: toolchain.BuildTools,
    ):
        self.config, self.cache, self.policy, self.job_plan = config, cache, policy, job_plan
        self.version, self.platform, self.pin, self.tools = version, platform, pin, tools
        self._template: str | None = config.build.wheel_version
        # a base to derive from when this machine has none: given the plan, the mirror and the series (a fresh
        # runner's: VERSION N's fixed wheel rebuilt from its image, carry.image.locked.imagewheel)
        self.offer: Callable[[WheelPlan, Path, Series], tuple[derive.Base | None, str]] | None = None

    @classmethod
    def resolve(
        cls,
        config: Config,
        cache: Cache,
        policy: GatePolicy,
        jobs: int | None,
        version: str,
        platform: Platform | None,
        from_source: bool,
        tools: toolchain.BuildTools,
    ) -> Builder:
        target = platform or Platform.native()
        pin = None
        wanted = not from_source and config.build.precompiled is not None
        kind = producer.choose(producer.Facts(platform=target, native=Platform.native(), precompiled=wanted))
        if producer.takes_precompiled(kind):
            from carry.wheelbuild import precompiled

            pin = precompiled.pin(config, cache, target)
        return cls(config, cache, policy, toolchain.choose_jobs(jobs, config.build.env), version, target, pin, tools)

    def __call__(self, mirror: Path, report: CheckReport, patches: Series, out: Path) -> WheelResult:
        tree = report.patched_tree()
        tools = self.tools()
        reporter.phase("check", f"{len(patches.patches)} patch(es) on {report.base[:12]}: tree {tree[:12]}")
        taken = None
        facts = producer.Facts(platform=self.platform, native=Platform.native(), precompiled=self.pin is not None)
        if self.pin is not None and producer.takes_precompiled(producer.choose(facts)):
            from carry.wheelbuild import precompiled

            taken = precompiled.prove(self.config, self.cache, mirror, self.pin, tree, patches)
            reporter.phase("precompiled", taken.line())
        environment = env_plan(self.config, mirror, tree)
        the_plan = plan(self, report, tools, environment, taken, self._wheel_version(mirror, tree))
        if self.offer is not None:
            offer, made = self.offer, the_plan
            the_plan = dataclasses.replace(the_plan, offered=lambda: offer(made, mirror, patches))
        return build(self.config, self.cache, mirror, report, patches, the_plan, out)

    def _wheel_version(self, mirror: Path, tree: str) -> str:
        """build.wheel_version, else the upstream's own version with carry's label, found once and said."""
        if self._template is None:
            from carry.source import upstreamversion

            found = upstreamversion.resolve(self.config, self.cache, mirror, tree)
            self._template = found.template()
            wheel_version = self._template.format(version=self.version)
            reporter.phase("version", f"upstream {found.version} ({found.source}): the wheel is {wheel_version}")
        return self._template


# --- producing --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Job:
    """One wheel to produce, as every producer is handed it (`derivation` None: not in precompiled mode)."""

    config: Config
    cache: Cache
    mirror: Path
    plan: WheelPlan
    derivation: derive.Derivation | None = None


@contextlib.contextmanager
def _upstream_build(job: Job) -> Iterator[producer.Produced]:
    """The upstream's PEP 517 build (compiling, or with the precompiled code), the build dir held; once finished, the
    tree remembered as its family's last build, for a derivation to start from."""
    with job.cache.lock(f"build-{job.mirror.name}"), produce(job.config, job.cache, job.mirror, job.plan) as made:
        yield made
    if job.derivation is not None:
        the_plan = job.plan
        commit = git.tree_commit(job.mirror, the_plan.tree, the_plan.base)
        derive.remember(job.cache, the_plan.family, the_plan.tree, the_plan.key, commit, the_plan.lineage)


@contextlib.contextmanager
def _derivation_of(job: Job) -> Iterator[producer.Produced]:
    """The family's last PEP 517 build with the changed members replaced; a base from the cache is held while it
    is read, one made for this build (temporary) is its own and removed after."""
    derivation = job.derivation
    assert derivation is not None and derivation.base is not None  # choose said DERIVED: derivable
    base = derivation.base
    held = f"wheel-{base.key}" if not base.temporary and base.key != job.plan.key else None
    try:
        with (
            job.cache.lock(held) if held else contextlib.nullcontext(),
            derived(job.cache, job.plan, derivation) as made,
        ):
            yield made
    finally:
        if base.temporary:
            base.wheel.unlink(missing_ok=True)


# The producers wheelbuild runs itself, by the kind producer.choose names (the build stage is image/buildkit's
# crossbuild, and a pure-Python wheel for another platform is this machine's own: carry/app/ runs those).
PRODUCERS: dict[producer.Kind, producer.Producer[Job]] = {
    producer.Kind.SOURCE: _upstream_build,
    producer.Kind.PRECOMPILED: _upstream_build,
    producer.Kind.DERIVED: _derivation_of,
}


@contextlib.contextmanager
def produce(config: Config, cache: Cache, mirror: Path, the_plan: WheelPlan) -> Iterator[producer.Produced]:
    """The upstream's PEP 517 build of the plan's tree in the stable build dir, cleaned of every earlier
    build's output first (objects under build.keep survive, for incremental builds)."""
    build_dir = cache.builds / mirror.name.removesuffix(".git")
    src = build_dir / "src"
    removed = git.checkout_tree(mirror, the_plan.tree, the_plan.base, src, config.build.keep)
    kept = f", kept {', '.join(config.build.keep)}" if config.build.keep else ""
    reporter.phase(
        "materialize", f"tree {the_plan.tree[:12]} -> {src} (removed {len(removed)} earlier build output(s){kept})"
    )
    log = cache.logs / f"wheel-{the_plan.key[:16]}.log"
    environment = the_plan.environment.ensure(cache) if the_plan.environment else None
    if environment is not None:
        reporter.phase("env", environment.describe())
    with temp_dir(cache.scratch, "wheel-") as scratch:
        with reporter.recording() as said:  # what the build log begins with
            with compilecache.run(
                the_plan.tools.launcher, the_plan.remote, cache.root, src, scratch, os.environ, the_plan.distributed
            ) as launcher:
                reporter.phase("build", _build_line(the_plan, log))
                built = _run_build(config, src, scratch / "out", the_plan, log, launcher, said, environment)
                outcome = launcher.outcome() if launcher else None
            if outcome is not None:
                reporter.phase("cache", outcome.line())
                if outcome.dist is not None:
                    reporter.phase("dist", outcome.dist.line())
                append_log(log, said[-2:] if outcome.dist is not None else said[-1:])
        yield producer.Produced(built, log, scratch, outcome)


def _derivation(config: Config, cache: Cache, mirror: Path, the_plan: WheelPlan) -> derive.Derivation | None:
    """In precompiled mode: whether this wheel derives from the family's last PEP 517 build (said either way)."""
    if the_plan.precompiled is None:
        return None
    generated = tuple(g.glob for g in config.build.generated)
    target = (the_plan.lineage, the_plan.version)
    derivation = derive.plan(cache, mirror, the_plan.family, the_plan.tree, generated, target, the_plan.offered)
    reporter.phase("derive", derivation.line())
    return derivation


@contextlib.contextmanager
def derived(cache: Cache, the_plan: WheelPlan, derivation: derive.Derivation) -> Iterator[producer.Produced]:
    """The derived wheel in scratch space, with a log naming its base and every member replaced."""
    log = cache.logs / f"wheel-{the_plan.key[:16]}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"derive: {derivation.line()}", *(f"  replaced {name}" for name in sorted(derivation.replaced))]
    with temp_dir(cache.scratch, "wheel-") as scratch:
        (scratch / "out").mkdir()
        wheel = derive.write(derivation, scratch / "out")
        log.write_text("".join(f"carry: {line}\n" for line in lines))
        yield producer.Produced(wheel, log, scratch)


def _build_line(the_plan: WheelPlan, log: Path) -> str:
    """What the build is about to do: compile (arches, jobs, launcher), or take the compiled code from a wheel."""
    if the_plan.precompiled is not None:
        return (
            f"PEP 517 build_wheel for {the_plan.platform}, compiled code from {the_plan.precompiled.path.name} "
            f"(nothing compiles); log {log}"
        )
    if not the_plan.arches.expects_cuda:
        return f"PEP 517 build_wheel, Python only (arches none); log {log}"
    return (
        f"PEP 517 build_wheel, arches {the_plan.arches}, {the_plan.jobs.jobs} job(s) ({the_plan.jobs.reason}), "
        f"compiler cache {the_plan.tools.describe_launcher()}; log {log}"
    )


def append_log(log: Path, lines: list[str]) -> None:
    with open(log, "a") as handle:
        handle.writelines(f"carry: {line}\n" for line in lines)


def _run_build(
    config: Config,
    src: Path,
    out: Path,
    the_plan: WheelPlan,
    log: Path,
    launcher: compilecache.CacheRun | None,
    said: list[str],
    environment: buildenv.BuildEnv | None,
) -> Path:
    """Run the upstream build with the plan's variables and the launcher's settings; the caller's own secrets
    (carry's passwords) and the variables the plan unsets stay out of its environment."""
    launcher_env = launcher.env if launcher else {}
    environ = compilecache.secret_free_env(os.environ)
    if launcher and (launcher.remote or launcher.remote_note or launcher.distributed):
        environ = {k: v for k, v in environ.items() if k not in compilecache.LAUNCHER_REMOTE_ENV}
    cleared = the_plan.precompiled.clear if the_plan.precompiled else ()
    inherited = {
        name: value
        for name, value in environ.items()
        if name not in the_plan.unset and not (cleared and name.startswith(cleared))
    }
    env = {**inherited, **the_plan.env, **launcher_env}
    if environment is not None:
        env = environment.environ(env)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as handle:
        handle.writelines(f"carry: {line}\n".encode() for line in said)
        handle.write(b"environment carry sets for the build:\n")
        handle.writelines(f"  {name}={env[name]}\n".encode() for name in sorted({**the_plan.env, **launcher_env}))
        handle.writelines(f"  unset {name}\n".encode() for name in the_plan.unset)
        if environment is not None:
            handle.write(f"build environment: {environment.describe()}\n".encode())
            status = pep517.build_wheel(src, out, env, handle, False, str(environment.python))
        else:
            status = pep517.build_wheel(src, out, env, handle, True)
    if status != 0 and says_no_space(log.read_text(errors="replace")):
        raise Failed(f"the upstream build: {no_space_line(src, written=tree_size(src) + tree_size(out))}; log: {log}")
    if status != 0:
        raise Failed(f"the upstream build failed (exit {status}); log: {log}\n{tail(log)}")
    wheels = list(out.glob("*.whl"))
    if len(wheels) != 1:
        raise Failed(f"the upstream build made {len(wheels)} wheels, expected 1; log: {log}")
    return wheels[0]


# --- finishing --------------------------------------------------------------------------------------------


def finish(
    config: Config,
    cache: Cache,
    mirror: Path,
    report: CheckReport,
    series: Series,
    the_plan: WheelPlan,
    produced: producer.Produced,
) -> tuple[Path, verify.Inspection]:
    """The shared finish of every producer: gate and tree check (printed, in full when they fail, and logged),
    version, buildinfo stamp, store in the artifact cache with the gate report beside the wheel."""
    wheel = produced.wheel
    taken = the_plan.precompiled
    reporter.phase("gate", f"checking {wheel.name}")
    tagged = verify.wheel_platform(wheel)
    if taken is None and tagged not in (None, the_plan.platform):
        raise Failed(f"{wheel.name} is tagged for {tagged}, but this build is for {the_plan.platform}")
    checks = verify.inspect_wheel(
        wheel,
        the_plan.policy,
        mirror,
        the_plan.tree,
        config.build.generated,
        taken.members if taken else None,
        platform=the_plan.platform,
    )
    if taken is not None:
        from carry.wheelbuild import precompiled

        checks = dataclasses.replace(
            checks,
            proven=(f"precompiled: {taken.line()}",),
            metadata=tuple(precompiled.metadata_problems(wheel, taken.requires_dist, taken.path.name)),
        )
    for line in checks.lines() if checks.ok else checks.full_lines():
        reporter.phase("gate", line)
    append_log(produced.log, checks.full_lines())
    if not checks.ok:
        raise Failed(
            f"{wheel.name} failed its checks ({checks.summary()}); the wheel was not kept; log: {produced.log}"
        )
    actual = buildinfo.wheel_version(wheel)
    _check_version(actual, the_plan)
    info = make_info(config, report, series, the_plan, actual, checks)
    stamped = buildinfo.stamp(wheel, info, taken.tags if taken else None)
    reporter.phase("stamp", f"{buildinfo.FILENAME} in {stamped.name} (version {actual})")
    return artifacts.store(cache, the_plan.key, stamped, checks.full_lines()), checks


def _check_version(actual: str, the_plan: WheelPlan) -> None:
    """The built version must carry our local label; upstreams may append to it (vLLM adds .cuXYZ)."""
    expected = Version(the_plan.wheel_version)
    try:
        got = Version(actual)
    except InvalidVersion:
        raise Failed(f"the wheel's version {actual!r} is not PEP 440") from None
    if got.public != expected.public or not (got.local or "").startswith(expected.local or ""):
        raise Failed(
            f"the wheel's version is {actual}, expected {the_plan.wheel_version} (or a longer local label): "
            f"check build.version_env names the variable the upstream build reads"
        )


def make_info(
    config: Config,
    report: CheckReport,
    series: Series,
    the_plan: WheelPlan,
    actual_version: str,
    checks: verify.Inspection,
) -> dict:
    """The provenance record; no timestamps, so the same inputs give the same bytes."""
    return {
        "format": buildinfo.FORMAT,
        "carry": carry.__version__,
        "version": the_plan.version,
        "wheel_version": actual_version,
        "upstream": {"url": public_url(config.upstream.url), "pr": config.upstream.pr, "commit": report.base},
        "series": {
            "hash": series.hash,
            "patches": [
                {"name": p.name, "sha256": p.sha256, "upstream_status": str(p.upstream_status or "")}
                for p in series.patches
            ],
        },
        "tree": the_plan.tree,
        "platform": str(the_plan.platform),
        "cuda_arches": str(the_plan.arches),
        "gate_policy": the_plan.policy.to_json(),
        "gate": checks.gate.to_json(),
        "tree_check": checks.tree.to_json() if checks.tree else None,
        "toolchain": the_plan.tools.to_json(),
        "build_environment": (
            {"key": the_plan.environment.key, "inputs": the_plan.environment.spec.public()}
            if the_plan.environment
            else None
        ),
        "precompiled": the_plan.precompiled.to_json() if the_plan.precompiled else None,
        "build_env_keys": sorted(the_plan.env),
        "cache_key": the_plan.key,
        "lineage": the_plan.lineage,  # what a later VERSION's build must match to derive from this wheel
    }


def refuse_another_artifact(
    out: Path, version: str, url: str, pin: str, tree: str, platform: Platform, precompiled_sha256: str | None
) -> None:
    """Bad input when `out` holds a wheel of this upstream and VERSION from another tree or (same platform) precompiled
    wheel: one VERSION names one artifact (`prove` and `status --test` build series prefixes and publish elsewhere)."""
    from carry.util import prog

    for path in sorted(out.glob("*.whl")) if out.is_dir() else ():
        local = path.name.split("-")[1].partition("+")[2] if path.name.count("-") >= 4 else ""
        if local != f"carry.{version}" and not local.startswith(f"carry.{version}."):
            continue
        info = buildinfo.peek(path)
        if not info or info.get("version") != version or (info.get("upstream") or {}).get("url") != url:
            continue
        theirs = ((info.get("precompiled") or {}).get("sha256"), info.get("platform"))
        if info.get("tree") != tree:
            what = f"tree {str(info.get('tree'))[:12]} (pin {str((info.get('upstream') or {}).get('commit'))[:12]})"
            mine = f"tree {tree[:12]} (pin {pin[:12]})"
        elif theirs[1] == str(platform) and theirs[0] != precompiled_sha256:
            what = f"precompiled wheel {str(theirs[0])[:12]}"
            mine = f"precompiled wheel {str(precompiled_sha256)[:12]}"
        else:
            continue
        raise BadInput(
            f"{path} holds VERSION {version} for {what}, and this build is {mine}: one VERSION names one artifact; "
            f"run `{prog.command('version', 'bump')}` (or publish into another --out)"
        )
