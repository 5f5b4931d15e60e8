"""A whole CUDA tree built through a build cluster (issue 51): `carry wheel` for 9.0 and 12.1 through sccache, five
ways, each into its own --out with its own new $CARRY_CACHE (so every unit compiles: sccache's local cache is empty;
at one path, moved aside after each build, as nvcc names anonymous namespaces from the source's path):

    local               no cluster: the reference
    cluster             a real sccache-dist cluster on loopback (ci/dist-cluster.sh: a scheduler and two build
                        servers, token and JWT auth, bubblewrap), the client token from $CARRY_DIST_TOKEN_FILE
    server killed       the same, the second server SIGKILLed mid-build
    scheduler stopped   the same, the scheduler stopped (SIGTERM) mid-build
    wrong token         a token the scheduler refuses: carry's check says so before the build, which runs locally

A new cluster for each build, on the same ports; mid-build is when the scheduler's log has assigned the build's
first jobs (half as many as it has units) to the server that is killed, or in all for the scheduler's stop. The
projects: bench/scale.py's synthetic upstream of N real CUDA translation units (default 48; setup.py + nvcc with
vLLM's job rules, so carry's jobs are its parallel nvcc) and the demo (examples/demo), their build.cuda_arches set
to 9.0,12.1. Per build: wall, jobs per server and the compiles run locally (carry's --json `compiler_cache.dist`,
from sccache's statistics), whether every .so holds the same cubins per arch as the local build's (byte for byte,
carry's fatbin reader), `carry gate --arch 9.0,12.1` and `carry verify` of the wheel, the wheel build's tree check,
and the line that told the user. Nothing leaks: no client token (nor the wrong one) in a command line seen while
the builds ran (tests/procwatch.py), in a file under a build's cache and out (its log included) or in carry's
output; no sccache, sccache-dist or bwrap process of the bench left at the end.

    python bench/disttree.py [--units N] [--jobs N] [--no-demo] [--port P] [--keep DIR]

--units: the tree's translation units (48); --jobs: `carry wheel --jobs` (default: carry's choice, one nvcc per
core); --port: the scheduler's (10900), its servers the two above; --keep: work there and keep it. Needs root (the
servers' sandbox, the process watcher), sccache and sccache-dist 0.16, bwrap and nvcc. Exit 1 on a FAIL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "tests")]

import distbuild  # noqa: E402
import measure  # noqa: E402
import scale  # noqa: E402
from carry.util.errors import BadInput  # noqa: E402

ARCHES = "9.0,12.1"
SERVERS = 2
ASSIGNED = re.compile(r"Job \d+ created and will be assigned to server ServerId\(([^)]+)\)")
DAEMONS = ("sccache", "sccache-dist", "bwrap")
STAMP = re.compile(r"^\[\s*[\d.]+s\] ")


@dataclasses.dataclass(frozen=True)
class Options:
    units: int = 48
    jobs: int | None = None  # carry wheel --jobs; None: carry's choice
    demo: bool = True
    port: int = 10900

    def validate(self) -> None:
        """Bad input, and what the cluster needs, before anything is written."""
        if self.units < 2:
            raise BadInput(f"--units {self.units}: at least 2 (a server is killed after the first jobs)")
        if self.jobs is not None and self.jobs < 1:
            raise BadInput(f"--jobs {self.jobs}: at least 1")
        if not 10900 <= self.port <= 65535 - SERVERS:
            raise BadInput(f"--port {self.port}: use 10900 to {65535 - SERVERS} (below are other benches' and tests')")
        missing = [tool for tool in (*DAEMONS, "nvcc") if shutil.which(tool) is None]
        if missing or os.geteuid() != 0:
            why = f"{', '.join(missing)} not on PATH" if missing else "not root"
            raise BadInput(f"{why}: the cluster needs sccache, sccache-dist (pip install sccache), bwrap, nvcc, root")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    target: str
    cluster: bool = True
    wrong_token: bool = False
    stop: str | None = None  # stopped mid-build: "server" (the second, SIGKILL) or "scheduler" (SIGTERM)


# every target also: exit 0, gate, verify and tree check pass, and (but local) the same cubins as local's
FALLBACK = ">= 1 failed distributed compile, run locally, in 1 dist: line"
CASES = (
    Case("local", "checks pass", cluster=False),
    Case("cluster", "jobs on both servers; cubins = local, checks pass"),
    Case("a server killed mid-build", f"{FALLBACK}; cubins = local, checks pass", stop="server"),
    Case("the scheduler stopped mid-build", f"{FALLBACK}; cubins = local, checks pass", stop="scheduler"),
    Case("a wrong token", "1 `refused the client token` line, 0 sent; cubins = local, checks pass", wrong_token=True),
)


@dataclasses.dataclass(frozen=True)
class Project:
    key: str  # its builds' folder
    name: str
    config: Path
    units: int  # .cu files


@dataclasses.dataclass(frozen=True)
class Built:
    """One `carry wheel`, and what was checked of its wheel."""

    case: Case
    place: Path  # its cache, out and carry's output
    token: str | None  # the client token it was given
    code: int
    wall: float
    load: tuple[float, float]  # the 1-minute load average when it started and ended
    result: dict  # carry's --json ({} when it failed)
    err: str
    stopped: str | None  # what was stopped mid-build, when
    cubins: dict[str, dict[str, list[str]]]  # .so in the wheel -> arch -> image sha256s
    gate: bool
    verify: bool

    @property
    def dist(self) -> dict:
        return (self.result.get("compiler_cache") or {}).get("dist") or {}

    def said(self, phase: str) -> list[str]:
        return [STAMP.sub("", line) for line in self.err.splitlines() if re.match(rf"\[\s*[\d.]+s\] {phase}: ", line)]


def configured(config: Path) -> Path:
    """`config` with build.cuda_arches 9.0,12.1 and sccache as the compiler cache."""
    text = re.sub(r"(?m)^  cuda_arches: .*$", f'  cuda_arches: "{ARCHES}"', config.read_text(), count=1)
    config.write_text(re.sub(r"(?m)^  compiler_cache: .*$", "  compiler_cache: sccache", text, count=1))
    return config


def projects(work: Path, options: Options) -> list[Project]:
    tree = scale.generate(work / "tree", options.units, variants=1)
    found = [Project("tree", f"tree of {options.units} TUs", configured(tree.config), options.units)]
    if options.demo:
        demo = shutil.copytree(ROOT / "examples" / "demo", work / "demo")
        units = len({p.name for p in (demo / "upstream").glob("*/csrc/*.cu")})
        found.append(Project("demo", "demo", configured(demo / "build.yaml"), units))
    return found


def stop_mid_build(case: Case, project: Project, dist: distbuild.Cluster, state: Path, elapsed: float) -> str | None:
    """Stop the case's daemon once the scheduler has assigned the build's first jobs (what it said), else None."""
    assigned = ASSIGNED.findall((state / "scheduler.log").read_text(errors="replace"))
    victim = list(dist.servers)[-1]
    enough = max(2, project.units // 2)
    if case.stop == "server" and (count := assigned.count(victim)) >= enough:
        halt(state / f"server{SERVERS}.pid", signal.SIGKILL)
        return f"{victim} SIGKILLed at {elapsed:.0f} s, its job {count} just assigned"
    if case.stop == "scheduler" and len(assigned) >= enough:
        halt(state / "scheduler.pid", signal.SIGTERM)
        return f"the scheduler stopped at {elapsed:.0f} s, after {len(assigned)} jobs assigned"
    return None


def halt(pidfile: Path, sig: int) -> None:
    """Signal the cluster's daemon of `pidfile`, reap it (this process is its reaper) and remove the file, so that
    the cluster's stop cannot signal another process that has its pid since."""
    pid = int(pidfile.read_text())
    os.kill(pid, sig)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    pidfile.unlink()


def stop_build(proc: subprocess.Popen) -> None:
    """carry, when still running, stopped as Ctrl-C does (it stops its sccache server on the way out; 30 s at most),
    then what is left in its session killed."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def build(project: Project, case: Case, place: Path, options: Options, dist=None, state=None, token=None) -> Built:
    """`carry wheel --json` of `project` for `case` (through `dist` when given, its token in the file `token`);
    then its wheel's gate, verify and cubins. Its new $CARRY_CACHE is at the project's one path, moved into `place`
    afterwards: nvcc names anonymous namespaces from the source's path (the demo has some), so the cubins of
    builds at two paths differ."""
    place.mkdir(parents=True)
    cache = place.parent / "cache"
    env = {**measure.clean_env(), "CARRY_CACHE": str(cache)}
    if dist is not None:
        env.update(CARRY_DIST_SCHEDULER_URL=dist.url, CARRY_DIST_TOKEN_FILE=str(token))
    argv = measure.carry_argv(project.config, "wheel", "--out", str(place / "out"), "--json")
    argv += ["--jobs", str(options.jobs)] if options.jobs else []
    stopped, start, load = None, time.monotonic(), os.getloadavg()[0]
    with open(place / "wheel.json", "w") as out, open(place / "wheel.err", "w") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            while proc.poll() is None:
                distbuild.reap_orphans({proc.pid})  # the build's sccache server, the killed daemon
                if case.stop and stopped is None:
                    stopped = stop_mid_build(case, project, dist, state, time.monotonic() - start)
                time.sleep(0.2)
        finally:  # the bench stopped (SIGTERM, Ctrl-C, an error): no build left running into its removed dir
            stop_build(proc)
    wall, loads = time.monotonic() - start, (load, os.getloadavg()[0])
    result = json.loads((place / "wheel.json").read_text()) if proc.returncode == 0 else {}
    wheel, gate, verify, cubins = result.get("wheel"), False, False, {}
    if wheel:
        gate = measure.run(measure.carry_argv(project.config, "gate", wheel, "--arch", ARCHES), env).code == 0
        verify = measure.run(measure.carry_argv(project.config, "verify", wheel), env).code == 0
        with zipfile.ZipFile(wheel) as archive:
            cubins = {n: distbuild.cubins(archive.read(n)) for n in archive.namelist() if re.search(r"\.so(\.|$)", n)}
    client_token = Path(token).read_text().strip() if token else None
    err = (place / "wheel.err").read_text()
    if cache.exists():  # carry may fail before it makes its cache
        cache.rename(place / "cache")
    return Built(case, place, client_token, proc.returncode, wall, loads, result, err, stopped, cubins, gate, verify)


def builds(project: Project, work: Path, options: Options) -> list[Built]:
    """The project's five builds, each cluster case on a new cluster."""
    done = []
    for case in CASES:
        place = work / "builds" / project.key / re.sub(r"\W+", "-", case.name)
        if not case.cluster:
            done.append(build(project, case, place, options))
            continue
        state = work / "clusters" / place.relative_to(work / "builds")
        with distbuild.cluster(state, options.port, SERVERS) as dist:
            token = state / "client.token"
            if case.wrong_token:
                token = work / "wrong.token"
                token.write_text(secrets.token_urlsafe(32) + "\n")
            done.append(build(project, case, place, options, dist, state, token))
    return done


# the report -------------------------------------------------------------------------------------------------------


def arches(built: Built) -> list[str]:
    return sorted({arch for so in built.cubins.values() for arch in so}, key=lambda a: (len(a), a))


def images(built: Built, arch: str) -> int:
    return sum(len(so.get(arch, [])) for so in built.cubins.values())


def compared(reference: Built, built: Built) -> tuple[bool, str]:
    """Whether `built`'s .so files hold the reference's cubins (per arch, byte for byte), and how many do: each .so's
    images against the same .so's."""
    parts = []
    for arch in arches(reference):
        alike = sum(
            a == b
            for name, so in reference.cubins.items()
            for a, b in zip(so.get(arch, []), built.cubins.get(name, {}).get(arch, []))
        )
        parts.append(f"{arch} {alike}/{images(reference, arch)}")
    same = bool(parts) and built.cubins == reference.cubins
    return same, f"cubins {'= local' if same else 'NOT = local'} ({', '.join(parts)})"


def rows_for(project: Project, done: list[Built]) -> list[tuple]:
    """Per build: its figures against its target, what was stopped mid-build, and the line that told the user."""
    reference, rows = done[0], []
    for built in done:
        case, dist = built.case, built.dist
        tree_ok = bool((built.result.get("tree_check") or {}).get("ok"))
        ok = built.code == 0 and built.gate and built.verify and tree_ok
        checks = "checks pass" if ok else f"gate {built.gate}, verify {built.verify}, tree check {tree_ok}"
        if built is reference:
            counts = ", ".join(f"{a} {images(built, a)}" for a in arches(built))
            figures, told = f"cubins {counts or 'none'} (the reference)", built.said("cache")
            ok = ok and bool(counts)
        else:
            same, figures = compared(reference, built)
            servers = ", ".join(f"{s} {n}" for s, n in sorted(dist.get("servers", {}).items())) or "none"
            figures = f"jobs {servers}; local {dist.get('local')} ({dist.get('failed')} after a failure); {figures}"
            lines, checked = built.said("dist"), built.said("distributed")
            told = checked if case.wrong_token else lines
            ok = ok and same and len(lines) == 1 and len(checked) == 1
            if case.wrong_token:
                ok = ok and "refused the client token" in checked[0] and dist.get("distributed") == 0
            elif case.stop:
                ok = ok and built.stopped is not None and dist.get("failed", 0) >= 1
            else:
                ok = ok and len(dist.get("servers", {})) == SERVERS and all(dist["servers"].values())
        walled = f"{built.wall:.0f} s (load {built.load[0]:.1f}-{built.load[1]:.1f})"
        rows.append((project.name, case.name, f"{walled}, exit {built.code}; {figures}; {checks}", case.target, ok))
        if case.stop:
            rows.append((project.name, "  stopped", built.stopped or "NOTHING: the build ended first", "", None))
        rows.append((project.name, "  told", " | ".join(told) or "(no line)", "", None))
    return rows


def leaks(work: Path, done: list[Built], seen: set[str]) -> list[tuple]:
    """The client tokens against the command lines seen, each build's files and output; daemons left."""
    from test_remote_cache import secret_free

    tokens = {b.token for b in done if b.token}
    argv = [line for line in seen if any(t in line for t in tokens)]
    files = [f for b in done if b.token for f in secret_free(b.token, b.place)]
    # the cluster's own dir holds its token by design (mode 600 configs; the scheduler logs it on a mismatch)
    for _ in range(50):  # carry stops its sccache server; the cluster's stop reaped the daemons
        distbuild.reap_orphans(set())
        left = left_over(work)
        if not left:
            break
        time.sleep(0.1)
    return [
        ("leaks", f"{len(tokens)} client token(s) (the wrong one too)",
         f"in {len(argv)} of {len(seen)} command lines seen, {len(files)} file(s) under the {len(done)} builds' "
         f"caches, outs and carry's output" + (f": {', '.join(files[:3])}" if files else ""),
         "in none", not argv and not files and bool(tokens)),
        ("leaks", "sccache, sccache-dist, bwrap processes of the bench left", ", ".join(left) or "none", "none",
         not left),
    ]  # fmt: skip


def left_over(work: Path) -> list[str]:
    """The daemons still running whose command line or environment names `work`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() in DAEMONS:
                named = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
                if str(work).encode() in named:
                    found.append(f"{(entry / 'comm').read_text().strip()} (pid {entry.name})")
        except OSError:
            continue
    return found


def run_all(options: Options, work: Path) -> list[tuple]:
    """Every project's five builds and the leak checks: rows (section, measure, value, target, ok)."""
    from procwatch import command_lines

    # a shell's background job ignores SIGINT, and so would carry, started from it: stop_build's signal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    work = work.resolve()
    chosen, done, rows = projects(work, options), [], []
    with command_lines() as seen:
        for project in chosen:
            built = builds(project, work, options)
            done += built
            rows += rows_for(project, built)
    return rows + leaks(work, done, seen)


def bench(work: Path, row, quick: bool = False) -> list:
    """bench/run.py's part `disttree` (--quick: 12 units, no demo)."""
    options = Options(units=12, demo=False) if quick else Options()
    return [row(*r) for r in measure.part("disttree", options.validate, lambda: run_all(options, work / "disttree"))]


def main(argv: list[str] | None = None) -> int:
    parser = measure.Parser("disttree", __doc__)
    parser.add_argument("--units", type=int, default=48, help="the tree's CUDA translation units")
    parser.add_argument("--jobs", type=int, help="carry wheel --jobs (parallel nvcc)")
    parser.add_argument("--no-demo", dest="demo", action="store_false", help="the tree only")
    parser.add_argument("--port", type=int, default=10900, help="the scheduler's port; its servers above it")
    args = vars(parser.parse_args(argv))
    keep = args.pop("keep")
    options = Options(**args)
    started, load, niceness = time.monotonic(), os.getloadavg()[0], os.nice(0)
    rows = measure.alone("disttree", keep, options.validate, lambda work: run_all(options, work))
    return measure.report(
        f"carry disttree bench: {options.units} units{' and the demo' if options.demo else ''}, arches {ARCHES}, "
        f"{SERVERS} servers on loopback; {measure.cores()} cores, niceness {niceness}, load average "
        f"{load:.1f} -> {os.getloadavg()[0]:.1f}; took {time.monotonic() - started:.0f} s",
        rows,
    )


if __name__ == "__main__":
    sys.exit(main())
