"""Two runs at once on one cache, for the commands that build images (docs/reliability.md, "Cache and disk"):
`image` twice (the Dockerfile path, --hermetic) and `lock` beside a locked `image`, on small real upstreams made
here (Python-only; the locked one requires idna), built for linux/amd64 into the local engine (nothing is pushed);
and `lock` on a full disk (a tmpfs under runtime-lock/).
Both runs succeed; where one must wait (one image build of a tree per cache at a time; one build of a wheel) it says
so; every cache entry they share is whole afterwards (the bundle and the wheel by their recorded sha256, the
wheelhouse's wheels by their own zip checks); and a run after them gives the same image layers. `wheel` twice is in
tests/test_concurrency.py."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import uuid
import zipfile
from pathlib import Path

import pytest

import dockerenv
from carry.util import integrity
from helpers import Upstream, carry, write_config
from test_concurrency import run_together
from test_faults_cache import error_line, tmpfs

pytestmark = [pytest.mark.docker]

PYPROJECT = """[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
dynamic = ["version"]
{dependencies}
"""
SETUP_PY = "import os\nfrom setuptools import setup\nsetup(version=os.environ['MINIRUNS_VERSION'])\n"
BUILD = """build:
  cuda_arches: []
  wheel_version: "0.1.0+carry.{version}"
  version_env: [MINIRUNS_VERSION]
  build_isolation: false
  compiler_cache: none
"""
INIT = "import importlib.metadata\n__version__ = importlib.metadata.version({name!r})\n"
WAITED = "waiting for another carry run, which holds the lock "


def make_project(root: Path, name: str, image: str, dependencies: str = "") -> tuple[Path, dict[str, str], Path]:
    """The project under `root`, which becomes the working directory (a locked image puts its wheel in ./dist)."""
    files = {
        "pyproject.toml": PYPROJECT.format(name=name, dependencies=dependencies),
        "setup.py": SETUP_PY,
        f"{name}/__init__.py": INIT.format(name=name),
    }
    upstream = Upstream.create(root / "upstream", files)
    config = write_config(root / "project", str(upstream.path), upstream.head(), extra=BUILD + image)
    (config.parent / "VERSION").write_text("20261201.1\n")
    cache = root / "cache"
    return config, {"CARRY_CACHE": str(cache), "SOURCE_DATE_EPOCH": "1767225600"}, cache


def layers(ref: str) -> list[str]:
    inspected = subprocess.run(
        [dockerenv.DOCKER_CLI, "image", "inspect", ref], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(inspected)[0]["RootFS"]["Layers"]


def assert_cache_whole(cache: Path, commit: str) -> None:
    """Every entry two runs shared is whole: the bundle by its sha256, each cached wheel by its own, the
    wheelhouse's wheels as zips; no scratch dir left behind."""
    bundle = cache / "bundles" / f"{commit}.bundle"
    assert integrity.check(bundle) is None
    for wheel in (cache / "artifacts").glob("*/*.whl"):
        assert integrity.check(wheel) is None, wheel
    for wheel in (cache / "wheelhouse").glob("*/*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            assert archive.testzip() is None, wheel
    assert [p.name for p in (cache / "tmp").iterdir()] == [] if (cache / "tmp").is_dir() else True


def test_two_image_runs_at_once_one_waits_and_says_so(tmp_path, monkeypatch):
    env = dockerenv.require()
    monkeypatch.chdir(tmp_path)
    name = f"carry-test/faults-runs-{uuid.uuid4().hex[:8]}"
    image = (
        f"image:\n  name: {name}\n  platforms:\n    linux/amd64:\n      base_image: {env.build_base}\n"
        f"      runtime_image: {env.runtime_base}\n"
    )
    config, carry_env, cache = make_project(tmp_path, "miniruns", image)
    try:
        first, second = run_together(config, carry_env, [("image", "--hermetic"), ("image", "--hermetic")])
        for result in (first, second):
            assert result.code == 0, result.err[-3000:]
            assert "Traceback" not in result.err
        waited = [r for r in (first, second) if WAITED in r.err]
        assert len(waited) == 1, (first.err[-2000:], second.err[-2000:])
        lock = next(line for line in waited[0].err.splitlines() if WAITED in line).split(WAITED)[1]
        assert Path(lock).parent == cache / "locks" and Path(lock).name.startswith("image-")
        commit = config.read_text().split("commit: ", 1)[1].split()[0]
        assert_cache_whole(cache, commit)
        built = layers(f"{name}:20261201.1")
        again = carry("--config", str(config), "image", "--hermetic", env=carry_env)
        assert again.code == 0 and WAITED not in again.err, again.err[-3000:]
        assert layers(f"{name}:20261201.1") == built
    finally:
        dockerenv.forget(name)


def test_lock_and_a_locked_image_at_once_both_succeed_on_one_cache(tmp_path, monkeypatch):
    env = dockerenv.require()
    monkeypatch.chdir(tmp_path)  # the locked image's fixed wheel goes into ./dist
    name = f"carry-test/faults-lock-{uuid.uuid4().hex[:8]}"
    image = (
        f"image:\n  name: {name}\n  platforms:\n    linux/amd64: {{runtime_image: {env.runtime_base}}}\n"
        f"  lock: runtime-lock\n"
    )
    config, carry_env, cache = make_project(tmp_path, "minilocked", image, 'dependencies = ["idna>=3.4"]')
    lock_file = config.parent / "runtime-lock" / "linux-amd64.txt"
    try:
        made = carry("--config", str(config), "lock", env=carry_env)
        assert made.code == 0, made.err
        before = lock_file.read_bytes()
        shutil.rmtree(cache / "artifacts")  # the fixed wheel `lock` built: both runs below need it, one builds it
        locked, imaged = run_together(config, carry_env, [("lock", "--upgrade"), ("image", "--json")])
        assert locked.code == 0, locked.err[-3000:]
        assert imaged.code == 0, imaged.err[-3000:]
        assert lock_file.read_bytes() == before  # resolved again: the same bytes, written whole
        (platform,) = json.loads(imaged.out)["platforms"]
        assert platform["platform"] == "linux/amd64" and "import minilocked" in platform["smoke"]
        assert len(list((cache / "artifacts").glob("*/*.whl"))) == 1  # one fixed wheel, built once
        commit = config.read_text().split("commit: ", 1)[1].split()[0]
        assert_cache_whole(cache, commit)
        again = carry("--config", str(config), "image", "--json", env=carry_env)
        assert again.code == 0, again.err[-3000:]
        assert [layer["diff_id"] for layer in json.loads(again.out)["platforms"][0]["layers"]] == [
            layer["diff_id"] for layer in platform["layers"]
        ]
    finally:
        dockerenv.forget(name)


def test_a_lock_on_a_full_disk_writes_nothing_and_the_rerun_after_freeing_writes_it(tmp_path, monkeypatch):
    env = dockerenv.require()
    monkeypatch.chdir(tmp_path)
    image = (
        f"image:\n  name: carry-test/faults-full-lock\n  platforms:\n    linux/amd64: {{runtime_image: "
        f"{env.runtime_base}}}\n  lock: runtime-lock\n"
    )
    config, carry_env, _ = make_project(tmp_path, "minifull", image, 'dependencies = ["idna>=3.4"]')
    with tmpfs(config.parent / "runtime-lock", "8k") as locks:
        filler = locks / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as handle:  # the disk filled up to its last byte
            while True:
                handle.write(b"\0" * 1024)
                handle.flush()
        full = carry("--config", str(config), "lock", env=carry_env)
        assert full.code == 1, full.err[-3000:]
        line = error_line(full.err)
        assert line.startswith(f"carry: error: {locks / 'linux-amd64.txt'}: no space left on device: needs ")
        assert line.endswith(" B free there; free some space (or point CARRY_CACHE / --out elsewhere) and run again")
        assert sorted(p.name for p in locks.iterdir()) == ["filler"]  # no lock, no temp file
        filler.unlink()
        rerun = carry("--config", str(config), "lock", env=carry_env)
        assert rerun.code == 0, rerun.err[-3000:]
        checked = carry("--config", str(config), "lock", "--check", env=carry_env)
        assert checked.code == 0 and checked.out.splitlines() == ["linux/amd64: fresh"], checked.out + checked.err
