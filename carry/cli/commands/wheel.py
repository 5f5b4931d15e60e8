"""`wheel`: the patched tree built into a gated wheel, here or in a platform's build stage."""

from __future__ import annotations

import json
from pathlib import Path

import click

from carry.cli.common import AN_EXISTING_DIR, Context, out_option, parse_platform


@click.command("wheel")
@click.option(
    "--arch",
    metavar="LIST",
    help="CUDA arches, e.g. 9.0,12.0,12.1, or none for a Python-only wheel "
    "(default: build.cuda_arches, or the platform's own from image.platforms).",
)
@out_option("Directory the wheel is published into (atomically).")
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    help="Compile jobs (default: from build.env MAX_JOBS, else from cores and free memory).",
)
@click.option(
    "--platform",
    metavar="P",
    help="Build in the Dockerfile's build stage for this platform, e.g. "
    "linux/arm64 (emulated where the CPU is foreign), instead of on this machine.",
)
@click.option(
    "--hermetic", is_flag=True, help="With --platform: build with --network=none, requirements from a wheelhouse."
)
@click.option(
    "--wheelhouse",
    type=AN_EXISTING_DIR,
    help="With --platform --hermetic: the wheels (default: downloaded once into the cache).",
)
@click.option(
    "--from-source",
    is_flag=True,
    help="Compile, even where build.precompiled has a wheel to take the compiled code from.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the result as JSON (wheel, version, cache key, what the compiler cache did, the gate and tree check).",
)
@click.pass_obj
def wheel_command(  # noqa: PLR0913 (a click command: its parameters are its flags)
    obj: Context,
    arch: str | None,
    out: Path,
    jobs: int | None,
    platform: str | None,
    hermetic: bool,
    wheelhouse: Path | None,
    from_source: bool,
    as_json: bool,
) -> None:
    """Build the patched tree into a wheel for the CUDA arches (or, with build.precompiled, take the compiled code
    from the upstream's own wheel, proven to match the source), gate it, check it holds exactly the patched tree,
    stamp provenance; reuse when unchanged."""
    from carry.app import wheel

    asked = wheel.WheelRequest(
        arch=arch,
        out=out,
        jobs=jobs,
        platform=parse_platform(platform),
        hermetic=hermetic,
        wheelhouse=wheelhouse,
        from_source=from_source,
        as_json=as_json,
    )
    outcome = wheel.wheel_command(obj.app(), asked)
    if outcome.staged is not None:
        click.echo(outcome.staged.path)
        return
    assert outcome.made is not None
    click.echo(json.dumps(outcome.made.to_json(), indent=2) if as_json else outcome.made.path)
