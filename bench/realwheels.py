"""carry on the real vLLM 0.33.0: the gate on its released wheels, and the fixed wheel built in precompiled mode
(examples/vllm) against what it replaces.

- gate: `build.py gate` on the 336 MB x86_64 and 333 MB aarch64 wheels, the whole process (median of 3).
- precompiled, x86_64: carry's `wheel` with a fresh CARRY_CACHE (the build environment made from uv's cache)
  against a hand-run `VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_LOCATION=… pip wheel --no-build-isolation
  --no-deps .` of the same patched tree in an environment of the same requirements plus pip; then carry's rerun.
- precompiled, aarch64 from this x86_64 machine: cold (another fresh CARRY_CACHE) and its rerun.
- for scale, the source build precompiled mode replaces, from vLLM's own reports (not measured here).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

import measure  # noqa: E402
import vllmbench  # noqa: E402

GATE_TARGET_S = 3.0
RATIO_TARGET = 1.2
RERUN_TARGET_S = 1.0
GATE_RUNS = 3
EXAMPLE = ROOT / "examples" / "vllm"


def _env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARRY_", "CCACHE_", "VLLM_"))}
    env["CARRY_CACHE"] = str(cache)
    env["CARRY_DOWNLOADS"] = measure.downloads()
    return env


def _releases() -> dict[str, Path]:
    from carry.source import releases

    files = releases.load(EXAMPLE / "releases.yaml")
    return {r.name: p for r, p in zip(files, releases.fetch(EXAMPLE / "releases.yaml", [r.name for r in files]))}


def bench_gate(work: Path, Row) -> list:
    paths = _releases()
    rows = []
    for name in ("vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl"):
        runs = [
            measure.carry(ROOT / "build.yaml", _env(work / "gate-cache"), "gate", str(paths[name]))
            for _ in range(GATE_RUNS)
        ]
        wall = measure.median([run.wall_s for run in runs])
        arch = "x86_64" if "x86_64" in name else "aarch64"
        rows.append(
            Row(
                "gate",
                f"`gate` on vLLM's {arch} wheel ({paths[name].stat().st_size / 1e6:.0f} MB, "
                f"13 .so), whole process, median of {GATE_RUNS}",
                f"{wall:.2f} s ({runs[0].out.splitlines()[0]})",
                f"<= {GATE_TARGET_S:.0f} s",
                wall <= GATE_TARGET_S,
            )
        )
    return rows


def bench_precompiled(work: Path, Row) -> list:
    paths = _releases()
    history = vllmbench.history(_env(work / "history"))["path"]
    project = work / "example-vllm"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("upstream.git", "__pycache__"))
    config = project / "build.yaml"
    config.write_text(config.read_text().replace("  url: upstream.git", f"  url: {history}"))
    x86 = paths["vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"]

    cold = measure.carry(config, _env(work / "x86"), "wheel", "--json", "--out", str(work / "dist-x86"))
    result = json.loads(cold.out)
    rerun = measure.carry(config, _env(work / "x86"), "wheel", "--out", str(work / "dist-x86"))
    hand = _hand_run(work, history, project, x86, _env(work / "x86"))
    arm_cold = measure.carry(
        config, _env(work / "arm"), "wheel", "--platform", "linux/arm64", "--out", str(work / "dist-arm")
    )
    arm_rerun = measure.carry(
        config, _env(work / "arm"), "wheel", "--platform", "linux/arm64", "--out", str(work / "dist-arm")
    )
    ratio = cold.wall_s / hand.wall_s
    return [
        Row(
            "precompiled",
            "examples/vllm: vLLM 0.33.0 + 2 Python-only patches, from the released wheels",
            f"{Path(result['wheel']).name}",
        ),
        Row(
            "precompiled", "hand-run VLLM_USE_PRECOMPILED=1 pip wheel, same requirements (+pip)", f"{hand.wall_s:.1f} s"
        ),
        Row(
            "precompiled",
            "carry `wheel` x86_64, fresh CARRY_CACHE (env from uv's cache, gate, tree check, stamp)",
            f"{cold.wall_s:.1f} s = {ratio:.2f}x the hand-run",
            f"<= {RATIO_TARGET}x",
            ratio <= RATIO_TARGET,
        ),
        Row(
            "precompiled",
            "carry `wheel` x86_64 rerun, nothing changed",
            f"{rerun.wall_s:.2f} s",
            f"<= {RERUN_TARGET_S:.0f} s",
            rerun.wall_s <= RERUN_TARGET_S,
        ),
        Row(
            "precompiled",
            "carry `wheel --platform linux/arm64` from x86_64 (no emulation), fresh CARRY_CACHE",
            f"{arm_cold.wall_s:.1f} s",
        ),
        Row(
            "precompiled",
            "  its rerun, nothing changed",
            f"{arm_rerun.wall_s:.2f} s",
            f"<= {RERUN_TARGET_S:.0f} s",
            arm_rerun.wall_s <= RERUN_TARGET_S,
        ),
        Row(
            "precompiled",
            "for scale: the source build it replaces (vLLM's reports, not measured here)",
            "32 min on a big x86 builder (vllm#40991), 20-30 min on a DGX Spark, 42 min on a GB300; hours on 2 cores",
        ),
    ]


def _hand_run(work: Path, history: str, project: Path, wheel: Path, env: dict[str, str]) -> measure.Measured:
    """vLLM's own precompiled build of the same patched tree, by hand, in the same requirements plus pip."""
    from carry.wheelbuild import buildenv

    tree = work / "hand" / "vllm"
    subprocess.run(["git", "clone", "--quiet", history, str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "checkout", "--quiet", "v0.33.0"], check=True)
    git_env = {**os.environ, "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@carry.invalid"}
    subprocess.run(
        ["git", "-C", str(tree), "am", "--quiet", *sorted(map(str, (project / "patches").glob("*.patch")))],
        check=True,
        env=git_env,
    )
    spec = buildenv.EnvSpec.resolve([*buildenv.requires_of(tree), "pip"])
    made = buildenv.ensure(spec, work / "hand" / "cache")
    hand_env = made.environ(
        {
            **env,
            "VLLM_USE_PRECOMPILED": "1",
            "VLLM_PRECOMPILED_WHEEL_LOCATION": str(wheel),
            "VLLM_TARGET_DEVICE": "cuda",
            "VLLM_VERSION_OVERRIDE": "0.33.0+hand",
        }
    )
    return measure.run(
        [
            str(made.python),
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--disable-pip-version-check",
            "-w",
            str(work / "hand" / "dist"),
            str(tree),
        ],
        hand_env,
    ).check()
