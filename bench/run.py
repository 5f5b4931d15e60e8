#!/usr/bin/env python3
"""carry's benchmark: does carry ever redo work? One table, a PASS/FAIL per target, exit 1 on any FAIL.

    python bench/run.py            full run (about 3-4 minutes on 2 cores)
    python bench/run.py --quick    scaled down, under 2 minutes (the table says what is scaled down)

Everything runs in a temp dir against generated upstreams, driving `python build.py` as a user would:
  1. rebuilds of a scale upstream (N .cu units): cold `wheel`, no-op rerun, a Python-only patch change and a
     patch change to one .cu, each against cold, with nvcc calls counted by a recording CUDA_HOME;
  2. `check` on a vLLM-size tree against clone + checkout + `git apply` of each patch, and `version`'s start-up,
     carry run as installed (measure.installed_python: no .pth hooks such as a `pip install -e` finder);
  3. `fetch` of the pin against a full `git clone --bare`, both over a file:// URL;
  4. the cold build's core utilization and the compile jobs' peak memory against carry's job plan;
  5. a second runner: runner A builds the scale upstream cold against an empty shared redis (a private
     redis-server with a password), runner B builds the same pin + series with another fresh CARRY_CACHE at
     another path, then a Python-only patch change; nvcc compiles counted, units served from the shared cache
     read from ccache's own statistics (`wheel --json`);
  6. the demo's GB10 (linux/arm64) wheel built in its build stage under QEMU, against the same build natively,
     and its rerun (needs `bash ci/setup.sh`: Docker, QEMU and the base images; see bench/emulation.py);
  7. the scale upstream's image cold on an empty second engine, then rebuilt there, emptied, by a new runner
     with --cache-from inline (see bench/imagecache.py);
  8. the build environment for vLLM 0.33.0's real [build-system] requires (torch 2.14.0+cu130): cold (empty env
     dir and a private, empty uv cache; --quick: the machine's uv cache), warm (a new env dir from uv's cache),
     reused, and the disk one env takes (see bench/buildenv.py);
  9. `check` and `status` on the real vLLM history (PyPI's 0.32.0 and 0.33.0 as git, examples/vllm/make_upstream.py)
     with examples/vllm's build.yaml: check against `python -c 'import click, yaml'` (both as installed) and against
     a naive clone + checkout + apply, and status against the v0.33.0 tag (see bench/vllmbench.py);
  10. `gate` on vLLM 0.33.0's real released wheels (whole process), and the fixed vLLM wheel of examples/vllm in
      precompiled mode against a hand-run `VLLM_USE_PRECOMPILED=1 pip wheel`, its rerun, and the aarch64 wheel
      from this x86_64 machine cold and cached (see bench/realwheels.py);
  11. the locked, layered vLLM image of both platforms (examples/vllm): cold `image --push` with the download
      store warm against the arm64 install under QEMU (a measured fraction, scaled by bytes), a Python-only patch
      change, the bytes it pushes, image sizes, files stored twice, peak disk (see bench/lockedimage.py);
  12. `verify IMAGE` on the real vLLM image of examples/vllm, per platform, against reading and hashing its blobs
      alone, and linux/arm64 against linux/amd64 (both read natively; see bench/verifyimage.py);
  13. signing the vLLM image: `image --push` with a key, the seconds spent on the SBOM, provenance and signatures
      against the whole push, the SBOM's size and component count per platform, `verify --key` against plain
      `verify` (see bench/trust.py);
  14. `carry pin` on a replica of vLLM's per-commit wheel index (the real 0.33.0 wheels as nightlies of a grown
      real history, on loopback) against downloading the two wheels alone (see bench/nightlybench.py);
  15. the same vLLM image on runtime images without python3 (NVIDIA's stand-in): the Python base carry derives per
      platform (apt, arm64 under QEMU) first and reused, lock, image --push, verify, and a fresh runner's lock
      --check after deriving again (see bench/runtimebase.py);
  16. the mission's path from a fresh clone: a config shaped like the root one on the replica index and Python-less
      bases, `pin`, `lock`, `image --push`, `verify` per platform, each timed (see bench/rootpath.py);
  17. a fresh CI runner with the registry as its only state: runner A's cold push of VERSION N, a fresh runner's
      Python-only patch change as N+1 (time, bytes downloaded and pushed, peak disk, the smoke test), its layers
      against the warm runner's, a no-change fresh run against `verify IMAGE` (see bench/freshrunner.py);
  18. `suite` on the real vLLM: examples/vllm's selection of vLLM's own tests on the fixed and the release wheel,
      cold, again (the release side cached) and with a sabotaged patch (see bench/suite.py);
  19. a build cluster (sccache-dist) for vLLM's CUDA build: vLLM 0.33.0 csrc files compiled plainly, through
      sccache and through a scheduler and two build servers on loopback (overhead per job, CPU left on the client,
      cubins per arch), and a model of vLLM's whole csrc build over 1-64 servers of 16 cores (see
      bench/distbuild.py, which also runs alone, with its own options and the model's assumptions);
  20. a whole CUDA tree on that cluster: the scale upstream (48 units; --quick: 12) and the demo (full run only)
      built by `wheel` for 9.0 and 12.1 locally, through a scheduler and two servers, with a server killed and the
      scheduler stopped mid-build, and with a wrong token: jobs per server, local fallbacks, cubins per arch against
      the local build's, gate and verify, the token in no argv or file (see bench/disttree.py, which also runs alone).
Machines are noisy, so costs are ratios measured in the same run; CPU used by other processes during the
cold build is measured from /proc/stat and reported next to the utilization.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import buildenv  # noqa: E402
import cudahome  # noqa: E402
import distbuild  # noqa: E402
import disttree  # noqa: E402
import emulation  # noqa: E402
import freshrunner  # noqa: E402
import gitrepo  # noqa: E402
import imagecache  # noqa: E402
import lockedimage  # noqa: E402
import measure  # noqa: E402
import nightlybench  # noqa: E402
import realwheels  # noqa: E402
import redisd  # noqa: E402
import rootpath  # noqa: E402
import runtimebase  # noqa: E402
import scale  # noqa: E402
import suite  # noqa: E402
import trees  # noqa: E402
import trust  # noqa: E402
import verifyimage  # noqa: E402
import vllmbench  # noqa: E402
from carry.wheelbuild import toolchain  # noqa: E402
from measure import carry  # noqa: E402

BUILD_PY = ROOT / "build.py"
JOBS_RE = re.compile(r"] build: .*?(\d+) job\(s\)")


@dataclasses.dataclass(frozen=True)
class Size:
    """How big each part is; --quick scales some of these down."""

    units: int  # .cu translation units in the scale upstream
    repeats: int  # runs of each warm rebuild case (median taken)
    tree_files: int  # the check upstream: its tree at the pin ...
    tree_bytes: int
    tree_commits: int  # ... and the history under it (what a naive clone downloads)
    check_repeats: int
    naive_repeats: int
    commits: int  # the fetch upstream's history
    tip_files: int
    tip_bytes: int
    churn_bytes: int  # new text per commit there

    def describe(self) -> str:
        return (
            f"N={self.units} .cu units, {self.repeats} run(s) per warm case; check: {self.tree_files} files "
            f"{self.tree_bytes / 1e6:.0f} MB over {self.tree_commits} commits, {self.check_repeats} check(s), "
            f"{self.naive_repeats} naive; fetch: {self.commits} commits, tip {self.tip_files} files "
            f"{self.tip_bytes / 1e6:.0f} MB, {self.churn_bytes // 1000} kB new text per commit"
        )


FULL = Size(
    units=24,
    repeats=3,
    tree_files=5000,
    tree_bytes=90_000_000,
    tree_commits=2000,
    check_repeats=5,
    naive_repeats=3,
    commits=2400,
    tip_files=600,
    tip_bytes=6_000_000,
    churn_bytes=40_000,
)
QUICK = Size(
    units=16,
    repeats=3,
    tree_files=5000,
    tree_bytes=90_000_000,
    tree_commits=1000,
    check_repeats=3,
    naive_repeats=1,
    commits=2000,
    tip_files=300,
    tip_bytes=3_000_000,
    churn_bytes=12_000,
)


@dataclasses.dataclass(frozen=True)
class Row:
    section: str
    measure: str
    value: str
    target: str = ""
    ok: bool | None = None  # None: reported, not a target

    @property
    def verdict(self) -> str:
        return "" if self.ok is None else ("PASS" if self.ok else "FAIL")


def carry_env(cache: Path, cuda_home: Path | None = None) -> dict[str, str]:
    """The caller's environment without its own carry/ccache settings, with a private cache."""
    env = {**measure.clean_env(), "CARRY_CACHE": str(cache)}
    if cuda_home is not None:
        env["CUDA_HOME"] = str(cuda_home)
    return env


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%"


# 1 and 4: rebuilds, utilization, memory ----------------------------------------------------------------------

# NVCC_THREADS is the number of arches: nvcc compiles a file's gencode targets in parallel, so a rebuild of one
# .cu file uses more than one core; carry runs one nvcc per core and passes MAX_JOBS = jobs x threads.
NVCC_THREADS = len(scale.ARCHES.split(","))


@dataclasses.dataclass(frozen=True)
class Wheel:
    """One `build.py wheel` run and the nvcc calls it made."""

    run: measure.Measured
    calls: list[cudahome.Call]

    @property
    def compiles(self) -> list[cudahome.Call]:
        return [c for c in self.calls if c.kind == "compile"]


def bench_rebuilds(work: Path, size: Size) -> list[Row]:
    project = scale.generate(work / "scale", size.units, variants=size.repeats + 1, nvcc_threads=NVCC_THREADS)
    cuda = cudahome.make(work / "scale")
    env = carry_env(work / "scale" / "cache", cuda.home)

    def wheel(expect: str) -> Wheel:
        before = len(cuda.calls())
        run = carry(project.config, env, "wheel", "--out", str(work / "scale" / "dist"))
        if expect not in run.err:
            raise SystemExit(f"bench: expected {expect!r} from `wheel`:\n{run.err}")
        return Wheel(run, cuda.calls()[before:])

    cold = wheel("] build:")
    if len(cold.compiles) != size.units:
        raise SystemExit(f"bench: the cold build ran {len(cold.compiles)} nvcc compiles, expected {size.units}")
    noop = [wheel("cache: hit") for _ in range(size.repeats)]
    python = []
    for variant in range(1, size.repeats + 1):
        project.use(python=variant, cuda=0)
        python.append(wheel("] build:"))
    one_cu = []
    for variant in range(1, size.repeats + 1):
        project.use(python=size.repeats, cuda=variant)
        one_cu.append(wheel("] build:"))

    base = cold.run.wall_s
    median = {
        name: measure.median([w.run.wall_s for w in runs])
        for name, runs in (("noop", noop), ("python", python), ("one_cu", one_cu))
    }
    in_nvcc = measure.median([sum(c.wall_s for c in w.calls) for w in one_cu])
    others = measure.median([w.run.others_cpu_s for w in one_cu])
    nvcc_runs = {name: sum(len(w.calls) for w in runs) for name, runs in (("noop", noop), ("python", python))}
    compiled = sorted({Path(c.source).name for w in one_cu for c in w.compiles})
    per_run = sorted({len(w.compiles) for w in one_cu})
    limit = base / size.units + 2.0
    of_runs = f" (median of {size.repeats})" if size.repeats > 1 else ""
    preprocess = sum(c.kind == "preprocess" for c in cold.calls)
    rows = [
        Row(
            "rebuild",
            "cold wheel (fresh cache and ccache)",
            f"{base:.1f} s, {len(cold.compiles)} nvcc compiles (+{preprocess} ccache preprocess runs)",
        ),
        Row(
            "rebuild",
            f"no-op rerun{of_runs}",
            f"{median['noop']:.2f} s = {pct(median['noop'], base)} of cold, {nvcc_runs['noop']} nvcc runs",
            "<= 2% of cold and <= 1 s, 0 nvcc",
            median["noop"] <= 0.02 * base and median["noop"] <= 1.0 and nvcc_runs["noop"] == 0,
        ),
        Row(
            "rebuild",
            f"Python-only patch change{of_runs}",
            f"{median['python']:.2f} s = {pct(median['python'], base)} of cold, {nvcc_runs['python']} nvcc runs",
            "<= 5% of cold, 0 nvcc",
            median["python"] <= 0.05 * base and nvcc_runs["python"] == 0,
        ),
        Row(
            "rebuild",
            f"one .cu changed via 0001{of_runs}",
            f"{median['one_cu']:.2f} s = {pct(median['one_cu'], base)} of cold; nvcc compiles per run: "
            f"{'/'.join(map(str, per_run))} ({', '.join(compiled)})",
            f"<= cold/N + 2 s = {limit:.2f} s, 1 nvcc compile",
            median["one_cu"] <= limit and per_run == [1] and compiled == [f"{project.patched_unit}.cu"],
        ),
        Row(
            "rebuild",
            "  of which in nvcc (ccache's preprocess + the compile)",
            f"{in_nvcc:.2f} s; outside nvcc {median['one_cu'] - in_nvcc:.2f} s; other processes used "
            f"{others:.1f} CPU-s meanwhile",
        ),
    ]
    return rows + utilization_rows(cold)


def utilization_rows(cold: Wheel) -> list[Row]:
    cores = measure.cores()
    run = cold.run
    cpu = run.cpu_s - sum(c.wrapper_cpu_s for c in cold.calls)  # the recording wrapper's cost is not the build's
    others = run.others_cpu_s
    left = run.wall_s * cores - others
    jobs = JOBS_RE.search(run.err)
    threads = int(cold.compiles[0].threads)
    assumed = toolchain.choose_jobs(None, {"NVCC_THREADS": str(threads)}).assumed_bytes_per_job
    peak = max(c.peak_rss for c in cold.calls if c.kind in ("compile", "preprocess"))
    return [
        Row(
            "cores",
            "cold build: CPU / (wall x cores)",
            f"{pct(cpu, run.wall_s * cores)} raw ({cpu:.0f} CPU-s in {run.wall_s:.0f} s x {cores}); other processes "
            f"used {others:.0f} CPU-s meanwhile: {pct(cpu, left)} of the CPU they left",
            ">= 90% of the CPU left to the build",
            cpu >= 0.90 * left,
        ),
        Row(
            "cores",
            "carry's job plan (from its progress line)",
            f"{jobs.group(1) if jobs else '?'} nvcc job(s) x {threads} thread(s) on {cores} cores, "
            f"{assumed / 2**30:.1f} GiB assumed per job (MEMORY_PER_JOB_BYTES x NVCC_THREADS)",
        ),
        Row(
            "memory",
            "compile job peak RSS (largest nvcc process tree)",
            f"{peak / 2**20:.0f} MiB = {pct(peak, assumed)} of the {assumed / 2**30:.1f} GiB assumed per job",
            "<= assumed per job",
            peak <= assumed,
        ),
    ]


# 5: a second runner with a shared compile cache --------------------------------------------------------------


def bench_runners(work: Path, size: Size) -> list[Row]:
    """Runner A cold against an empty shared redis; runner B, another machine's fresh cache at another path."""
    base = work / "runners"
    project = scale.generate(base, size.units, variants=2, nvcc_threads=NVCC_THREADS)
    cuda = cudahome.make(base)  # /usr/local/cuda on both machines: one CUDA_HOME path for both runners
    with redisd.started(base / "redis") as redis:
        shared = {"CARRY_REMOTE_CACHE_URL": redis.url, "CARRY_REMOTE_CACHE_PASSWORD": redis.password}

        def wheel(cache: Path, out: str) -> tuple[Wheel, dict]:
            """A build into its own `out`: one VERSION names one artifact, so another tree's wheel needs another."""
            before = len(cuda.calls())
            env = {**carry_env(cache, cuda.home), **shared}
            run = carry(project.config, env, "wheel", "--out", str(base / out), "--json")
            result = json.loads(run.out)
            if result["reused"] or result["compiler_cache"] is None:
                raise SystemExit(f"bench: expected a build from `wheel`:\n{run.err}")
            return Wheel(run, cuda.calls()[before:]), result["compiler_cache"]

        cold, cold_cache = wheel(base / "runner-a" / "cache", "dist-a")
        if cold_cache["remote"] is None or cold_cache["remote_errors"]:
            raise SystemExit(f"bench: runner A did not use the shared cache:\n{cold.run.err}")
        second, second_cache = wheel(base / "machine-b" / "home" / "ci" / ".cache" / "carry", "dist-b")
        project.use(python=1, cuda=0)
        python, python_cache = wheel(base / "machine-b" / "home" / "ci" / ".cache" / "carry", "dist-b-python")
    base_s = cold.run.wall_s
    units = second_cache["compiles"]
    served = second_cache["remote_hits"] / units if units else 0.0
    nvcc_b, nvcc_python = len(second.compiles), len(python.compiles)
    return [
        Row(
            "runners",
            "runner A: cold wheel, fresh cache, empty shared redis",
            f"{base_s:.1f} s, {len(cold.compiles)} nvcc compiles, {cold_cache['misses']} units stored",
        ),
        Row(
            "runners",
            "runner B: fresh cache at another path, same pin + series",
            f"{second.run.wall_s:.2f} s = {pct(second.run.wall_s, base_s)} of A's cold; "
            f"{second_cache['remote_hits']}/{units} units from the shared cache ({100 * served:.0f}%), "
            f"{nvcc_b} nvcc compiles",
            ">= 95% units shared, 0 nvcc, <= 20% of A's cold",
            served >= 0.95 and nvcc_b == 0 and second.run.wall_s <= 0.20 * base_s,
        ),
        Row(
            "runners",
            "runner B after a Python-only patch change",
            f"{python.run.wall_s:.2f} s = {pct(python.run.wall_s, base_s)} of A's cold, {nvcc_python} nvcc compiles "
            f"({python_cache['hits']}/{python_cache['compiles']} cache hits)",
            "0 nvcc, <= 10% of A's cold",
            nvcc_python == 0 and python.run.wall_s <= 0.10 * base_s,
        ),
    ]


# 2: check ----------------------------------------------------------------------------------------------------


def bench_check(work: Path, size: Size) -> list[Row]:
    upstream = trees.check_upstream(
        work / "check", size.tree_files, size.tree_bytes, size.tree_commits, churn_bytes=30_000
    )
    tree = upstream.history
    gitrepo.git(tree.repo, "repack", "-a", "-d", "-q")
    url = f"file://{tree.repo}"
    project = work / "check" / "project"
    (project / "patches").mkdir(parents=True)
    for patch in upstream.patches:
        shutil.copy(patch, project / "patches" / patch.name)
    (project / "VERSION").write_text("20260105.1\n")
    config = project / "build.yaml"
    config.write_text(
        f"upstream:\n  url: {url}\n  pr: 1\n  commit: {tree.pin}\n  main: main\n"
        f"patches:\n  dir: patches\nimage:\n  name: bigtree\n"
    )
    # carry as installed (no .pth hooks, its bytecode written once), as vllmbench measures it
    env = measure.bytecode_env(carry_env(work / "check" / "cache"), work / "check")
    python = measure.installed_python(work)
    carry(config, env, "fetch")
    argv = {
        "check": [str(python), str(BUILD_PY), "--config", str(config), "check"],
        "version": [str(python), str(BUILD_PY), "--config", str(config), "version"],
        "base": [str(python), "-c", "import click, yaml"],
    }
    for command in argv.values():
        measure.run(command, env).check()
    checks, versions, bases = [], [], []
    for _ in range(size.check_repeats):
        run = measure.run(argv["check"], env)
        if run.code != 0 or "tree   " not in run.out or "not written" in run.out:
            raise SystemExit(f"bench: check failed on the synthetic tree:\n{run.out}\n{run.err}")
        checks.append(run.wall_s)
        versions.append(measure.run(argv["version"], env).check().wall_s)
        bases.append(measure.run(argv["base"], env).check().wall_s)
    naive = [
        naive_check(work / "check" / f"naive-{i}", url, tree.pin, upstream.patches) for i in range(size.naive_repeats)
    ]
    ours, theirs, version = measure.median(checks), measure.median(naive), measure.median(versions)
    base = measure.median(bases)
    return [
        Row(
            "check",
            "synthetic upstream",
            f"{tree.tip_files} files, {tree.tip_bytes / 1e6:.0f} MB at the pin; {tree.commits} commits; 2 patches",
        ),
        Row(
            "check",
            "`build.py check` (whole process, mirror fetched, as installed)",
            f"{ours * 1000:.0f} ms = {ours / base:.2f}x `python -c 'import click, yaml'` ({base * 1000:.0f} ms)",
            "<= 300 ms",
            ours <= 0.3,
        ),
        Row(
            "check",
            "naive: clone, fetch PR, checkout, git apply x2",
            f"{theirs * 1000:.0f} ms = {theirs / ours:.1f}x carry's",
            ">= 10x carry's",
            theirs >= 10 * ours,
        ),
        Row(
            "check",
            "`build.py version` (whole process, as installed)",
            f"{version * 1000:.0f} ms = {version / base:.2f}x click+yaml",
            "<= 200 ms",
            version <= 0.2,
        ),
    ]


def naive_check(dest: Path, url: str, pin: str, patches: tuple[Path, ...]) -> float:
    """What a CI job does without carry: clone the upstream, fetch the PR, check out the pin, apply each patch."""
    env = dict(os.environ, **gitrepo.IDENTITY)
    steps = [
        ["git", "clone", "-q", "--no-checkout", url, str(dest)],
        ["git", "-C", str(dest), "fetch", "-q", "origin", "refs/pull/1/head"],
        ["git", "-C", str(dest), "checkout", "-q", "--detach", pin],
        *(["git", "-C", str(dest), "apply", str(patch)] for patch in patches),
    ]
    total = sum(measure.run(step, env).check().wall_s for step in steps)
    shutil.rmtree(dest)
    return total


# 3: fetch ----------------------------------------------------------------------------------------------------


def bench_fetch(work: Path, size: Size) -> list[Row]:
    history, _ = trees.history(work / "fetch", size.commits, size.tip_files, size.tip_bytes, size.churn_bytes)
    gitrepo.git(history.repo, "repack", "-a", "-d", "-f", "-q")  # served well packed, as a forge serves
    url = f"file://{history.repo}"
    full_dir = work / "fetch" / "full.git"
    full = measure.run(["git", "clone", "-q", "--bare", url, str(full_dir)], dict(os.environ)).check()
    full_bytes = dir_bytes(full_dir / "objects")
    project = work / "fetch" / "project"
    (project / "patches").mkdir(parents=True)
    (project / "VERSION").write_text("20260105.1\n")
    config = project / "build.yaml"
    config.write_text(
        f"upstream:\n  url: {url}\n  pr: 1\n  commit: {history.pin}\n  main: main\n"
        f"patches:\n  dir: patches\nimage:\n  name: history\n"
    )
    cache = work / "fetch" / "cache"
    ours = carry(config, carry_env(cache), "fetch")
    mirrors = list((cache / "mirrors").glob("*.git"))
    ours_bytes = dir_bytes(mirrors[0] / "objects")
    commits = gitrepo.count_commits(mirrors[0], "--all")
    return [
        Row(
            "fetch",
            "synthetic upstream",
            f"{history.commits} commits, tip {history.tip_files} files "
            f"{history.tip_bytes / 1e6:.1f} MB, {history.written_bytes / 1e6:.0f} MB of text written over history",
        ),
        Row("fetch", "full `git clone --bare` (file://)", f"{full_bytes / 1e6:.1f} MB objects, {full.wall_s:.2f} s"),
        Row(
            "fetch",
            "`build.py fetch` (fresh cache, file://)",
            f"{ours_bytes / 1e6:.2f} MB = {pct(ours_bytes, full_bytes)} of the clone, {commits} commit(s), "
            f"{ours.wall_s:.2f} s = {pct(ours.wall_s, full.wall_s)} of its time",
            "bytes <= 10% of full clone",
            ours_bytes <= 0.10 * full_bytes,
        ),
    ]


# the table ---------------------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    widths = [max(len(getattr(r, f)) for r in rows) for f in ("section", "measure", "value", "target")]
    header = ("section", "measure", "value", "target")
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  result"]
    lines.append("  ".join("-" * w for w in widths) + "  ------")
    for r in rows:
        cells = (r.section, r.measure, r.value, r.target)
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + r.verdict)
    return "\n".join(line.rstrip() for line in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="scaled down, under 2 minutes")
    parser.add_argument("--keep", type=Path, help="work in this (new) directory and keep it")
    parser.add_argument(
        "--only",
        default="check,fetch,rebuild,runners,distbuild,disttree,arm64,image,buildenv,vllm,gate,precompiled,pin,locked,verify,trust,runtimebase,rootpath,fresh,suite",
        help="comma-separated parts to run",
    )
    options = parser.parse_args()
    parts = {
        "check": bench_check,
        "fetch": bench_fetch,
        "rebuild": bench_rebuilds,
        "runners": bench_runners,
        "arm64": lambda work, size: emulation.bench(work, Row),
        "image": lambda work, size: imagecache.bench(work, size.units, Row),
        "buildenv": lambda work, size: buildenv.bench(work, Row, quick=size is QUICK),
        "gate": lambda work, size: realwheels.bench_gate(work, Row),
        "precompiled": lambda work, size: realwheels.bench_precompiled(work, Row),
        "pin": lambda work, size: nightlybench.bench(work / "pin", Row),
        "vllm": lambda work, size: vllmbench.bench(work / "vllm", size, Row),
        "locked": lambda work, size: lockedimage.bench(work, Row),
        "verify": lambda work, size: verifyimage.bench(work, Row),
        "trust": lambda work, size: trust.bench(work, Row),
        "runtimebase": lambda work, size: runtimebase.bench(work, Row),
        "rootpath": lambda work, size: rootpath.bench(work, Row),
        "fresh": lambda work, size: freshrunner.bench(work, Row),
        "suite": lambda work, size: suite.bench(work, Row),
        "distbuild": lambda work, size: distbuild.bench(work, Row, quick=size is QUICK),
        "disttree": lambda work, size: disttree.bench(work, Row, quick=size is QUICK),
    }
    # The start-up ratios (check, vllm) run first, before the parts that churn gigabytes through the page cache.
    # verify reads the image `locked` pushed.
    order = [
        "check",
        "vllm",
        "fetch",
        "rebuild",
        "runners",
        "distbuild",
        "disttree",
        "arm64",
        "image",
        "buildenv",
        "gate",
        "precompiled",
        "pin",
        "locked",
        "verify",
        "trust",
        "runtimebase",
        "rootpath",
        "fresh",
        "suite",
    ]
    chosen = options.only.split(",")
    if not chosen or set(chosen) - set(parts):
        parser.error(f"--only takes a list of {', '.join(parts)}")
    size = QUICK if options.quick else FULL
    start = time.monotonic()
    work = options.keep or Path(tempfile.mkdtemp(prefix="carry-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows = [row for name in order if name in chosen for row in parts[name](work, size)]
    finally:
        if options.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    mode = "--quick" if options.quick else "full"
    print(f"carry bench ({mode}): {size.describe()}")
    print(f"machine: {measure.cores()} cores; took {time.monotonic() - start:.0f} s\n")
    print(table(rows))
    failed = [r for r in rows if r.ok is False]
    print(f"\n{len(rows) - len(failed) - sum(r.ok is None for r in rows)} PASS, {len(failed)} FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
