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
    "--require",
    multiple=True,
    metavar="NAME",
    help="With --key: fail an image without this attestation (sbom, provenance, suite; repeatable); "
    "`suite` also fails a report that did not pass.",
)
@click.option(
    "--local",
    is_flag=True,
    help="Verify the image of that name in this Docker engine (built, not pushed) instead of the registry's.",
)
@click.pass_obj
def verify(
    obj: Context,
    artifact: str,
    arch: str | None,
    platform: str | None,
    key_path: Path | None,
    require: tuple[str, ...],
    local: bool,
) -> None:
    """Verify a wheel file, an image reference or a test report against this repo (VERSION, series hash, pinned
    commit). Wheels: RECORD hashes, the CUDA arch gate, the CPU of their shared objects, the test report beside
    them if any. Images: every platform the tag holds is pulled, its labels compared, its Python run (emulated
    where foreign) to import the wheel, and the installed shared objects gated. A test report (*.test.json) is
    checked against the artifact it names, a suite report (*.suite.json) against the wheel beside it and the
    selection in build.yaml. With --key, an image's signature (cosign's simple signing), its SBOM
    (against the distributions the layers install) and its provenance (against this repo) are checked too; without
    build.yaml, only what needs no repository. Exit 1 on a mismatch, naming the field."""
    from carry.app.verify import VerifyRequest, verify_artifact

    asked = VerifyRequest(
        config_path=obj.config_path,
        artifact=artifact,
        arch=arch,
        platform=parse_platform(platform),
        key_path=key_path,
        local=local,
        require=require,
    )
    outcome = verify_artifact(asked)
    click.echo("\n".join(line for result in outcome.results for line in result.lines()))
    sys.exit(0 if outcome.ok else 1)
