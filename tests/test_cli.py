"""The installed `carry` command is the same CLI as `python build.py`: installed with pip into a fresh venv, run
from outside the checkout, same output and exit codes. (What the light commands load: tests/test_spine.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT, carry

DEMO_CONFIG = ROOT / "examples" / "demo" / "build.yaml"


@pytest.fixture(scope="module")
def installed(installed_carry) -> Path:
    """carry installed (not editable) into a fresh venv, once per run (tests/conftest.py): its `carry` script."""
    return installed_carry.script


def run_installed(script: Path, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(script), *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "args, code",
    [
        (("--help",), 0),
        (("check", "--help"), 0),
        (("--config", str(DEMO_CONFIG), "version"), 0),
        (("--config", str(DEMO_CONFIG), "check"), 0),
        (("--config", str(DEMO_CONFIG), "check", "--json"), 0),
        (("--config", "/nonexistent/build.yaml", "check"), 2),
        (("--config", str(DEMO_CONFIG), "wheel", "--arch", "12.7"), 2),
        (("no-such-command",), 2),
    ],
)
def test_installed_carry_is_the_same_cli_as_build_py(installed, tmp_path, args, code):
    env = {"CARRY_CACHE": str(tmp_path / "cache")}
    ours = run_installed(installed, *args, cwd=tmp_path, env=env)
    theirs = carry(*args, cwd=tmp_path, env=env)
    assert (ours.returncode, ours.stdout, ours.stderr) == (theirs.code, theirs.out, theirs.err)
    assert "Traceback" not in ours.stderr
    assert ours.returncode == code, ours.stderr
    if args == ("--config", str(DEMO_CONFIG), "check"):
        assert "clean" in ours.stdout
    if args[0] == "--help":
        assert ours.stdout.startswith("Usage: carry ")


def test_installed_carry_runs_the_installed_package(installed, tmp_path):
    """Not the checkout's modules by accident: the venv's carry package answers."""
    python = installed.parent / "python"
    where = subprocess.run(
        [str(python), "-c", "import carry, json; print(json.dumps(carry.__file__))"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(installed.parent.parent) in json.loads(where)
