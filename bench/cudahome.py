"""A CUDA_HOME whose nvcc records every invocation (kind, time, CPU, peak memory) and then runs the real one.

Everything but bin/nvcc links to the real toolkit. The wrapper samples the resident memory of the real nvcc's
whole process tree (nvcc, cicc, ptxas, gcc ...) and writes one JSON line per call to a log.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

REAL_CUDA = Path(os.environ.get("BENCH_REAL_CUDA", "/usr/local/cuda"))
SAMPLE_S = 0.05

WRAPPER = '''\
#!@PYTHON@ -S
"""nvcc, recorded: one JSON line per call in @LOG@."""
import json, os, resource, subprocess, sys, time

PAGE = os.sysconf("SC_PAGE_SIZE")


def tree(pid):
    """pid and its descendants, from /proc/<pid>/task/*/children."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo.extend(int(child) for child in handle.read().split())
        except OSError:
            pass
    return found


def rss(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as handle:
                total += int(handle.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


args = sys.argv[1:]
start = time.monotonic()
child = subprocess.Popen(["@REAL@", *args])
peak = 0
while child.poll() is None:
    peak = max(peak, rss(tree(child.pid)))
    time.sleep(@SAMPLE@)
wall = time.monotonic() - start
children = resource.getrusage(resource.RUSAGE_CHILDREN)
own = resource.getrusage(resource.RUSAGE_SELF)
kind = "preprocess" if "-E" in args else "compile" if "-c" in args else "other"
source = next((a for a in args if a.endswith(".cu")), "")
record = {
    "kind": kind, "source": source, "rc": child.returncode, "wall_s": round(wall, 3),
    "cpu_s": round(children.ru_utime + children.ru_stime, 3),
    "wrapper_cpu_s": round(own.ru_utime + own.ru_stime, 3),
    "peak_rss": max(peak, children.ru_maxrss * 1024),
    "threads": args[args.index("--threads") + 1] if "--threads" in args else "1",
}
fd = os.open("@LOG@", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, (json.dumps(record) + "\\n").encode())
os.close(fd)
sys.exit(child.returncode)
'''


@dataclasses.dataclass(frozen=True)
class Call:
    kind: str
    source: str
    rc: int
    wall_s: float
    cpu_s: float
    wrapper_cpu_s: float
    peak_rss: int
    threads: str


@dataclasses.dataclass(frozen=True)
class RecordingCuda:
    home: Path
    log: Path

    def calls(self) -> list[Call]:
        if not self.log.exists():
            return []
        return [Call(**json.loads(line)) for line in self.log.read_text().splitlines() if line.strip()]


def make(directory: Path) -> RecordingCuda:
    """A CUDA_HOME under `directory` whose nvcc appends its record to directory/nvcc-calls.jsonl."""
    real = REAL_CUDA.resolve()
    if not (real / "bin" / "nvcc").exists():
        raise SystemExit(f"bench: no nvcc at {real}/bin/nvcc; set BENCH_REAL_CUDA to a CUDA toolkit")
    home = directory / "cuda"
    (home / "bin").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "bin":
            (home / entry.name).symlink_to(entry)
    for tool in (real / "bin").iterdir():
        if tool.name != "nvcc":
            (home / "bin" / tool.name).symlink_to(tool.resolve())
    log = directory / "nvcc-calls.jsonl"
    wrapper = home / "bin" / "nvcc"
    wrapper.write_text(
        WRAPPER.replace("@PYTHON@", sys.executable)
        .replace("@LOG@", str(log))
        .replace("@REAL@", str(real / "bin" / "nvcc"))
        .replace("@SAMPLE@", str(SAMPLE_S))
    )
    wrapper.chmod(0o755)
    return RecordingCuda(home, log)
