"""`image` with image.lock: the locked image carry writes itself, reusing what the registry has; its fixed wheels
per platform, placed as carry/wheelbuild/producer.py's rule says."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from carry.util import reporter
from carry.util.errors import BadInput, Failed

if TYPE_CHECKING:
    from carry.app import App
    from carry.app.imaging import ImageRequest
    from carry.image.attest import Attester
    from carry.image.buildkit.image import ImageOptions
    from carry.image.locked import lockedimage
    from carry.platforms import Platform


def _refuse_what_does_not_apply(app: App, options: ImageOptions, discard_wheels: bool) -> None:
    if (
        options.hermetic
        or options.wheelhouse
        or any(spec.exporting or spec.mode or spec.is_spec for spec in options.cache)
    ):
        raise BadInput(
            f"{app.config.path}: image.lock is set: carry writes the layers itself (no BuildKit "
            f"build), so --hermetic, --wheelhouse, --cache-to and --cache-from inline/registry/type=… do not "
            f"apply; --cache-from IMAGE names an image whose record the push reuses"
        )
    if (options.cache or discard_wheels) and not options.push:
        raise BadInput(
            f"{app.config.path}: --cache-from IMAGE and --discard-wheels are for a push (the registry keeps the "
            f"layers): add --push"
        )


def locked_image(app: App, request: ImageRequest) -> lockedimage.LockedImageResult:
    """image.lock set: locks read and checked -> with --push, each platform's previous image and record -> check ->
    the fixed wheels -> carry writes the layers, reusing the registry's -> push or load -> smoke test -> record."""
    from carry.app import imaging, wheel
    from carry.image import registry
    from carry.image.buildkit import image
    from carry.image.locked import lockedimage

    options = request.options
    _refuse_what_does_not_apply(app, options, request.discard_wheels)
    attester = imaging.attester_for(app, options.push, options.attest)
    imaging.registry_answers(app, options.push)
    platforms = image.platforms_to_build(app.config, options)
    app.require_pins(platforms)
    client = registry.client()
    previous: dict = {}

    def known_bases() -> dict:
        """The previous images (read from the registry after the locks are checked) and the bases they name."""
        previous.update(previous_images(app, platforms, options, attester) if options.push else {})
        return {p: f.record.base for p, f in previous.items() if f.record is not None and f.record.base}

    prepared = lockedimage.prepare(app.config, app.cache, platforms, client, known_bases)
    checked = wheel.checked_said(app)
    arches = {platform: app.arches(request.arch, platform) for platform in platforms}
    subject = image.Subject(
        report=checked.report,
        series=checked.series,
        version=app.version(),
        dist_name=app.config.build.distribution,
        cuda=imaging.cuda_tag(app, any("{cuda}" in t for t in app.config.image.tags)),
        created=image.created_at(checked.mirror, checked.report.base, os.environ),
    )
    plan = image.plan(app.config, subject, arches, options)
    offers = _offers(app, platforms, prepared, previous) if options.push else {}
    wheels = image_wheels(app, platforms, request.arch, offers)
    if not plan.named:  # the distribution name from the wheel itself (its file name)
        plan = plan.with_distribution(next(iter(wheels.values())).name.split("-", 1)[0])
    delivery = lockedimage.Delivery(
        push=options.push,
        smoke=request.smoke != "off",
        attester=attester,
        smoke_mode=request.smoke,
        previous=previous,
        discard_wheels=request.discard_wheels,
    )
    with app.cache.held(f"image-{plan.tree[:12]}", "image"):
        return lockedimage.build(app.config, app.cache, prepared, plan, wheels, delivery, client)


def _offers(app: App, platforms: tuple[Platform, ...], prepared: lockedimage.Prepared, previous: dict) -> dict:
    """Per platform, a base a derivation may start from: VERSION N's fixed wheel rebuilt from its pushed image."""
    from carry.image.locked import imagewheel, layerplan

    return {
        platform: imagewheel.offer(
            previous.get(platform), layerplan.venv_of(prepared.locks[platform]), app.cache.scratch
        )
        for platform in platforms
    }


def image_wheels(app: App, platforms: tuple[Platform, ...], arch: str | None, offers: dict | None = None) -> dict:
    """The fixed wheel of each platform of a locked image, in dist/: made here where producer.here says; for another
    platform, this machine's own when it is pure Python, never a wheel of this CPU's code. `offers`: per platform, a
    base a derivation may start from (wheel.Builder.offer)."""
    from carry.app import wheel
    from carry.platforms import Platform
    from carry.wheelbuild import producer

    native = Platform.native()
    facts = {p: producer.Facts(platform=p, native=native, precompiled=wheel.precompiled_for(app, p)) for p in platforms}
    here = [p for p in platforms if producer.here(facts[p])]
    if any(p not in here for p in platforms) and native not in here:
        here.append(native)
    built = {}
    for platform in here:
        app.require_pins((platform,))
        builder = app.builder(arch, None, platform)
        builder.offer = (offers or {}).get(platform)
        checked = app.check()
        wheel.dropped_are_in_the_pin(app, checked)
        made = builder(checked.mirror, checked.report, checked.series, Path("dist"))
        built[platform] = made.path
        reporter.phase("wheel", f"{platform}: {made.path.name}{' (reused)' if made.reused else ''}")
    for platform in platforms:
        if platform in built:
            continue
        mine = built[native].name
        if producer.choose(dataclasses.replace(facts[platform], made_here=mine)) is not producer.Kind.PURE:
            raise Failed(
                f"{mine} holds {native.machine} code: a locked image for {platform} needs "
                f"build.precompiled.wheels.{platform}"
            )
        built[platform] = built[native]
        reporter.phase("wheel", f"{platform}: {mine} (pure Python, made on {native})")
    return {platform: built[platform] for platform in platforms}


def previous_images(
    app: App, platforms: tuple[Platform, ...], options: ImageOptions, attester: Attester | None
) -> dict:
    """Each platform's previous image in the registry and its record (registrycache.find): at --cache-from's refs,
    else this VERSION's own tags and image.tags. The record is trusted only signed when $CARRY_SIGNING_KEY is set."""
    from carry.app.imaging import cuda_tag
    from carry.image import registry, registryhttp
    from carry.image.buildkit import image
    from carry.image.locked import registrycache

    name, version = app.config.image.name, app.version()
    several = len({t.platform for t in app.config.image.platforms} | set(platforms)) > 1
    key = attester.key.public if attester is not None and attester.key is not None else None
    found = {}
    with registry.credentials(name, app.config.image.docker) as login:
        repo = registryhttp.Repository.of(name, login.auth)
        for platform in platforms:
            if options.cache:
                refs = tuple(spec.text.format(arch=platform.tag, version=version) for spec in options.cache)
            else:
                cuda = cuda_tag(app, any("{cuda}" in t for t in app.config.image.tags))
                tags = image.render_tags(app.config, version, app.series(), cuda) + options.extra_tags
                own = (image.own_tag(version, platform),) if several else ()
                refs = (*own, *tags)
            refs = registrycache.candidates(refs, name)
            found[platform] = registrycache.find(repo, name, platform, refs, key)
            reporter.phase("cache", found[platform].line())
    return found
