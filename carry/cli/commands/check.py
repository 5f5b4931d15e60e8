"""`check`: the series applied in order onto the pinned base (or a ref)."""

from __future__ import annotations

import json
import sys

import click

from carry.cli.common import Context, echo_notes


@click.command()
@click.option("--against", "against", metavar="REF", help="Apply onto this upstream ref instead of the pin.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def check(obj: Context, against: str | None, as_json: bool) -> None:
    """Apply the series in order onto the pinned base (or REF) in a private index; exit 1 if any fails."""
    from carry.commands import check_table

    result = obj.session().check(against)
    echo_notes(result.notes)
    click.echo(json.dumps(result.report.to_json(), indent=2) if as_json else check_table(result.report))
    sys.exit(0 if result.report.ok else 1)
