"""`pin`: build.precompiled.wheels found and written."""

from __future__ import annotations

import sys

import click

from carry.cli.common import Context


@click.command("pin")
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Write nothing; exit 1 when the written pins are not what discovery finds now (downloads to compare).",
)
@click.pass_obj
def pin_command(obj: Context, check_only: bool) -> None:
    """Find each platform's precompiled wheel on build.precompiled.nightly's per-commit index: the merge-base C of
    upstream.commit and main, else the nearest commit back along main whose compiled inputs are the patched tree's
    (max_walk); download and hash it (trust on first use: the index gives no hashes), prove its commit from its
    version, and write build.precompiled.wheels in place. Never another variant's or platform's wheel: exit 1 naming
    every commit refused, and why."""
    from carry.app import wheel

    result = wheel.pin(obj.app(), check_only)
    if check_only:
        click.echo("\n".join(result.check_lines()))
        sys.exit(0 if result.fresh else 1)
    click.echo("\n".join(result.lines(obj.config_path.absolute())))
