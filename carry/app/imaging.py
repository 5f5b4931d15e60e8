"""What both image paths (BuildKit's, carry/app/image.py, and the locked image's, carry/app/locked.py) share: the
`image` command's request, the attester that signs what they push, the registry asked first, the `{cuda}` tag."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from carry.trust import kinds
from carry.util.record import record

if TYPE_CHECKING:
    from carry.app import App
    from carry.image.attest import Attester
    from carry.image.buildkit.image import ImageOptions


@record(kw_only=True)
class ImageRequest:
    options: ImageOptions
    arch: str | None = None
    smoke: str = "auto"  # auto, full or off (--no-smoke)
    discard_wheels: bool = False


def cuda_tag(app: App, needed: bool = True) -> str:
    """The `{cuda}` of image tags, from this machine's nvcc (probed once a command); "none" when not `needed`."""
    from carry.image.buildkit import image

    return image.cuda_tag(app.toolchain().nvcc_version) if needed else "none"


def attester_for(
    app: App, push: bool, attest: tuple[tuple[str, str], ...] = kinds.DEFAULT, dist: Path = Path("dist")
) -> Attester | None:
    """With --push, what signs and attests the pushed images (carry.image.attest) with the kinds `attest` names, the
    key of $CARRY_SIGNING_KEY loaded now: a bad key or passphrase is bad input before any work."""
    if not push:
        return None
    from carry import __version__
    from carry.image.attest import Attester
    from carry.image.inspect.hermetic import distributions
    from carry.trust import keys

    key = keys.from_environment(os.environ)  # nothing printed yet: a later bad input stays one line
    return Attester(
        key, app.config, app.series(), app.version(), __version__, dist, read_installed=distributions, attest=attest
    )


def registry_answers(app: App, push: bool) -> None:
    """With --push, image.name's registry asked once before any work: unreachable or refusing the login is bad input."""
    if push:
        from carry.image import registry

        registry.probe(app.config.image.name)
