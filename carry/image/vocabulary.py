"""What the image families share, and no family owns: the plan of a build (per platform: its refs, labels and
build args), the label names carry writes and reads back, a platform's own tag, the image's entrypoint and the
Docker CLI to run. The Dockerfile path (buildkit/) makes the plan, the locked path (locked/) writes it, verify
(inspect/) reads the labels back; this module imports none of them."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import carry
from carry.util.errors import BadInput

if TYPE_CHECKING:
    from carry.arch import ArchList
    from carry.config import Config
    from carry.platforms import Platform

LABEL_PREFIX = "io.carry"
WHEEL_LABEL = f"{LABEL_PREFIX}.wheel"  # the distribution name of the wheel installed in the image
ENTRYPOINT = Path(carry.__file__).resolve().parent / "image_files" / "entrypoint.sh"


def own_tag(version: str, platform: Platform) -> str:
    """The tag of one platform's image when a tag holds several: `20260906.1-arm64`."""
    return f"{version}-{platform.tag}"


def docker_binary(config: Config) -> str:
    """`$CARRY_DOCKER`, else image.docker from build.yaml; it must exist."""
    name = os.environ.get("CARRY_DOCKER") or config.image.docker
    found = shutil.which(name)
    if found is None:
        raise BadInput(f"docker binary {name!r} not found; install Docker or set image.docker / $CARRY_DOCKER")
    return found


@dataclasses.dataclass(frozen=True)
class PlatformImage:
    """One platform's image: what it is built from and the local tags it gets."""

    platform: Platform
    arches: ArchList
    refs: tuple[str, ...]
    labels: dict[str, str]
    build_args: dict[str, str]


@dataclasses.dataclass(frozen=True)
class ImagePlan:
    images: tuple[PlatformImage, ...]
    shared: tuple[str, ...]  # tags that name every platform (manifest lists); empty with one platform
    complete: bool  # every platform the config lists is built in this run, so the shared tags can be made
    tree: str
    version: str
    named: bool = True  # the labels name the wheel's distribution; False: the build stage's wheel tells it

    def with_distribution(self, name: str) -> ImagePlan:
        """The plan with `name` in every image's io.carry.wheel label."""
        images = tuple(dataclasses.replace(image, labels={**image.labels, WHEEL_LABEL: name}) for image in self.images)
        return dataclasses.replace(self, images=images, named=True)
