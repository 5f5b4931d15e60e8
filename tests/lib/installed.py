"""carry as a user installs it: its wheel built from a copy of this checkout's files (tracked and untracked but not
ignored; the build writes nothing into the checkout), installed non-editable with its dependencies into a fresh
venv. Made once per run (tests/conftest.py `installed_carry`) for test_cli and test_install."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import ROOT


@dataclasses.dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path

    @property
    def script(self) -> Path:
        """The venv's `carry` console script."""
        return self.venv / "bin" / "carry"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def to_json(self) -> dict:
        return {"venv": str(self.venv), "wheel": str(self.wheel)}

    @classmethod
    def from_json(cls, found: dict) -> Installed:
        return cls(Path(found["venv"]), Path(found["wheel"]))


def run(argv: list, cwd: Path, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would put this checkout (or another carry) on the venv's path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, **extra}


def install(base: Path) -> Installed:
    source = base / "src"
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT).stdout
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if not path.exists() and not path.is_symlink():
            continue  # deleted in the working tree
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            (source / name).symlink_to(os.readlink(path))
        else:
            shutil.copy2(path, source / name)
    built = run([sys.executable, "-m", "build", "--wheel", "--outdir", base / "dist", source], base, clean_env())
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (base / "dist").glob("carry-*.whl")
    venv = base / "venv"
    made = run([sys.executable, "-m", "venv", venv], base, clean_env())
    assert made.returncode == 0, made.stderr
    pip = run(
        [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel],
        base,
        clean_env(),
    )
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    shutil.rmtree(source)
    return Installed(venv, wheel)
