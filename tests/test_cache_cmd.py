"""`cache` and `cache prune` on a cache filled by real carry runs: two small real upstreams built into Python-only
wheels in carry's own build environments (uv), a series change that leaves an old environment and wheel behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import Upstream, carry, write_config

pytestmark = pytest.mark.slow

PYPROJECT = """[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
dynamic = ["version"]
"""
SETUP_PY = "import os\nfrom setuptools import setup\nsetup(version=os.environ['TINY_VERSION'])\n"
BUILD = """build:
  cuda_arches: []
  wheel_version: "0.1.0+carry.{version}"
  version_env: [TINY_VERSION]
  build_isolation: false
  compiler_cache: none
"""
HOLDER = """import sys, time, filelock
lock = filelock.FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


def make_project(root: Path, name: str) -> tuple[Path, Upstream]:
    files = {"pyproject.toml": PYPROJECT.format(name=name), "setup.py": SETUP_PY, f"{name}/__init__.py": "X = 1\n"}
    upstream = Upstream.create(root / f"{name}-upstream", files)
    config = write_config(root / name, str(upstream.path), upstream.head(), extra=BUILD)
    (config.parent / "VERSION").write_text("20261201.1\n")
    return config, upstream


def entries(cache: Path) -> dict[str, list[str]]:
    return {
        part: sorted(p.name for p in (cache / part).iterdir()) if (cache / part).is_dir() else []
        for part in ("mirrors", "bundles", "build", "envs", "artifacts")
    }


def snapshot(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if "locks" not in p.parts)


@pytest.fixture
def filled(tmp_path):
    """Project a built twice (the second time with a patch and another build environment) and project b once."""
    cache = tmp_path / "cache"
    # a download store of its own: `cache prune` prunes $CARRY_DOWNLOADS too, and the suite points that at the
    # machine's store (tests/conftest.py), which a prune for these two configs would empty
    env = {"CARRY_CACHE": str(cache), "CARRY_DOWNLOADS": str(cache / "downloads")}
    config_a, upstream_a = make_project(tmp_path, "tinya")
    config_b, _ = make_project(tmp_path, "tinyb")
    for config in (config_a, config_b):
        built = carry("--config", str(config), "wheel", "--out", str(tmp_path / "dist"), env=env)
        assert built.code == 0, built.err
    first = entries(cache)
    upstream_a.make_patch(config_a.parent / "patches" / "0001-two.patch", "Two", {"tinya/__init__.py": "X = 2\n"})
    config_a.write_text(config_a.read_text() + "  environment:\n    requires: [packaging]\n")
    (config_a.parent / "VERSION").write_text("20261201.2\n")  # another series: another VERSION
    built = carry("--config", str(config_a), "wheel", "--out", str(tmp_path / "dist"), env=env)
    assert built.code == 0, built.err
    now = entries(cache)
    assert len(now["envs"]) == 2 and len(now["artifacts"]) == 3 and len(now["mirrors"]) == 2
    old_env = next(name for name in now["envs"] if name in first["envs"])
    new_env = next(name for name in now["envs"] if name not in first["envs"])
    return cache, env, config_a, config_b, old_env, new_env, first


def test_cache_shows_each_part_with_hardlinks_counted_once(filled):
    cache, env, *_ = filled
    shown = carry("cache", env=env)
    assert shown.code == 0, shown.err
    for part in ("mirrors", "bundles", "build dirs", "environments", "wheels", "logs"):
        assert f"  {part} " in shown.out, shown.out
    assert "total" in shown.out and "hardlinked files counted once" in shown.out
    data = json.loads(carry("cache", "--json", env=env).out)
    assert data["total"] == sum(part["bytes"] for part in data["parts"]) > 0
    sizes = {part["name"]: part for part in data["parts"]}
    assert sizes["environments"]["entries"] == 2 and sizes["wheels"]["entries"] == 3
    assert sizes["environments"]["bytes"] > 1_000_000  # setuptools in each venv (hardlinked from uv's cache)
    # a second link to a cached wheel, inside the cache, adds no bytes
    wheel = next((cache / "artifacts").rglob("*.whl"))
    (cache / "tmp").mkdir(exist_ok=True)
    os.link(wheel, cache / "tmp" / wheel.name)
    again = json.loads(carry("cache", "--json", env=env).out)
    assert again["total"] == data["total"], (again["total"], data["total"], wheel.stat().st_size)


def test_prune_keeps_what_the_config_needs_and_skips_what_is_in_use(filled, tmp_path):
    cache, env, config_a, config_b, old_env, new_env, _ = filled
    before = entries(cache)

    dry = carry("cache", "prune", "--config", str(config_a), "--dry-run", env=env)
    assert dry.code == 0, dry.err
    assert f"would remove environment: {cache / 'envs' / old_env}" in dry.out
    assert "would remove mirror: " in dry.out and "would remove build dir: " in dry.out
    assert "to free" in dry.out.splitlines()[-1]
    assert entries(cache) == before

    # another process holds the old environment's lock: it stays, named as in use
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(cache / "locks" / f"env-{old_env}.lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        pruned = carry("cache", "prune", "--config", str(config_a), env=env)
    finally:
        holder.kill()
        holder.wait()
    assert pruned.code == 0, pruned.err
    assert f"skipped environment: {cache / 'envs' / old_env} (in use: another carry holds its lock)" in pruned.out
    after = entries(cache)
    assert after["envs"] == sorted([old_env, new_env])
    assert len(after["mirrors"]) == 1 and len(after["bundles"]) == 1  # b's mirror and bundle went
    assert len(after["artifacts"]) == 1  # a's wheel of its current tree; a's old tree and b's went
    assert sorted(after["build"]) == [name for name in before["build"] if name.startswith("tinya")]
    last = pruned.out.splitlines()[-1]
    assert last.startswith("removed ") and "freed" in last and "in use, skipped" in last
    assert not list(cache.rglob(".carry-prune-*"))  # nothing half-deleted left

    # the kept wheel is the one `wheel` reuses: nothing is rebuilt
    rebuilt = carry("--config", str(config_a), "wheel", "--out", str(tmp_path / "dist"), env=env)
    assert rebuilt.code == 0 and "cache: hit" in rebuilt.err and "env: making" not in rebuilt.err

    # released, the old environment goes too; then nothing is left to prune
    pruned = carry("cache", "prune", "--config", str(config_a), env=env)
    assert f"removed environment: {cache / 'envs' / old_env}" in pruned.out
    assert entries(cache)["envs"] == [new_env]
    settled = carry("cache", "prune", "--config", str(config_a), "--config", str(config_b), env=env)
    assert settled.out.splitlines()[-1].startswith("removed 0 entries"), settled.out


def test_prune_with_every_config_removes_only_the_old_tree(filled):
    cache, env, config_a, config_b, old_env, new_env, _ = filled
    pruned = carry("cache", "prune", "--config", str(config_a), "--config", str(config_b), env=env)
    assert pruned.code == 0, pruned.err
    after = entries(cache)
    assert len(after["mirrors"]) == 2 and len(after["artifacts"]) == 2
    # b was built in the same environment a used before its change: b still needs it
    assert after["envs"] == sorted([old_env, new_env])
    assert "removed wheel: " in pruned.out and "removed environment" not in pruned.out


def test_prune_of_a_missing_config_is_bad_input(filled, tmp_path):
    cache, env, *_ = filled
    before = snapshot(cache)
    missing = carry("cache", "prune", "--config", str(tmp_path / "nope.yaml"), env=env)
    assert missing.code == 2 and "config file not found" in missing.err
    assert len(missing.err.strip().splitlines()) == 1
    assert snapshot(cache) == before
