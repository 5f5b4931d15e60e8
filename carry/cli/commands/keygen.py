"""`keygen`: a new signing key pair."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("keygen")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
def keygen_command(directory: Path) -> None:
    """Write a new ECDSA P-256 signing key pair: DIRECTORY/carry.key (PKCS#8 PEM, mode 0600, encrypted with
    $CARRY_SIGNING_KEY_PASSWORD when it is set) and DIRECTORY/carry.pub (the public key verify --key and cosign
    verify --key take). Never overwrites a key (exit 2). `image --push` signs with $CARRY_SIGNING_KEY=DIR/carry.key."""
    import os

    from carry.trust import keys

    private, public = keys.keygen(directory, os.environ)
    encrypted = "encrypted" if os.environ.get(keys.PASSWORD_ENV) else "not encrypted: set $CARRY_SIGNING_KEY_PASSWORD"
    click.echo(f"{private}  private key, mode 0600, {encrypted}")
    click.echo(str(public))
