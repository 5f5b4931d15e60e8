"""Multi-platform tags: a shared tag (VERSION, `latest`, the templates) becomes a manifest list of the platforms'
own images (`<VERSION>-<arch>`), made with the tools that exist: `docker buildx imagetools create` where buildx
is present, else the Docker CLI's `docker manifest create/annotate/push`. Then it is read back from the registry:
carry says a shared tag is done only when the registry lists every platform under it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from carry.image.buildkit.container import Builder
from carry.platforms import Platform
from carry.util.errors import Failed
from carry.util.run import NETWORK_S, execute

if TYPE_CHECKING:
    import docker

    from carry.image.registry import Login


def join(client: docker.DockerClient, builder: Builder, login: Login, ref: str, sources: dict[Platform, str]) -> str:
    """Point `ref` at a manifest list of `sources` (platform -> its image's ref, already in the registry);
    return the list's digest once the registry names every platform under `ref`."""
    from carry.image import registry

    if builder.buildx:
        _run(login, [builder.docker, "buildx", "imagetools", "create", "--tag", ref, *sources.values()], ref)
    else:
        plain_http = ["--insecure"] if registry.insecure(client, login.registry) else []
        _run(login, [builder.docker, "manifest", "create", "--amend", *plain_http, ref, *sources.values()], ref)
        for platform, source in sources.items():
            annotate = [builder.docker, "manifest", "annotate", "--os", platform.os, "--arch", platform.architecture]
            if platform.variant:
                annotate += ["--variant", platform.variant]
            _run(login, [*annotate, ref, source], ref)
        _run(login, [builder.docker, "manifest", "push", "--purge", *plain_http, ref], ref)
    found = registry.remote_platforms(client, ref, login)
    if found is None or set(found[1]) != set(sources):
        listed = ", ".join(str(p) for p in found[1]) if found else "nothing"
        raise Failed(f"{ref} in the registry lists {listed}, not {', '.join(str(p) for p in sources)}")
    return found[0]


def _run(login: Login, command: list[str], ref: str) -> None:
    result = execute(command, env=login.cli_env(), text=True, timeout=NETWORK_S)
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise Failed(
            f"{' '.join(command[1:3])} for {ref} failed (exit {result.returncode}): {said[-1] if said else 'no output'}"
        )
