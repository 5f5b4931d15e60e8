"""carry's command line (`carry` when installed, `python build.py` from a checkout, `python -m carry`): the group
and `main` in `main` (the console script is `carry.cli.main:main`), what every command shares in `common`, one
module per command in `commands/`. Nothing here: importing a command module loads no other."""
