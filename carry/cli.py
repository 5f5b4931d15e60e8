"""carry's command line (`carry` when installed, `python build.py` from a checkout): parse flags, call the
`carry` modules, print.

Each command imports what it uses when it runs, so `check` and `version` do not pay for the image, gate and
registry modules (and their libraries) at start-up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from carry.errors import CarryError
from carry.progress import Progress


class Context:
    """What every command needs: the config path and, on first use, the loaded config."""

    def __init__(self, config_path: Path):
        self.config_path = config_path

    def session(self):
        from carry.commands import Session

        return Session.open(self.config_path)


def echo_notes(notes) -> None:
    for note in notes:
        click.echo(f"carry: {note}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default="build.yaml",
    show_default=True,
    help="The build.yaml to use; VERSION and patches/ are found relative to it.",
)
@click.pass_context
def cli(ctx: click.Context, config_path: Path) -> None:
    """carry: fetch an upstream PR at a pinned commit, prove the patch series applies in order,
    and build a versioned wheel and container image from the patched tree.

    The cache (mirrors, bundles, build dirs, artifacts, logs) lives in $CARRY_CACHE
    (default ~/.cache/carry).
    """
    ctx.obj = Context(config_path)


@cli.group(invoke_without_command=True)
@click.pass_context
def version(ctx: click.Context) -> None:
    """Print VERSION (YYYYMMDD.N)."""
    if ctx.invoked_subcommand is None:
        from carry.commands import read_version

        click.echo(read_version(ctx.obj.config_path))


@version.command("bump")
@click.pass_obj
def version_bump(obj: Context) -> None:
    """Write today's UTC date with .1, or .N+1 when VERSION already holds today."""
    from carry.commands import bump_version

    click.echo(bump_version(obj.config_path))


@cli.command()
@click.option("--update-pin", is_flag=True, help="Move upstream.commit in build.yaml to the PR head.")
@click.pass_obj
def fetch(obj: Context, update_pin: bool) -> None:
    """Fetch the pinned commit (and the PR head) into the cache mirror; print the base commit."""
    result = obj.session().fetch(update_pin=update_pin)
    echo_notes(result.notes)
    click.echo(result.base)


@cli.command()
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


@cli.command("wheel")
@click.option("--arch", metavar="LIST", help="CUDA arches, e.g. 9.0,12.0,12.1, or none for a Python-only wheel "
              "(default: build.cuda_arches).")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default="dist", show_default=True,
              help="Directory the wheel is published into (atomically).")
@click.option("--jobs", type=click.IntRange(min=1), help="Compile jobs (default: from build.env MAX_JOBS, "
              "else from cores and free memory).")
@click.pass_obj
def wheel_command(obj: Context, arch: str | None, out: Path, jobs: int | None) -> None:
    """Build the patched tree into a wheel for the CUDA arches, gate it, stamp provenance; reuse when unchanged."""
    progress = Progress()
    result = obj.session().wheel(arch, out, jobs, progress)
    progress.phase("done", "reused from cache" if result.reused else "built")
    click.echo(result.path)


@cli.command()
@click.argument("artifact")
@click.option("--arch", metavar="LIST", help="Gate a wheel against these arches instead of the ones it recorded.")
@click.pass_obj
def verify(obj: Context, artifact: str, arch: str | None) -> None:
    """Verify a wheel file or an image reference against this repo (VERSION, series hash, pinned commit);
    wheels also get RECORD hashes and the CUDA arch gate. Exit 1 on a mismatch, naming the field."""
    session = obj.session()
    if artifact.endswith(".whl") or Path(artifact).is_file():
        result = session.verify_wheel(Path(artifact), arch)
    else:
        result = session.verify_image(artifact)
    click.echo("\n".join(result.lines()))
    sys.exit(0 if result.ok else 1)


@cli.command("image")
@click.option("--push", is_flag=True, help="Push every tag (credentials: Docker config, or "
              "$CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD handed over on stdin).")
@click.option("--tag", "tags", metavar="T", multiple=True, help="An extra tag; repeatable.")
@click.option("--platform", "platforms", metavar="P", multiple=True,
              help="Target platform, e.g. linux/arm64; repeatable (default: image.platforms; needs buildx).")
@click.option("--arch", metavar="LIST", help="CUDA arches, or none (default: build.cuda_arches).")
@click.option("--hermetic", is_flag=True, help="Build with --network=none, requirements from a wheelhouse.")
@click.option("--wheelhouse", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Wheels for --hermetic (default: downloaded once into the cache).")
@click.option("--cache-from", "cache_from", metavar="SPEC", multiple=True,
              help="Build cache source, e.g. type=registry,ref=REG/NAME:buildcache; repeatable.")
@click.option("--cache-to", "cache_to", metavar="SPEC", multiple=True,
              help="Build cache export (buildx only), e.g. type=registry,ref=REG/NAME:buildcache,mode=max.")
@click.pass_obj
def image_command(obj: Context, push: bool, tags: tuple[str, ...], platforms: tuple[str, ...], arch: str | None,
                  hermetic: bool, wheelhouse: Path | None, cache_from: tuple[str, ...],
                  cache_to: tuple[str, ...]) -> None:
    """Build the image with BuildKit (the build stage runs `build.py wheel`), tag it from VERSION, label it
    with its provenance, and optionally push."""
    from carry.image import ImageOptions

    progress = Progress()
    options = ImageOptions(push, tags, platforms, hermetic, wheelhouse, cache_from, cache_to)
    result = obj.session().image(options, arch, progress)
    echo_notes(result.notes)
    for ref in result.refs:
        click.echo(f"{ref}  {result.pushed[ref]}" if ref in result.pushed else ref)


@cli.command()
@click.option("--against", "against", metavar="REF", multiple=True,
              help="Upstream ref to judge against; repeatable (default: upstream.main and the PR head).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.option("--fail-on", "fail_on", metavar="VERDICTS",
              help="Exit 1 when one of these verdicts occurs, e.g. MERGED-EXACT,MERGED-MODIFIED,CONFLICT.")
@click.pass_obj
def status(obj: Context, against: tuple[str, ...], as_json: bool, fail_on: str | None) -> None:
    """One verdict per patch against newer upstream refs: MERGED-EXACT, MERGED-MODIFIED, PARTIAL, CONFLICT
    or NEEDED, each with its evidence."""
    from carry import verdicts

    failing = verdicts.Verdict.parse_list(fail_on, "--fail-on") if fail_on is not None else frozenset()
    result = obj.session().status(against)
    echo_notes(result.notes)
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else verdicts.table(result))
    sys.exit(1 if failing & result.occurred else 0)


@cli.command("drop")
@click.argument("name")
@click.option("--against", "against", metavar="REF", help="Upstream ref that must have merged it (default: main).")
@click.option("--force", is_flag=True, help="Drop even when the patch is not merged upstream (logged as forced).")
@click.pass_obj
def drop_command(obj: Context, name: str, against: str | None, force: bool) -> None:
    """Remove a patch upstream merged, bump VERSION and log it in patches/DROPPED.md."""
    result = obj.session().drop(name, against, force)
    echo_notes(result.notes)
    click.echo(result.line)


@cli.command()
@click.option("--onto", "onto", metavar="REF", help="Upstream ref to move onto (default: upstream.main).")
@click.pass_obj
def refresh(obj: Context, onto: str | None) -> None:
    """Rebase the series onto a new upstream base (3-way merge), move the pin and rewrite the patches that
    moved; on a conflict change nothing and exit 1."""
    result = obj.session().refresh(onto)
    echo_notes(result.notes)
    click.echo("\n".join(result.lines()))


def main() -> None:
    try:
        cli.main(prog_name="carry", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("carry: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"carry: error: {exc.format_message()}; see --help", err=True)
        sys.exit(2)
    except CarryError as exc:
        click.echo(f"carry: error: {exc}", err=True)
        sys.exit(exc.exit_code)

