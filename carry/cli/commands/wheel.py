"""`wheel`: the patched tree built into a gated wheel, here or in a platform's build stage."""

from __future__ import annotations

import json
from pathlib import Path

import click

from carry.cli.common import A_DIR, AN_EXISTING_DIR, Context, parse_platform
from carry.util import reporter


@click.command("wheel")
@click.option(
    "--arch",
    metavar="LIST",
    help="CUDA arches, e.g. 9.0,12.0,12.1, or none for a Python-only wheel "
    "(default: build.cuda_arches, or the platform's own from image.platforms).",
)
@click.option(
    "--out",
    type=A_DIR,
    default="dist",
    show_default=True,
    help="Directory the wheel is published into (atomically).",
)
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
    target = parse_platform(platform)
    session = obj.session()
    here = target is None or (not from_source and session.precompiled_for(target))
    if here and (hermetic or wheelhouse):
        raise click.UsageError("--hermetic and --wheelhouse go with --platform (a build in a container)")
    if not here and (jobs is not None or as_json):
        raise click.UsageError("--jobs and --json apply to builds on this machine; the build stage picks its jobs")
    if not from_source:
        session.require_pins((target,) if target else ())
    if not here:
        assert target is not None  # not here: a --platform was given
        built = session.platform_wheel(target, arch, out, hermetic, wheelhouse)
        reporter.phase("done", f"{built.platform} wheel, gate passed for {built.gate.archlist}")
        click.echo(built.path)
        return
    result = session.wheel(arch, out, jobs, target, from_source, one_artifact=True)
    reporter.phase("done", "reused from cache" if result.reused else "built")
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else result.path)
