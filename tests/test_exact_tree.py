"""A wheel holds exactly the patched tree: no output of an earlier build survives into the next wheel, a file
changed after the build fails `verify`, a file the build writes must be listed, and a native wheel refuses
shared objects of another CPU than its tag. Real upstreams in tmp dirs, the real demo, real builds."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from carry import wheelzip
from helpers import ROOT, Upstream, carry, git, write_config
from carry.platforms import Platform

pytestmark = pytest.mark.slow

SETUP_PY = '''\
import os
from pathlib import Path
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


class Binary(Distribution):
    """A package shipping a prebuilt shared object: its wheel is tagged for this platform."""

    def has_ext_modules(self):
        return bool(list(Path("tinyup").glob("*.so")))


class Build(build_py):
    def run(self):
        super().run()
        if os.environ.get("WRITE_EXTRA"):
            Path(self.build_lib, "tinyup", "_extra.py").write_text("EXTRA = 1\\n")


setup(version=os.environ.get("TINYUP_VERSION", "0.1"), packages=find_packages(),
      package_data={"tinyup": ["*.so"]}, cmdclass={"build_py": Build}, distclass=Binary)
'''
FILES = {
    "setup.py": SETUP_PY,
    "pyproject.toml": '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
                      '[project]\nname = "tinyup"\ndynamic = ["version"]\n',
    "tinyup/__init__.py": '"""tiny upstream"""\n',
    "tinyup/engine.py": "def step():\n    return 1\n",
}
BUILD = """build:
  cuda_arches: []
  wheel_version: "0.1+carry.{version}"
  version_env: [TINYUP_VERSION]
  build_isolation: false
  compiler_cache: none
"""


@pytest.fixture
def tiny(tmp_path):
    upstream = Upstream.create(tmp_path / "upstream", FILES)
    config = write_config(tmp_path / "project", str(upstream.path), upstream.head(), extra=BUILD)
    (config.parent / "VERSION").write_text("20261201.1\n")
    return upstream, config, {"CARRY_CACHE": str(tmp_path / "cache")}, tmp_path / "dist"


def _members(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_a_file_an_earlier_series_added_is_not_in_the_next_wheel(tiny):
    upstream, config, env, dist = tiny
    patch = upstream.make_patch(config.parent / "patches" / "0001-add-probe.patch", "Add a probe",
                                {"tinyup/carry_stale_probe.py": "PROBE = True\n"})
    first = carry("--config", str(config), "wheel", "--out", str(dist / "one"), env=env)
    assert first.code == 0, first.err
    assert "tinyup/carry_stale_probe.py" in _members(Path(first.out.strip()))
    patch.unlink()
    second = carry("--config", str(config), "wheel", "--out", str(dist / "two"), env=env)
    assert second.code == 0, second.err
    assert "tinyup/carry_stale_probe.py" not in _members(Path(second.out.strip()))
    assert "removed" in second.err and "earlier build output(s)" in second.err
    assert "tree check passed: 2 identical to tree" in second.err
    verified = carry("--config", str(config), "verify", second.out.strip(), env=env)
    assert verified.code == 0, verified.out + verified.err


def test_a_wheel_changed_after_the_build_fails_verify_naming_the_file(tiny, tmp_path):
    upstream, config, env, dist = tiny
    built = carry("--config", str(config), "wheel", "--out", str(dist), env=env)
    assert built.code == 0, built.err
    wheel = Path(built.out.strip())
    # RECORD is rewritten to match, so only a comparison with the patched tree can tell.
    tampered = tmp_path / "tampered" / wheel.name
    tampered.parent.mkdir()
    wheelzip.rewrite(wheel, tampered, {"tinyup/engine.py": b"def step():\n    return 2\n",
                                       "tinyup/backdoor.py": b"OPEN = True\n"})
    result = carry("--config", str(config), "verify", str(tampered), env=env)
    assert result.code == 1, result.out + result.err
    assert "FAIL tinyup/engine.py: differs from tinyup/engine.py in the patched tree" in result.out
    assert "FAIL tinyup/backdoor.py: in the wheel but not in the patched tree" in result.out
    assert "NOT verified" in result.out


def test_a_file_the_build_writes_must_be_listed_as_generated(tiny):
    upstream, config, env, dist = tiny
    env = {**env, "WRITE_EXTRA": "1"}
    refused = carry("--config", str(config), "wheel", "--out", str(dist), env=env)
    assert refused.code == 1, refused.err
    assert "FAIL tinyup/_extra.py: in the wheel but not in the patched tree" in refused.err
    assert "list it in build.generated" in refused.err and not dist.exists()
    config.write_text(config.read_text() + "  generated:\n    tinyup/_extra.py: setup.py's build_py writes it\n")
    built = carry("--config", str(config), "wheel", "--out", str(dist), env=env)
    assert built.code == 0, built.err
    assert "1 generated by the build" in built.err


def test_a_native_wheel_refuses_shared_objects_of_another_cpu(tiny):
    upstream, config, env, dist = tiny
    foreign = Platform.LINUX_ARM64 if Platform.native() is Platform.LINUX_AMD64 else Platform.LINUX_AMD64
    pin = upstream.head()
    (upstream.path / "tinyup" / "_helper.so").write_bytes(foreign.elf_header() + bytes(64))
    git(upstream.path, "add", "-A")
    git(upstream.path, "commit", "-q", "-m", "ship a prebuilt helper")
    config.write_text(config.read_text().replace(f"commit: {pin}", f"commit: {upstream.head()}"))
    result = carry("--config", str(config), "wheel", "--out", str(dist), env=env)
    assert result.code == 1, result.err
    assert (f"FAIL tinyup/_helper.so is {foreign.machine} code (ELF e_machine {foreign.e_machine}), not "
            f"{Platform.native().machine}") in result.err
    assert not dist.exists()


def test_the_demo_drops_a_module_of_an_earlier_series(tmp_path):
    """The issue's own case: a patch creating pledemo/carry_stale_probe.py, built, dropped, built again."""
    demo = tmp_path / "demo"
    shutil.copytree(ROOT / "examples" / "demo", demo, ignore=shutil.ignore_patterns("upstream"))
    env = {"CARRY_CACHE": str(tmp_path / "cache")}
    probe = demo / "patches" / "0003-add-a-stale-probe.patch"
    probe.write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: carry tests <tests@carry.invalid>\nDate: Tue, 1 Dec 2026 00:00:00 +0000\n"
        "Subject: [PATCH] add a probe module\n\n---\n"
        "diff --git a/pledemo/carry_stale_probe.py b/pledemo/carry_stale_probe.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/pledemo/carry_stale_probe.py\n@@ -0,0 +1 @@\n+PROBE = True\n")
    first = carry("--config", str(demo / "build.yaml"), "wheel", "--out", str(tmp_path / "one"), env=env)
    assert first.code == 0, first.err
    assert "pledemo/carry_stale_probe.py" in _members(Path(first.out.strip()))
    probe.unlink()
    second = carry("--config", str(demo / "build.yaml"), "wheel", "--out", str(tmp_path / "two"), env=env)
    assert second.code == 0, second.err
    assert "pledemo/carry_stale_probe.py" not in _members(Path(second.out.strip()))
    assert "kept build/temp.*" in second.err and "0 hit(s)" not in second.err  # objects survive for the cache


def test_a_build_dir_of_an_older_layout_is_replaced(tiny):
    """A build dir made before it was a git worktree (a plain directory) is replaced, not built in."""
    upstream, config, env, dist = tiny
    first = carry("--config", str(config), "wheel", "--out", str(dist), env=env)
    assert first.code == 0, first.err
    (src,) = (Path(env["CARRY_CACHE"]) / "build").glob("*/src")
    (src / ".git").unlink()
    (src / "tinyup" / "leftover.py").write_text("OLD = True\n")
    shutil.rmtree(Path(env["CARRY_CACHE"]) / "artifacts")
    again = carry("--config", str(config), "wheel", "--out", str(dist), env=env)
    assert again.code == 0, again.err
    assert (src / ".git").is_file() and not (src / "tinyup" / "leftover.py").exists()
    assert "tinyup/leftover.py" not in _members(Path(again.out.strip()))
