"""The arm64 (GB10) wheel built on this x86-64 machine under QEMU, against the same build natively.

The demo is built in the Dockerfile's build stage twice, cold, for arch 12.1 only: once as linux/amd64 (this
machine's own CPU) and once as linux/arm64 (emulated); then the arm64 build is run again (BuildKit's cache).
"Cold": a VERSION no earlier run used (so BuildKit runs the build step again) and the compiler cache off (so every
.cu file is compiled); the demo's bases come from `.ci/base-images.sh`. Besides the whole command, the compile
phase is read from carry's own progress lines inside the build stage (`build:` to `gate:`).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import measure

ROOT = Path(__file__).resolve().parent.parent
BUILD_PY = ROOT / "build.py"
PHASE_RE = re.compile(r"\[\s*([0-9.]+)s\] (build|gate):")


def demo_copy(work: Path) -> Path:
    """The demo with a fresh VERSION and no compiler cache: every build below compiles every unit."""
    project = work / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project)
    (project / "VERSION").write_text(time.strftime("%Y%m%d.", time.gmtime()) + str(int(time.time()) % 100000) + "\n")
    config = project / "build.yaml"
    config.write_text(config.read_text().replace("compiler_cache: auto", "compiler_cache: none"))
    return config


def build(config: Path, env: dict[str, str], platform: str, dist: Path) -> tuple[measure.Measured, float | None]:
    """`wheel --platform P --hermetic --arch 12.1`; (the run, seconds of the compile phase in the build stage)."""
    argv = [
        sys.executable,
        str(BUILD_PY),
        "--config",
        str(config),
        "wheel",
        "--platform",
        platform,
        "--hermetic",
        "--arch",
        "12.1",
        "--out",
        str(dist),
    ]
    run = measure.run(argv, env).check()
    log = re.search(r"log (\S+)$", next(line for line in run.err.splitlines() if "] build:" in line))
    phases = dict((name, float(at)) for at, name in PHASE_RE.findall(Path(log.group(1)).read_text()))
    compile_s = phases["gate"] - phases["build"] if {"build", "gate"} <= phases.keys() else None
    return run, compile_s


def bench(work: Path, row) -> list:
    """Rows for the emulated arm64 build; `row` makes a table row (section, measure, value, target, ok)."""
    config = demo_copy(work / "arm64")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARRY_", "CCACHE_", "SCCACHE_"))}
    env.update(
        CARRY_CACHE=str(work / "arm64" / "cache"), CARRY_DOCKER=os.environ.get("CARRY_DOCKER", "/usr/bin/docker")
    )
    dist = work / "arm64" / "dist"
    native, native_compile = build(config, env, "linux/amd64", dist)
    emulated, emulated_compile = build(config, env, "linux/arm64", dist)
    rerun, _ = build(config, env, "linux/arm64", dist)
    whole = emulated.wall_s / native.wall_s
    compiled = (
        f"; compile phase {emulated_compile:.1f} s vs {native_compile:.1f} s = {emulated_compile / native_compile:.1f}x"
        if emulated_compile and native_compile
        else ""
    )
    return [
        row("arm64", "build stage, linux/amd64 (native), cold", f"{native.wall_s:.1f} s for the demo, arch 12.1"),
        row(
            "arm64", "build stage, linux/arm64 (QEMU), cold", f"{emulated.wall_s:.1f} s = {whole:.1f}x native{compiled}"
        ),
        row(
            "arm64",
            "build stage, linux/arm64, rerun (BuildKit cache)",
            f"{rerun.wall_s:.1f} s = {100 * rerun.wall_s / emulated.wall_s:.1f}% of its cold build",
            "<= 10% of cold",
            rerun.wall_s <= 0.10 * emulated.wall_s,
        ),
    ]
