"""Run an upstream's own PEP 517 build into a wheel, its output going to a log. Without build isolation carry calls
the backend's `build_wheel` hook itself through pyproject_hooks in the build environment's interpreter (buildenv.py),
as `python -m build --no-isolation` would there, one interpreter fewer per build; with isolation it runs
`python -m build`, which makes the isolated environment and installs the build requirements into it.
setuptools is asked for a wheel of stored members (`bdist_wheel --compression=stored`): zlib's deflate was 27 of a
precompiled vLLM build's 42 s here; carry deflates them with ISA-L when it stamps the wheel (binaries/wheelzip.py).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import pyproject_hooks

try:
    import tomllib
except ImportError:  # Python 3.10: `build` depends on tomli there
    import tomli as tomllib  # type: ignore[no-redef]

from carry.util.run import BUILD_S, execute

LEGACY_BACKEND = "setuptools.build_meta:__legacy__"
STORED = "--compression=stored"  # an option of setuptools' (and wheel's) bdist_wheel


class _StepFailed(Exception):
    """A build step's nonzero exit status (args[0])."""


def build_wheel(
    src: Path, out: Path, env: dict[str, str], log: BinaryIO, isolated: bool, python: str = sys.executable
) -> int:
    """Build `src` into a wheel in `out` with `env`; the failing step's exit status, or 0. Without isolation the
    backend runs in `python` (the build environment's interpreter)."""

    def run(cmd: Sequence[str], cwd: str | Path | None = None, extra_environ: Mapping[str, str] | None = None) -> None:
        status = execute(cmd, cwd=cwd, env={**env, **(extra_environ or {})}, log=log, timeout=BUILD_S).returncode
        if status:
            raise _StepFailed(status)

    try:
        backend, backend_path = backend_of(src)
        settings = {"--build-option": [STORED]} if backend.startswith("setuptools.build_meta") else None
        if isolated:
            command = [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(src)]
            command += [f"-C--build-option={STORED}"] if settings else []
            _note(log, f"$ {' '.join(command)}")
            run(command, cwd=src)
            return 0
        _note(log, f"$ {backend} build_wheel {out} {settings or {}} (PEP 517 hook in {python}, no isolation)")
        hooks = pyproject_hooks.BuildBackendHookCaller(str(src), backend, backend_path, run, str(python))
        out.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings(record=True) as caught:  # the backend's warnings belong in the log
            warnings.simplefilter("always")
            hooks.build_wheel(str(out), settings)
        for warning in caught:
            _note(log, f"warning from the build backend: {warning.message}")
        return 0
    except _StepFailed as failed:
        return failed.args[0]
    except (OSError, ValueError, pyproject_hooks.BackendUnavailable, pyproject_hooks.HookMissing) as exc:
        _note(log, f"carry: the build backend could not run: {exc}")
        return 1


def backend_of(src: Path) -> tuple[str, list[str] | None]:
    """The `build-system` backend and backend-path of `src/pyproject.toml` (setuptools' legacy one without)."""
    try:
        with open(src / "pyproject.toml", "rb") as handle:
            system = tomllib.load(handle).get("build-system", {})
    except FileNotFoundError:
        return LEGACY_BACKEND, None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{src / 'pyproject.toml'} is not valid TOML ({exc})") from None
    return system.get("build-backend", LEGACY_BACKEND), system.get("backend-path")


def _note(log: BinaryIO, line: str) -> None:
    log.write(f"{line}\n".encode())
    log.flush()
