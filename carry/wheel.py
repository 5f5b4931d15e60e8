"""Build the patched tree into a wheel with the upstream's own PEP 517 build, gate it, stamp it, cache it."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

import carry
from carry import buildinfo, compilecache, gate, git, pep517, toolchain
from carry.apply import CheckReport
from carry.arch import ArchList
from carry.cache import Cache
from carry.config import Config, RemoteCache, public_url
from carry.errors import Failed
from carry.fsutil import owned_prefix, sweep_dead, temp_dir
from carry.platforms import Platform
from carry.progress import Progress
from carry.series import Series

LOG_TAIL_LINES = 40
ARCH_VARIABLES = ("TORCH_CUDA_ARCH_LIST", "CMAKE_CUDA_ARCHITECTURES")


@dataclasses.dataclass(frozen=True)
class WheelPlan:
    """Everything a wheel build depends on, resolved once; `key` addresses the artifact cache."""

    tree: str
    version: str
    wheel_version: str
    arches: ArchList
    env: dict[str, str]
    unset: tuple[str, ...]  # inherited variables the build must not see
    jobs: toolchain.JobPlan
    tools: toolchain.Toolchain
    key: str
    remote: RemoteCache | None = None  # the shared compile cache; it changes no output, so it is not in `key`


@dataclasses.dataclass(frozen=True)
class WheelResult:
    path: Path
    reused: bool
    plan: WheelPlan
    cache: compilecache.CacheOutcome | None = None  # what the compiler cache did; None when nothing was built

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
        }


def plan(
    config: Config,
    report: CheckReport,
    version: str,
    arches: ArchList,
    job_plan: toolchain.JobPlan,
    tools: toolchain.Toolchain,
    remote: RemoteCache | None = None,
) -> WheelPlan:
    if report.tree is None:
        failed = [r.patch.name for r in report.results if r.failure]
        raise Failed(f"the series does not apply ({', '.join(failed)} failed); run `check` for details")
    wheel_version = config.build.wheel_version.format(version=version)
    key_material = {
        "carry": carry.__version__,
        "tree": report.tree,
        "series": report.series_hash,  # the buildinfo names the patches: a reworded one is another artifact
        "arches": str(arches),
        "build_env": config.build.env,
        "wheel_version": wheel_version,
        "version_env": list(config.build.version_env),
        "isolation": config.build.build_isolation,
        "toolchain": tools.to_json(),
    }
    key = hashlib.sha256(json.dumps(key_material, sort_keys=True).encode()).hexdigest()
    env = _build_env(config, arches, wheel_version, job_plan.max_jobs, tools)
    unset = () if arches.expects_cuda else ARCH_VARIABLES
    return WheelPlan(report.tree, version, wheel_version, arches, env, unset, job_plan, tools, key, remote)


def _build_env(config: Config, arches: ArchList, wheel_version: str, jobs: int, tools: toolchain.Toolchain) -> dict:
    """The variables carry sets for the upstream build (on top of the caller's environment).

    With no CUDA arches the arch variables are left out (and `unset` drops inherited ones): PyTorch and CMake
    both reject an empty list, and a Python-only build (vLLM's VLLM_TARGET_DEVICE=empty) reads neither.
    """
    env = dict(config.build.env)
    if arches.expects_cuda:
        env.update(
            TORCH_CUDA_ARCH_LIST=arches.torch_cuda_arch_list(),
            CMAKE_CUDA_ARCHITECTURES=arches.cmake_cuda_architectures(),
        )
    env["MAX_JOBS"] = str(jobs)
    for name in config.build.version_env:
        env[name] = wheel_version
    if tools.launcher:
        for language in ("CUDA", "C", "CXX"):
            env[f"CMAKE_{language}_COMPILER_LAUNCHER"] = tools.launcher.path
    return env


def build(
    config: Config,
    cache: Cache,
    mirror: Path,
    report: CheckReport,
    series: Series,
    the_plan: WheelPlan,
    out: Path,
    progress: Progress,
) -> WheelResult:
    """Reuse the cached wheel for this plan's key, or build, gate, stamp and cache it; publish into `out`."""
    outcome = None
    with cache.lock(f"wheel-{the_plan.key}"):
        cached = _cached_wheel(cache, the_plan.key)
        if cached is None:
            with cache.lock(f"build-{mirror.name}"):
                cached, outcome = _build_fresh(config, cache, mirror, report, series, the_plan, progress)
            reused = False
        else:
            reused = True
            progress.phase("cache", f"hit {the_plan.key[:12]}: reusing {cached.name}")
    published = publish(cached, out)
    return WheelResult(published, reused, the_plan, outcome)


def _cached_wheel(cache: Cache, key: str) -> Path | None:
    directory = cache.artifacts / key
    wheels = sorted(directory.glob("*.whl")) if directory.is_dir() else []
    return wheels[0] if len(wheels) == 1 else None


def publish(wheel: Path, out: Path) -> Path:
    """Copy into `out` through a temp file and a rename: `out` never holds a partial wheel."""
    out.mkdir(parents=True, exist_ok=True)
    dest = out / wheel.name
    sweep_dead(out, f".{wheel.name}.")
    fd, tmp = tempfile.mkstemp(prefix=owned_prefix(f".{wheel.name}."), suffix=".tmp", dir=out)
    os.close(fd)
    try:
        shutil.copyfile(wheel, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return dest


def _build_fresh(config, cache, mirror, report, series, the_plan: WheelPlan, progress: Progress):
    """Build, gate and stamp into the artifact cache; returns the wheel there and the compiler cache's outcome."""
    build_dir = cache.builds / mirror.name.removesuffix(".git")
    src = build_dir / "src"
    progress.phase("materialize", f"tree {the_plan.tree[:12]} -> {src}")
    git.sync_worktree(mirror, the_plan.tree, src, build_dir / "index")
    log = cache.logs / f"wheel-{the_plan.key[:16]}.log"
    with temp_dir(cache.scratch, "wheel-") as scratch:
        recorded = _Recorder(progress)
        with compilecache.run(the_plan.tools.launcher, the_plan.remote, cache.root, src, scratch, os.environ,
                              recorded) as launcher:
            recorded.phase(
                "build",
                f"PEP 517 build_wheel, arches {the_plan.arches}, {the_plan.jobs.jobs} job(s) "
                f"({the_plan.jobs.reason}), compiler cache {the_plan.tools.describe_launcher()}; log {log}",
            )
            built = _run_build(config, src, scratch / "out", the_plan, log, launcher, recorded)
            outcome = launcher.outcome() if launcher else None
        if outcome is not None:
            recorded.phase("cache", outcome.line())
            _append_log(log, recorded.lines[-1:])
        progress.phase("gate", f"checking CUDA code in {built.name}")
        gate_report = _gate(built, the_plan.arches, scratch / "unpacked")
        for line in gate_report.lines():
            progress.phase("gate", line)
        actual = buildinfo.wheel_version(built)
        _check_version(actual, the_plan)
        info = make_info(config, report, series, the_plan, actual, gate_report)
        buildinfo.stamp(built, info, scratch)
        progress.phase("stamp", f"{buildinfo.FILENAME} in {built.name} (version {actual})")
        return _store(cache, the_plan.key, built), outcome


class _Recorder(Progress):
    """Progress that also keeps the lines it printed, for the build log."""

    def __init__(self, progress: Progress):
        super().__init__(progress.stream, progress.quiet)
        self.start = progress.start
        self.lines: list[str] = []

    def phase(self, name: str, detail: str = "") -> None:
        self.lines.append(f"{name}: {detail}")
        super().phase(name, detail)


def _append_log(log: Path, lines: list[str]) -> None:
    with open(log, "a") as handle:
        handle.writelines(f"carry: {line}\n" for line in lines)


def _run_build(config: Config, src: Path, out: Path, the_plan: WheelPlan, log: Path,
               launcher: compilecache.CacheRun | None, recorded: _Recorder) -> Path:
    """Run the upstream build with the plan's variables and the launcher's settings; the caller's own secrets
    (carry's passwords) and the variables the plan unsets stay out of its environment."""
    launcher_env = launcher.env if launcher else {}
    environ = compilecache.secret_free_env(os.environ)
    if launcher and (launcher.remote or launcher.remote_note):
        environ = {k: v for k, v in environ.items() if k not in compilecache.LAUNCHER_REMOTE_ENV}
    inherited = {name: value for name, value in environ.items() if name not in the_plan.unset}
    env = {**inherited, **the_plan.env, **launcher_env}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as handle:
        handle.writelines(f"carry: {line}\n".encode() for line in recorded.lines)
        handle.write(b"environment carry sets for the build:\n")
        for name in sorted({**the_plan.env, **launcher_env}):
            handle.write(f"  {name}={env[name]}\n".encode())
        for name in the_plan.unset:
            handle.write(f"  unset {name}\n".encode())
        status = pep517.build_wheel(src, out, env, handle, config.build.build_isolation)
    if status != 0:
        raise Failed(f"the upstream build failed (exit {status}); log: {log}\n{tail(log)}")
    wheels = list(out.glob("*.whl"))
    if len(wheels) != 1:
        raise Failed(f"the upstream build made {len(wheels)} wheels, expected 1; log: {log}")
    return wheels[0]


def tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    with open(log, "rb") as handle:
        last = collections.deque(handle, maxlen=lines)
    return "".join(line.decode(errors="replace") for line in last).rstrip()


def _gate(wheel: Path, arches: ArchList, unpacked: Path) -> gate.GateReport:
    buildinfo.extract(wheel, unpacked, only=gate.may_be_shared_object)
    report = gate.check_files([unpacked], arches, root=unpacked)
    report.raise_for_failures()
    return report


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


def make_info(config, report, series, the_plan: WheelPlan, actual_version: str, gate_report) -> dict:
    """The provenance record; no timestamps, so the same inputs give the same bytes."""
    return {
        "format": buildinfo.FORMAT,
        "carry": carry.__version__,
        "version": the_plan.version,
        "wheel_version": actual_version,
        "upstream": {
            "url": public_url(config.upstream.url),
            "pr": config.upstream.pr,
            "commit": report.base,
        },
        "series": {
            "hash": series.hash,
            "patches": [
                {"name": p.name, "sha256": p.sha256, "upstream_status": str(p.upstream_status or "")}
                for p in series.patches
            ],
        },
        "tree": the_plan.tree,
        "platform": str(Platform.native()),
        "cuda_arches": str(the_plan.arches),
        "gate": gate_report.to_json(),
        "toolchain": the_plan.tools.to_json(),
        "build_env_keys": sorted(the_plan.env),
        "cache_key": the_plan.key,
    }


def _store(cache: Cache, key: str, wheel: Path) -> Path:
    """Move the finished wheel into the artifact cache with one directory rename."""
    cache.artifacts.mkdir(parents=True, exist_ok=True)
    sweep_dead(cache.artifacts, f".{key[:12]}-")
    staging = Path(tempfile.mkdtemp(prefix=owned_prefix(f".{key[:12]}-"), dir=cache.artifacts))
    shutil.move(str(wheel), staging / wheel.name)
    final = cache.artifacts / key
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    return final / wheel.name
