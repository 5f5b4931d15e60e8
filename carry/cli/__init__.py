"""carry's command line (`carry` when installed, `python build.py` from a checkout, `python -m carry`): the group and
`main` in `main`, what every command shares in `common`, one module per command in `commands/`. This file holds no
command logic; it names `main` for the console script pyproject.toml declares (`carry.cli:main`)."""

from carry.cli.main import main

__all__ = ["main"]
