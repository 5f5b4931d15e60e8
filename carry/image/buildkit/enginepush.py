"""A Dockerfile-built platform image pushed from the Docker engine over the registry's HTTP API, not with `docker push`,
which cannot push an image without moving a tag (the order is carry.image.publish's): `docker save`'s layer tars
compressed as the locked image's base layers are (layerpush.push_engine_layers, remembered by diff_id), the engine's own
config bytes, and a Docker v2 manifest of both: the same image gives the same digest."""

from __future__ import annotations

from typing import TYPE_CHECKING

from carry.image import publish, registryhttp
from carry.image.layerpush import Digests, EngineImage, push_config, push_engine_layers
from carry.platforms import Platform
from carry.util import reporter
from carry.util.errors import Failed

if TYPE_CHECKING:
    import docker


def push(
    repo: registryhttp.Repository,
    client: docker.DockerClient,
    ref: str,
    platform: Platform,
    refs: tuple[str, ...],
    digests: Digests,
) -> publish.Manifest:
    """The engine's image `ref` pushed unless the registry has it; its manifest for the caller to PUT."""
    try:
        inspect = client.api.inspect_image(ref)
    except Exception as exc:  # docker.errors.ImageNotFound: the build tagged it a moment ago
        raise Failed(f"{ref}: not in the Docker engine after its build ({exc})") from None
    layers, config = push_engine_layers(repo, client, EngineImage(inspect, ref, platform), digests, True)
    assert config is not None  # want_config: pushed or failed
    body, action = push_config(repo, config, layers)
    reporter.phase("push", f"{platform}: {len(layers)} layers, config {action}")
    return publish.Manifest(platform, body, registryhttp.DOCKER_MANIFEST, refs)
