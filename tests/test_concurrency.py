"""Concurrent carry runs sharing one cache (and one dist): file locks keep them from racing.

Two `wheel` runs at once on the demo both succeed and publish the same bytes, built once (the second says it waits
on the first's lock); `image` twice and `lock` beside `image` are in tests/test_faults_runs.py. Concurrent fetches
into a fresh cache leave one consistent mirror and agree on the base.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import BUILD_PY, ROOT, carry

ARCHES = "9.0,12.1"
FETCH_ROUNDS = (2, 2, 2, 3, 4)


@dataclasses.dataclass
class Finished:
    code: int
    out: str
    err: str
    wheel_bytes: bytes | None = None


def start(config: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(BUILD_PY), "--config", str(config), *args],
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_together(
    config: Path, env: dict[str, str], commands: list[tuple[str, ...]], dist: Path | None = None, timeout: float = 600
) -> list[Finished]:
    """Start every command at once; when each exits, note its output and the bytes of the wheel it printed."""
    procs = [start(config, env, *command) for command in commands]
    results: list[Finished | None] = [None] * len(procs)
    deadline = time.monotonic() + timeout
    while any(r is None for r in results):
        assert time.monotonic() < deadline, "concurrent runs did not finish"
        for index, proc in enumerate(procs):
            if results[index] is None and proc.poll() is not None:
                out, err = proc.communicate()
                printed = Path(out.strip()) if out.strip().endswith(".whl") else None
                data = printed.read_bytes() if printed is not None and printed.is_file() else None
                results[index] = Finished(proc.returncode, out, err, data)
        time.sleep(0.02)
    return results


def git_fsck(repo: Path) -> None:
    fsck = subprocess.run(["git", "fsck", "--no-progress"], cwd=repo, capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


@pytest.fixture
def demo(tmp_path):
    shutil.copytree(ROOT / "examples" / "demo", tmp_path / "demo")
    (tmp_path / "demo" / "VERSION").write_text("20261101.2\n")
    return tmp_path / "demo" / "build.yaml", {"CARRY_CACHE": str(tmp_path / "cache")}, tmp_path


@pytest.mark.slow
def test_two_wheel_runs_at_once_share_cache_and_dist(demo):
    config, env, base = demo
    dist = base / "dist"
    command = ("wheel", "--arch", ARCHES, "--out", str(dist))
    first, second = run_together(config, env, [command, command])
    for result in (first, second):
        assert result.code == 0, result.err
        assert "Traceback" not in result.err
    assert first.out == second.out, "both runs must publish the same wheel"
    wheels = sorted(dist.glob("*.whl"))
    assert [str(w) for w in wheels] == [first.out.strip()]
    assert first.wheel_bytes == second.wheel_bytes == wheels[0].read_bytes()
    assert not [p for p in dist.iterdir() if p.name.startswith(".")], "no temp files left in dist"
    outcomes = sorted(r.err.strip().splitlines()[-1].split("done: ")[1] for r in (first, second))
    assert outcomes == ["built", "reused from cache"], "the lock must make the second run reuse the first's build"
    waited = [r for r in (first, second) if "waiting for another carry run, which holds the lock " in r.err]
    assert len(waited) == 1 and "done: reused from cache" in waited[0].err, "the second run says that it waits"
    artifacts = [p for p in (base / "cache" / "artifacts").iterdir() if not p.name.startswith(".")]
    assert len(artifacts) == 1 and (artifacts[0] / wheels[0].name).read_bytes() == wheels[0].read_bytes()
    verified = carry("--config", str(config), "verify", str(wheels[0]), env=env)
    assert verified.code == 0, verified.out + verified.err


@pytest.mark.slow
def test_two_wheel_runs_into_two_dists_publish_identical_bytes(demo):
    config, env, base = demo
    commands = [("wheel", "--arch", ARCHES, "--out", str(base / name)) for name in ("dist-a", "dist-b")]
    results = run_together(config, env, commands)
    for result in results:
        assert result.code == 0, result.err
    assert results[0].wheel_bytes is not None and results[0].wheel_bytes == results[1].wheel_bytes


@pytest.mark.parametrize("round_index", range(len(FETCH_ROUNDS)))
def test_concurrent_fetches_into_a_fresh_cache_agree(demo, round_index):
    config, env, base = demo
    runs = FETCH_ROUNDS[round_index]
    results = run_together(config, env, [("fetch",)] * runs)
    pin = config.read_text().split("commit: ", 1)[1].split()[0]
    for result in results:
        assert result.code == 0, result.err
        assert result.out.strip() == pin
    mirrors = [p for p in (base / "cache" / "mirrors").iterdir() if not p.name.startswith(".")]
    assert len(mirrors) == 1, mirrors
    git_fsck(mirrors[0])
    head = subprocess.run(["git", "rev-parse", "refs/carry/pin"], cwd=mirrors[0], capture_output=True, text=True)
    assert head.stdout.strip() == pin
    leftovers = [p for p in (base / "cache" / "mirrors").iterdir() if p.name.startswith(".")]
    assert leftovers == [], "a losing run must not leave its half-made mirror behind"


def test_fetch_and_check_at_once_on_a_fresh_cache(demo):
    config, env, base = demo
    fetched, checked = run_together(config, env, [("fetch",), ("check", "--json")])
    assert fetched.code == 0, fetched.err
    assert checked.code == 0, checked.err
    assert '"ok": true' in checked.out
    (mirror,) = [p for p in (base / "cache" / "mirrors").iterdir() if not p.name.startswith(".")]
    git_fsck(mirror)
