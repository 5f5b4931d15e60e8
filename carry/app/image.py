"""`image` and `manifest`: the image of each platform, by BuildKit (the Dockerfile) or, with image.lock, written
by carry itself (carry/app/locked.py); the manifest lists that join the platforms' pushed images."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from carry.util.errors import BadInput
from carry.util.record import record

if TYPE_CHECKING:
    from carry.app import App
    from carry.app.imaging import ImageRequest
    from carry.image.buildkit import image
    from carry.image.buildkit.image import ImageOptions
    from carry.image.locked import lockedimage
    from carry.platforms import Platform


@record
class ImageOutcome:
    """A BuildKit build's result (`built`) or a locked image's (`locked`): exactly one is set."""

    built: image.ImageResult | None = None
    locked: lockedimage.LockedImageResult | None = None


@record(kw_only=True)
class ManifestRequest:
    platforms: tuple[Platform, ...] = ()
    extra_tags: tuple[str, ...] = ()


def image_command(app: App, request: ImageRequest) -> ImageOutcome:
    """With image.lock, the locked image carry writes itself; else a BuildKit build per platform."""
    if app.config.image.lock:
        from carry.app import locked

        return ImageOutcome(locked=locked.locked_image(app, request))
    return ImageOutcome(built=buildkit_image(app, request.options, request.arch))


def buildkit_image(app: App, options: ImageOptions, arch: str | None) -> image.ImageResult:
    """check -> context -> a BuildKit build per platform -> tags and labels -> push -> shared tags as manifest lists."""
    from carry.app import imaging, wheel
    from carry.image.buildkit import container, image

    attester = imaging.attester_for(app, options.push, options.attest)
    imaging.registry_answers(app, options.push)
    platforms = image.platforms_to_build(app.config, options)
    app.require_pins(platforms)
    arches = {platform: app.arches(arch, platform) for platform in platforms}
    builder = container.resolve_builder(app.config, platforms)
    image.check_options(app.config, builder, options)
    checked = wheel.checked_said(app)
    pyproject = wheel.upstream_pyproject(checked)
    subject = image.Subject(
        report=checked.report,
        series=checked.series,
        version=app.version(),
        dist_name=container.distribution_name(app.config, pyproject),
        cuda=imaging.cuda_tag(app),
        created=image.created_at(checked.mirror, checked.report.base, os.environ),
        upstream_version=wheel.upstream_version(app, checked),
    )
    plan = image.plan(app.config, subject, arches, options)
    inputs = image.Sources(mirror=checked.mirror, requirements=container.build_requirements(pyproject))
    # One image build of a tree at a time per cache (its log, its context): a second run waits, and says so.
    with app.cache.held(f"image-{plan.tree[:12]}", "image"):
        return image.build(app.config, app.cache, inputs, plan, options, builder, attester)


def manifest(app: App, request: ManifestRequest) -> dict[str, str]:
    """Every shared tag -> a manifest list of the platforms' `<VERSION>-<arch>` images already pushed."""
    from carry.app import imaging
    from carry.image.buildkit import container, image

    options = image.ImageOptions(True, request.extra_tags, request.platforms, False, None)
    chosen = image.platforms_to_build(app.config, options)
    if len(chosen) < 2:
        raise BadInput(
            f"{app.config.path}: a manifest list joins several platforms; list them in "
            f"image.platforms or pass --platform twice or more"
        )
    shared = image.render_tags(app.config, app.version(), app.series(), imaging.cuda_tag(app))
    refs = tuple(dict.fromkeys(f"{app.config.image.name}:{tag}" for tag in shared + request.extra_tags))
    attester = imaging.attester_for(app, True)
    imaging.registry_answers(app, True)  # after every check of the input: bad input never waits on the network
    builder = container.resolve_builder(app.config, ())
    return image.join_pushed(app.config, app.version(), refs, chosen, builder, attester)
