"""`test` and `prove`: build.tests on this machine's GPU, against one artifact or every prefix of the series."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from carry.cli.common import Context, out_option

if TYPE_CHECKING:
    from click.decorators import FC

TEST_TIMEOUT_S = 900  # seconds one command of build.tests may run (`test`, `prove`)


def timeout_option(help: str) -> Callable[[FC], FC]:
    return click.option("--timeout", type=click.FloatRange(min=1), default=TEST_TIMEOUT_S, show_default=True, help=help)


@click.command("test")
@click.argument("artifact")
@out_option("Where an image's report goes (a wheel's goes beside the wheel).")
@timeout_option("Seconds each command may run before it is killed.")
@click.pass_obj
def test_command(obj: Context, artifact: str, out: Path, timeout: float) -> None:
    """Run build.tests against a wheel (installed into a fresh venv) or an image (docker run --gpus all) on this
    machine's GPU; write the JSON report beside the wheel (<wheel>.test.json). Exit 1 if a test fails, 2 without
    a GPU."""
    from carry.app import gputest
    from carry.gputest import testrun

    result = gputest.run_tests(obj.app(), gputest.TestRequest(artifact=artifact, out=out, timeout=timeout))
    click.echo("\n".join(testrun.summary(result.report, result.path)))
    sys.exit(0 if result.report.passed else 1)


@click.command("prove")
@click.option("--arch", metavar="LIST", help="CUDA arches (default: build.cuda_arches).")
@out_option("Wheels and reports go into OUT/prove/<prefix>/.")
@click.option("--jobs", type=click.IntRange(min=1), help="Compile jobs (as for `wheel`).")
@timeout_option("Seconds each test command may run before it is killed.")
@click.option("--json", "as_json", is_flag=True, help="Print the proof as JSON.")
@click.pass_obj
def prove_command(obj: Context, arch: str | None, out: Path, jobs: int | None, timeout: float, as_json: bool) -> None:
    """Build the wheel of every prefix of the series (base, base+0001 and on; cached like every build), run
    build.tests on each on this GPU, and print which patch flips which test from FAIL to PASS. Exit 1 unless the
    whole series passes, 2 without a GPU."""
    from carry.app import gputest
    from carry.gputest import prove

    asked = gputest.ProveRequest(arch=arch, out=out, jobs=jobs, timeout=timeout)
    result = gputest.prove_series(obj.app(), asked)
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else prove.table(result))
    sys.exit(0 if result.passed else 1)
