"""`fetch`: the pinned commit (and the PR head) into the cache mirror."""

from __future__ import annotations

import click

from carry.cli.common import Context


@click.command()
@click.option(
    "--update-pin", is_flag=True, help="Move upstream.commit in build.yaml to the PR head (and bump VERSION)."
)
@click.pass_obj
def fetch(obj: Context, update_pin: bool) -> None:
    """Fetch the pinned commit (and the PR head) into the cache mirror; print the base commit."""
    from carry.app import source

    result = source.fetch(obj.app(), source.FetchRequest(update_pin=update_pin))
    click.echo(result.base)
