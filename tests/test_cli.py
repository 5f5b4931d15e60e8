"""The installed `carry` command is the same CLI as `python build.py`: installed with pip into a fresh venv, run
from outside the checkout, same output and exit codes. (What the light commands load: tests/test_spine.py.)"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from carry.cli.main import COMMANDS, cli
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


# --- carry/cli/: one module per command, loaded when it runs ------------------------------------------------------


def _top_level_commands() -> dict[str, tuple[str, str, click.Command]]:
    """Every command the modules of carry/cli/commands/ define, not counting a group's own subcommands:
    name -> (module, attribute, command)."""
    found = {}
    for path in sorted((ROOT / "carry" / "cli" / "commands").glob("[!_]*.py")):
        module = importlib.import_module(f"carry.cli.commands.{path.stem}")
        commands = {name: value for name, value in vars(module).items() if isinstance(value, click.Command)}
        nested = {
            id(sub) for value in commands.values() if isinstance(value, click.Group) for sub in value.commands.values()
        }
        for attribute, command in commands.items():
            if id(command) not in nested:
                assert command.name not in found, f"two commands named {command.name}"
                found[command.name] = (path.stem, attribute, command)
    return found


def test_the_command_table_names_every_command_module_and_its_short_help():
    found = _top_level_commands()
    assert sorted(COMMANDS) == sorted(found)
    for name, (module, attribute, short) in COMMANDS.items():
        assert (module, attribute) == found[name][:2], name
        command = cli.get_command(click.Context(cli), name)
        assert command is found[name][2]
        listed = click.Command(name, help=short)
        for limit in range(10, 140):  # what `--help` lists, at every terminal width
            assert listed.get_short_help_str(limit) == command.get_short_help_str(limit), (name, limit)
    assert cli.get_command(click.Context(cli), "no-such-command") is None


def test_help_lists_every_command_without_importing_one():
    probe = (
        "import sys\nsys.argv = ['carry', '--help']\nfrom carry.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in sys.modules if m.startswith('carry.cli.commands.')))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.rstrip().endswith("LOADED []"), result.stdout
    listed = result.stdout.split("Commands:\n", 1)[1].split("LOADED")[0].splitlines()
    assert [line.split()[0] for line in listed if line.startswith("  ") and not line.startswith("   ")] == sorted(
        COMMANDS
    )
