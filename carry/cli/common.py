"""What every command module of carry/cli/commands/ shares: the Context object the group hands each command, the
path types, the options several commands take, and --platform parsing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, overload

import click

if TYPE_CHECKING:
    from click.decorators import FC

    from carry.app import App
    from carry.platforms import Platform

# The path types, made once: each click.Path asks gettext for its name when made (a few locale files looked up)
A_FILE = click.Path(path_type=Path, dir_okay=False)
A_DIR = click.Path(path_type=Path, file_okay=False)
AN_EXISTING_DIR = click.Path(path_type=Path, file_okay=False, exists=True)


def out_option(help: str) -> Callable[[FC], FC]:
    """--out: the directory a command writes into, dist unless given."""
    return click.option("--out", type=A_DIR, default="dist", show_default=True, help=help)


def platforms_option(help: str) -> Callable[[FC], FC]:
    """--platform, repeatable, into `platforms`."""
    return click.option("--platform", "platforms", metavar="P", multiple=True, help=help)


class Context:
    """What every command needs: the config path and, on first use, the loaded config."""

    def __init__(self, config_path: Path):
        self.config_path = config_path

    def app(self) -> App:
        """The application context of the config (carry/app/): loaded now, each of its facts when first asked."""
        from carry.app import App

        return App.open(self.config_path)


@overload
def parse_platform(text: str, flag: str = ...) -> Platform: ...
@overload
def parse_platform(text: None, flag: str = ...) -> None: ...
@overload
def parse_platform(text: str | None, flag: str = ...) -> Platform | None: ...
def parse_platform(text: str | None, flag: str = "--platform") -> Platform | None:
    from carry.platforms import Platform

    return Platform.parse(text, flag) if text is not None else None
