"""`suite`: the upstream's own tests on the fixed wheel and on the release it was made from, compared per test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from carry.cli.common import A_FILE, Context


@click.command("suite")
@click.argument("wheel", type=A_FILE)
@click.option(
    "--against",
    type=A_FILE,
    metavar="WHEEL",
    help="The wheel to compare with (default: build.precompiled's wheel for the fixed wheel's platform).",
)
@click.option("--rerun", is_flag=True, help="Run the comparison side again instead of reading its cached result.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def suite_command(obj: Context, wheel: Path, against: Path | None, rerun: bool, as_json: bool) -> None:
    """Run the upstream's own test suite (build.upstream_tests: paths, marker, deselections, timeout) on the fixed
    wheel and on the wheel it was made from, each in an environment of its own, no network, no GPU, and compare per
    test id: regressed (passed before, fails now), fixed, failed both (the upstream's own), only one side; write the
    report beside the wheel (<wheel>.suite.json). Exit 1 when a test regressed."""
    from carry.app import gputest
    from carry.gputest import upstreamsuite

    outcome = gputest.suite(obj.app(), gputest.SuiteRequest(wheel=wheel, against=against, rerun=rerun))
    if as_json:
        click.echo(json.dumps(outcome.report, indent=1))
    else:
        click.echo("\n".join(upstreamsuite.lines(outcome.report, outcome.path)))
    sys.exit(0 if outcome.passed else 1)
