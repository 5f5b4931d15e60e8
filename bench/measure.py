"""Run a command and measure it: wall time, the CPU time of its whole process tree, and the machine's load."""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

TICKS = os.sysconf("SC_CLK_TCK")
BUILD_PY = Path(__file__).resolve().parent.parent / "build.py"


def cores() -> int:
    return len(os.sched_getaffinity(0))


def clean_env() -> dict[str, str]:
    """This process's environment without the caller's own carry, sccache and ccache settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("CARRY_", "CCACHE_", "SCCACHE_"))}


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (user, nice, system, irq, softirq, steal) since boot."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICKS


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclasses.dataclass(frozen=True)
class Measured:
    argv: tuple[str, ...]
    code: int
    out: str
    err: str
    wall_s: float
    cpu_s: float  # the command and every descendant it waited for
    machine_busy_s: float  # every process on the machine, this command included

    @property
    def others_cpu_s(self) -> float:
        """CPU the rest of the machine used meanwhile (other users' work); never negative."""
        return max(0.0, self.machine_busy_s - self.cpu_s)

    def check(self) -> Measured:
        if self.code != 0:
            raise SystemExit(f"bench: {' '.join(self.argv)} exited {self.code}\n{self.err[-3000:]}")
        return self


def run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> Measured:
    """Run `argv` to completion (stdin closed); nothing else may run as our child meanwhile."""
    cpu0, busy0, start = children_cpu_s(), busy_cpu_s(), time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    return Measured(
        tuple(argv), proc.returncode, proc.stdout, proc.stderr, wall, children_cpu_s() - cpu0, busy_cpu_s() - busy0
    )


def median(values: list[float]) -> float:
    return statistics.median(values)


def carry_argv(config: Path, *args: str) -> list[str]:
    return [sys.executable, str(BUILD_PY), "--config", str(config), *args]


def carry(config: Path, env: dict[str, str], *args: str) -> Measured:
    """`build.py --config CONFIG ARGS...` measured; a failure stops the bench."""
    return run(carry_argv(config, *args), env).check()


def downloads() -> str:
    """The download store the real vLLM files are in, as carry resolves it ($CARRY_DOWNLOADS, else the cache's)."""
    from carry.source import releases

    return str(releases.store().root)


def installed_python(work: Path) -> Path:
    """An interpreter that runs carry as a user's install does: a venv (no pip) that sees this interpreter's
    packages (click, PyYAML, packaging, ...) through one .pth line, so that none of the .pth hooks in site-packages
    run. Those start every Python process, the click+yaml baseline's too, and no user's installed carry has them:
    the finder of a `pip install -e` checkout (what ci/setup.sh makes; it imports pathlib, importlib.util and
    urllib.parse before any user code), setuptools' distutils shim, a machine's own (this one imports certifi)."""
    venv = work / "installed-python"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        packages = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
        site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        (site / "carry-bench-packages.pth").write_text("".join(f"{path}\n" for path in packages))
    return python


def bytecode_env(env: dict[str, str], work: Path) -> dict[str, str]:
    """`env` with bytecode read and written under a private PYTHONPYCACHEPREFIX (PYTHONDONTWRITEBYTECODE removed):
    an installed carry has its .pyc files, as click and yaml in site-packages have theirs. Warm it with a first run."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    return env


def part_main(prefix: str, measure_all, report) -> int:
    """A bench part run alone (`python bench/PART.py [--json OUT]`): measure_all in a temp dir removed afterwards
    (gigabytes), report's rows printed with their targets, the raw result written to OUT; exit 1 on a FAIL."""
    import json

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix=f"carry-bench-{prefix}-") as work:
        result = measure_all(Path(work))
    rows = report(result)
    print("\n".join(f"{m}: {v}" + (f"  target {t}  {'PASS' if ok else 'FAIL'}" if t else "") for m, v, t, ok in rows))
    if options.json:
        options.json.write_text(json.dumps(result, indent=2))
    return 1 if any(ok is False for _, _, t, ok in rows if t) else 0


class Parser(argparse.ArgumentParser):
    """A bench part's options when it runs alone (`python bench/NAME.py`), --keep DIR among them; bad input is one
    line (argparse's usage left out), exit 2."""

    def __init__(self, name: str, doc: str):
        super().__init__(prog=f"bench/{name}.py", description=doc.split("\n\n")[0])
        self.add_argument("--keep", type=Path, help="work in this (new) directory and keep it")

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def alone(name: str, keep: Path | None, check: Callable[[], None], body: Callable[[Path], T]) -> T:
    """A bench part run alone: check() (bad input: before anything is written), then body(work) in `keep` (made,
    and kept) or in a temp dir removed afterwards; SIGTERM stops it as an exception does (its clusters, servers and
    builds stopped on the way out); carry's errors (bad input) are one line on stderr and their exit code."""
    from carry.util.errors import CarryError

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        check()
        work = keep or Path(tempfile.mkdtemp(prefix=f"carry-bench-{name}-"))
        work.mkdir(parents=True, exist_ok=True)
        try:
            return body(work)
        finally:
            if keep is None:
                shutil.rmtree(work, ignore_errors=True)
    except CarryError as exc:
        print(f"bench/{name}.py: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


def part(name: str, check: Callable[[], None], body: Callable[[], T]) -> T:
    """bench/run.py's part NAME: check(), then body(); carry's errors (bad input) stop the bench in one line."""
    from carry.util.errors import CarryError

    try:
        check()
        return body()
    except CarryError as exc:
        raise SystemExit(f"bench: {name}: {exc}") from None


def report(header: str, rows: list[tuple], after: str = "") -> int:
    """A part's header, its rows (section, measure, value, target, ok) as bench/run.py's table, `after`, and the
    PASS and FAIL counts; the exit status: 1 on a FAIL."""
    import run

    failed = sum(r[4] is False for r in rows)
    print(f"{header}\n\n{run.table([run.Row(*r) for r in rows])}{after}")
    print(f"\n{sum(r[4] is True for r in rows)} PASS, {failed} FAIL")
    return 1 if failed else 0
