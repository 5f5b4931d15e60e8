"""`check`: the series applied in order onto the pinned base (or a ref)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from carry.cli.common import Context

if TYPE_CHECKING:
    from carry.source import apply


@click.command()
@click.option("--against", metavar="REF", help="Apply onto this upstream ref instead of the pin.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def check(obj: Context, against: str | None, as_json: bool) -> None:
    """Apply the series in order onto the pinned base (or REF) in a private index; exit 1 if any fails."""
    result = obj.app().check(against)
    click.echo(json.dumps(result.report.to_json(), indent=2) if as_json else check_table(result.report))
    sys.exit(0 if result.report.ok else 1)


def check_table(report: apply.CheckReport) -> str:
    """The check report as a readable table."""
    rows = [f"base   {report.base}", f"series {report.series_hash}", ""]
    width = max([len(r.patch.name) for r in report.results] + [5])
    rows.append(f"{'patch':<{width}}  {'status':<7} {'+':>4} {'-':>4}  files")
    for result in report.results:
        p = result.patch
        rows.append(f"{p.name:<{width}}  {result.status.value:<7} {p.added:>4} {p.removed:>4}  {', '.join(p.files)}")
        for offset in result.offsets:
            rows.append(f"{'':<{width}}  warning: {offset}")
        if result.failure:
            rows.append(f"{'':<{width}}  failed: {result.failure.describe()}")
    rows.append("")
    rows.append(f"tree   {report.tree}" if report.tree else "tree   (not written: a patch failed)")
    return "\n".join(rows)
