"""`image` and `manifest`: the container image per platform, and the manifest lists that join them."""

from __future__ import annotations

import json
from pathlib import Path

import click

from carry.cli.common import AN_EXISTING_DIR, Context, parse_platform, platforms_option


@click.command("image")
@click.option(
    "--push",
    is_flag=True,
    help="Push every tag (credentials: Docker config, or "
    "$CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD handed over on stdin).",
)
@click.option("--tag", "tags", metavar="T", multiple=True, help="An extra tag; repeatable.")
@platforms_option(
    "Target platform, e.g. linux/arm64; repeatable, one build each (default: image.platforms); a "
    "foreign CPU needs QEMU's binfmt_misc handler."
)
@click.option(
    "--arch", metavar="LIST", help="CUDA arches, or none (default: build.cuda_arches, or each platform's own)."
)
@click.option("--hermetic", is_flag=True, help="Build with --network=none, requirements from a wheelhouse.")
@click.option(
    "--wheelhouse", type=AN_EXISTING_DIR, help="Wheels for --hermetic (default: downloaded once into the cache)."
)
@click.option(
    "--cache-from",
    metavar="SPEC",
    multiple=True,
    help="Import BuildKit's layer cache: inline (this VERSION's pushed image), registry (its "
    "-buildcache ref), an image ref, or type=... (buildx); {arch} {version} filled per platform. With image.lock: "
    "an image whose record says which layers the registry has (default: this VERSION's tags and image.tags').",
)
@click.option(
    "--cache-to",
    metavar="SPEC",
    multiple=True,
    help="Export it: inline (inside the image; any BuildKit), registry (buildx, mode=max, to "
    "NAME:VERSION-ARCH-buildcache), or type=... (buildx).",
)
@click.option(
    "--no-smoke",
    is_flag=True,
    help="With image.lock: skip the smoke test (after --push it pulls each platform's image back and keeps it).",
)
@click.option(
    "--smoke",
    type=click.Choice(["auto", "full"]),
    default="auto",
    show_default=True,
    help="With image.lock and --push: full pulls each platform's image back and runs it; auto does too, unless the "
    "previous image's smoke result holds for what did not change (then the changed Python files are checked "
    "against the image, nothing pulled).",
)
@click.option(
    "--discard-wheels",
    is_flag=True,
    help="With image.lock and --push: remove the locked wheels this run downloads once their platform's layers are "
    "pushed (a CI runner that starts empty: its disk holds one platform's wheels at a time).",
)
@click.option(
    "--attest",
    metavar="NAME[=ARG]",
    multiple=True,
    help="With --push: an attestation besides the defaults (sbom, provenance, and suite when the fixed wheel's "
    "<wheel>.suite.json is in dist/), NAME=off to leave one out, suite=PATH for another report; repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="With image.lock: the layers and tags as JSON on stdout.")
@click.pass_obj
def image_command(  # noqa: PLR0913 (a click command: its parameters are its flags)
    obj: Context,
    push: bool,
    tags: tuple[str, ...],
    platforms: tuple[str, ...],
    arch: str | None,
    hermetic: bool,
    wheelhouse: Path | None,
    cache_from: tuple[str, ...],
    cache_to: tuple[str, ...],
    no_smoke: bool,
    smoke: str,
    discard_wheels: bool,
    attest: tuple[str, ...],
    as_json: bool,
) -> None:
    """Build the image with BuildKit, one build per platform (the build stage runs `build.py wheel`), tag it
    from VERSION, label it with its provenance, and optionally push; with several platforms each is tagged
    VERSION-ARCH and, on push, every shared tag becomes a manifest list of them all."""
    from carry.app import image as app
    from carry.app import imaging
    from carry.image.buildkit.image import ImageOptions
    from carry.image.buildkit.layercache import CacheSpec
    from carry.trust import kinds

    caches = tuple(CacheSpec.parse(s, False) for s in cache_from) + tuple(CacheSpec.parse(s, True) for s in cache_to)
    chosen = kinds.chosen(attest)
    options = ImageOptions(
        push, tags, tuple(parse_platform(p) for p in platforms), hermetic, wheelhouse, caches, chosen
    )
    asked = imaging.ImageRequest(
        options=options, arch=arch, smoke="off" if no_smoke else smoke, discard_wheels=discard_wheels
    )
    outcome = app.image_command(obj.app(), asked)
    if outcome.locked is not None:
        click.echo(json.dumps(outcome.locked.to_json(), indent=2) if as_json else "\n".join(outcome.locked.lines()))
        return
    assert outcome.built is not None
    click.echo("\n".join(outcome.built.lines()))


@click.command("manifest")
@platforms_option("A platform to join; repeatable (default: image.platforms).")
@click.option("--tag", "tags", metavar="T", multiple=True, help="An extra shared tag; repeatable.")
@click.pass_obj
def manifest_command(obj: Context, platforms: tuple[str, ...], tags: tuple[str, ...]) -> None:
    """Make every shared tag (VERSION, the templates, --tag) a manifest list of the platforms' VERSION-ARCH
    images, which separate runs (one per platform) pushed; checked against the registry afterwards."""
    from carry.app import image as app

    asked = app.ManifestRequest(platforms=tuple(parse_platform(p) for p in platforms), extra_tags=tags)
    joined = app.manifest(obj.app(), asked)
    click.echo("\n".join(f"{ref}  {digest}" for ref, digest in joined.items()))
