"""The image's layer cache on a second Docker engine state: the scale upstream's image built cold and pushed with
BuildKit's inline cache (`image --cache-to inline`), then the engine emptied (images other than the bases and the
whole build cache, cache mounts included) and the same VERSION rebuilt by a new runner (fresh CARRY_CACHE at
another path) with `--cache-from inline`.

Both builds run on a second dockerd of the bench's own (tests/secondengine.py), so the shared engine's cache is
neither used nor wiped, and --hermetic from one wheelhouse downloaded beforehand (so PyPI's speed is not in
either time). Compiles are ccache's misses in the build stage (an empty cache mount: every unit compiles),
read from BuildKit's log; the rebuild's build stage step must be CACHED, with no compile at all.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib

import measure
import scale

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the second engine and the test services' facts

import dockerenv  # noqa: E402
import secondengine  # noqa: E402
from carry.image.buildkit import container  # noqa: E402

BUILD_PY = ROOT / "build.py"
COMPILES_RE = re.compile(r"\] cache: ccache(?: \(auto\))?: (\d+) compile\(s\), (\d+) hit\(s\).*?, (\d+) miss")
LOG_RE = re.compile(r"] build: linux/\S+ .*; log (\S+)$", re.M)


def _wheelhouse(dest: Path) -> Path:
    requirements = container.build_requirements(tomllib.loads(scale.PYPROJECT))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "-d",
            str(dest),
            *requirements,
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench: pip download of the build requirements failed:\n{done.stderr[-2000:]}")
    return dest


def _image(config: Path, env: dict[str, str], *args: str) -> tuple[measure.Measured, str]:
    """One `image` run and its BuildKit log."""
    run = measure.run(
        [sys.executable, str(BUILD_PY), "--config", str(config), "image", "--hermetic", *args], env
    ).check()
    return run, Path(LOG_RE.search(run.err).group(1)).read_text()


def bench(work: Path, units: int, row) -> list:
    """Rows for the layer cache; `row` makes a table row (section, measure, value, target, ok)."""
    try:
        facts = dockerenv.load()
    except LookupError as exc:
        raise SystemExit(
            f"bench: image part needs the test registry and bases ({exc}); {dockerenv.SETUP_HINT}"
        ) from exc
    problem = secondengine.problem()
    if problem:
        raise SystemExit(f"bench: image part needs a second dockerd: {problem}")
    base = work / "image"
    project = scale.generate(base, units, variants=1, nvcc_threads=len(scale.ARCHES.split(",")))
    name = f"{facts.registry}/carry-bench-{os.urandom(3).hex()}"
    dockerenv.set_image_section(project.config, facts.image_section(name))
    wheelhouse = _wheelhouse(base / "wheelhouse")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARRY_", "CCACHE_", "SCCACHE_", "DOCKER_"))}
    env.update(
        CARRY_DOCKER=dockerenv.DOCKER_CLI,
        DOCKER_CONFIG=str(base / "docker-config"),
        CARRY_REGISTRY_USER=facts.registry_user,
        CARRY_REGISTRY_PASSWORD=facts.registry_password(),
    )
    with secondengine.started((facts.build_base, facts.runtime_base), facts.docker_host) as engine:
        env["DOCKER_HOST"] = engine.host
        runner_a = {**env, "CARRY_CACHE": str(base / "runner-a" / "cache")}
        cold, cold_log = _image(project.config, runner_a, "--wheelhouse", str(wheelhouse), "--cache-to", "inline")
        pushed, _ = _image(project.config, runner_a, "--wheelhouse", str(wheelhouse), "--cache-to", "inline", "--push")
        engine.empty()
        emptied = engine.counts()
        runner_b = {**env, "CARRY_CACHE": str(base / "machine-b" / "home" / "ci" / ".cache" / "carry")}
        warm, warm_log = _image(project.config, runner_b, "--wheelhouse", str(wheelhouse), "--cache-from", "inline")
    compiled = COMPILES_RE.search(cold_log)
    if compiled is None or "build stage: ran build.py wheel" not in cold.err:
        raise SystemExit(f"bench: the cold image build did not compile in its build stage:\n{cold.err[-2000:]}")
    nvcc_cold = int(compiled.group(3))
    recompiled = COMPILES_RE.search(warm_log)
    nvcc_warm = int(recompiled.group(3)) if recompiled else 0
    skipped = "build stage: cached, nothing compiled" in warm.err
    ratio = warm.wall_s / cold.wall_s
    return [
        row(
            "image",
            f"cold image, empty engine ({units} .cu units, --hermetic)",
            f"{cold.wall_s:.1f} s, {nvcc_cold} compiles in the build stage; push with the inline cache "
            f"{pushed.wall_s:.1f} s",
        ),
        row(
            "image",
            "second engine state (no images, no build cache), --cache-from inline",
            f"{warm.wall_s:.1f} s = {100 * ratio:.1f}% of cold, {nvcc_warm} compiles, build stage "
            f"{'CACHED' if skipped else 'ran'} (engine before: {emptied.get('Images')} images, "
            f"{emptied.get('Build Cache')} cache entries)",
            "0 compiles, <= 25% of cold",
            skipped and nvcc_warm == 0 and ratio <= 0.25,
        ),
    ]
