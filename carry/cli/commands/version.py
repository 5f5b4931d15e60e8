"""`version` and `version bump`: VERSION (YYYYMMDD.N)."""

from __future__ import annotations

import click

from carry.cli.common import Context


@click.group(invoke_without_command=True)
@click.pass_context
def version(ctx: click.Context) -> None:
    """Print VERSION (YYYYMMDD.N)."""
    if ctx.invoked_subcommand is None:
        from carry.app import read_version

        click.echo(read_version(ctx.obj.config_path))


@version.command("bump")
@click.pass_obj
def version_bump(obj: Context) -> None:
    """Write today's UTC date with .1, or .N+1 when VERSION already holds today."""
    from carry.app import bump_version

    click.echo(bump_version(obj.config_path))
