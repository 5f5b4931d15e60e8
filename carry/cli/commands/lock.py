"""`lock`: image.lock, the runtime's wheels pinned and hashed per platform."""

from __future__ import annotations

import sys

import click

from carry.cli.common import Context, parse_platform, platforms_option


@click.command("lock")
@platforms_option("Lock only this platform; repeatable (default: image.platforms).")
@click.option(
    "--check", "check_only", is_flag=True, help="Write nothing; exit 1 when a lock is missing or stale (for CI)."
)
@click.option("--upgrade", is_flag=True, help="Resolve afresh, not preferring the versions the lock pins now.")
@click.pass_obj
def lock_command(obj: Context, platforms: tuple[str, ...], check_only: bool, upgrade: bool) -> None:
    """Resolve the fixed wheel's Requires-Dist with uv into pinned, sha256-hashed wheels for each platform's runtime
    base image (its Python and glibc, read from the image), through your configured index; write it beside
    build.yaml (image.lock). A rerun with nothing changed rewrites no byte."""
    if check_only and upgrade:
        raise click.UsageError("--check writes nothing; leave out --upgrade")
    from carry.app import lock

    asked = lock.LockRequest(platforms=tuple(parse_platform(p) for p in platforms), check=check_only, upgrade=upgrade)
    result = lock.lock(obj.app(), asked)
    if check_only:
        for platform, stale in result.stale:
            click.echo(stale or f"{platform}: fresh")
        sys.exit(1 if any(stale for _, stale in result.stale) else 0)
    root = obj.config_path.absolute().parent
    click.echo("\n".join(outcome.line(root) for outcome in result.outcomes))
