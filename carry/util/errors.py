"""Errors carry raises, each with the exit status the CLI gives it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


class CarryError(Exception):
    """A failure carry reports in one line; `exit_code` is what the process exits with."""

    exit_code = 1


class BadInput(CarryError):
    """The user's input (config, VERSION, patches, flags) is wrong: one line naming it and the fix, exit 2."""

    exit_code = 2


class Failed(CarryError):
    """The input was fine but the job did not succeed (a patch failed, a build broke): exit 1."""

    exit_code = 1


def read_input(path: Path, unreadable: Callable[[Exception], str]) -> str | None:
    """The text of the input file `path`, None when there is none; BadInput `unreadable(reason)` when unreadable."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(unreadable(exc)) from None
