"""`verify`: a wheel, an image or a test report against this repo."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from carry.cli.common import Context, parse_platform


@click.command()
@click.argument("artifact")
@click.option("--arch", metavar="LIST", help="Gate against these arches instead of the ones the wheel recorded.")
@click.option(
    "--platform",
    metavar="P",
    help="For an image tag holding several platforms: verify only this one (default: every platform it holds).",
)
@click.option(
    "--key",
    "key_path",
    type=click.Path(path_type=Path, dir_okay=False),
    metavar="PUB",
    help="For an image: check its signature, SBOM and provenance with this public key (carry.pub, cosign.pub).",
)
@click.option(
    "--local",
    is_flag=True,
    help="Verify the image of that name in this Docker engine (built, not pushed) instead of the registry's.",
)
@click.pass_obj
def verify(
    obj: Context, artifact: str, arch: str | None, platform: str | None, key_path: Path | None, local: bool
) -> None:
    """Verify a wheel file, an image reference or a test report against this repo (VERSION, series hash, pinned
    commit). Wheels: RECORD hashes, the CUDA arch gate, the CPU of their shared objects, the test report beside
    them if any. Images: every platform the tag holds is pulled, its labels compared, its Python run (emulated
    where foreign) to import the wheel, and the installed shared objects gated. A test report (*.test.json) is
    checked against the artifact it names, a suite report (*.suite.json) against the wheel beside it and the
    selection in build.yaml. With --key, an image's signature (cosign's simple signing), its SBOM
    (against the distributions the layers install) and its provenance (against this repo) are checked too; without
    build.yaml, only what needs no repository. Exit 1 on a mismatch, naming the field."""
    from carry.gputest.testrun import names_a_wheel

    key = None
    if key_path is not None:
        if artifact.endswith((".test.json", ".suite.json")) or names_a_wheel(artifact):
            raise click.UsageError("--key checks an image's signature; a wheel or test report has none")
        from carry.trust.keys import load_public

        key = load_public(key_path)
    if key is not None and not obj.config_path.exists():
        from carry.image.inspect import trustcheck

        only = trustcheck.verify_without_checkout(artifact, key, parse_platform(platform), "docker")
        click.echo("\n".join(line for result in only for line in result.lines()))
        sys.exit(0 if all(result.ok for result in only) else 1)
    if artifact.endswith(".suite.json"):
        from carry.gputest import upstreamsuite

        path = Path(artifact)
        if obj.config_path.exists():
            checked = obj.session().verify_suite_report(path)
        else:
            checked = upstreamsuite.check_report(path, upstreamsuite.Expected())
        click.echo("\n".join(checked.lines()))
        sys.exit(0 if checked.ok else 1)
    if artifact.endswith(".test.json"):
        from carry.gputest import testrun

        result = testrun.check_report(Path(artifact))
        click.echo("\n".join(result.lines()))
        sys.exit(0 if result.ok else 1)
    results = obj.session().verify(artifact, parse_platform(platform), arch, key, local)
    click.echo("\n".join(line for result in results for line in result.lines()))
    if key is None and not names_a_wheel(artifact):  # said after the results: bad input stays one line
        click.echo("carry: note: the image's signature was not checked (pass --key PUB to check it)", err=True)
    sys.exit(0 if all(result.ok for result in results) else 1)
