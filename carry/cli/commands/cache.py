"""`cache` and `cache prune`: the size of carry's cache, and removing what no config needs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from carry.cli.common import A_FILE, Context


@click.group("cache", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the sizes as JSON.")
@click.pass_context
def cache_command(ctx: click.Context, as_json: bool) -> None:
    """Show the size of each part of carry's cache ($CARRY_CACHE): mirrors, bundles, build dirs, environments,
    wheels, downloads, wheelhouses, logs, and the rest; hardlinked files counted once."""
    if ctx.invoked_subcommand is not None:
        return
    from carry.app import cache
    from carry.util.cache import Cache

    usage = cache.usage(Cache.from_env())
    click.echo(json.dumps(usage.to_json(), indent=2) if as_json else "\n".join(usage.lines()))


@cache_command.command("prune")
@click.option(
    "--config",
    "configs",
    multiple=True,
    type=A_FILE,
    help="A config whose needs are kept; repeatable (default: the global --config, build.yaml).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.pass_obj
def cache_prune(obj: Context, configs: tuple[Path, ...], dry_run: bool) -> None:
    """Remove what no current config needs (old build environments, wheels, build dirs, mirrors, downloads,
    wheelhouses, logs); an entry another carry holds the lock of is skipped, and says so."""
    from carry.app import cache
    from carry.util.cache import Cache

    result = cache.prune(Cache.from_env(), configs or (obj.config_path,), dry_run)
    click.echo("\n".join(result.lines()))
