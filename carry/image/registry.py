"""Talking to the Docker engine and registries through the Docker SDK; credentials never touch argv or logs: the user's
Docker config, or $CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD handed to `docker login --password-stdin` in a
private, temporary DOCKER_CONFIG and read back for the SDK."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import ipaddress
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import docker
import docker.auth
import docker.errors

from carry.image import registryhttp
from carry.image.registryhttp import PASSWORD_ENV, USER_ENV, registry_of
from carry.platforms import Platform
from carry.util import fsutil, redact
from carry.util.errors import BadInput, Failed
from carry.util.run import execute

if TYPE_CHECKING:
    from docker.models.containers import Container
    from docker.models.images import Image

CONFIG_PREFIX = "carry-docker-config-"


def client() -> docker.DockerClient:
    try:
        found = docker.from_env(timeout=600)
        found.ping()
    except docker.errors.DockerException as exc:
        raise BadInput(f"cannot reach the Docker engine ({_short(exc)}); start dockerd or set DOCKER_HOST") from None
    return found


@dataclasses.dataclass(frozen=True)
class Login:
    """Credentials for one registry: `auth` for the SDK, `docker_config` (a DOCKER_CONFIG dir, None: the user's
    own) for Docker CLI commands that talk to the registry themselves (pulls, BuildKit's cache)."""

    registry: str
    auth: dict | None
    docker_config: str | None

    def cli_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.docker_config is not None:
            env["DOCKER_CONFIG"] = self.docker_config
        return env


@contextlib.contextmanager
def credentials(image_name: str, docker_cli: str) -> Iterator[Login]:
    """The login for the image's registry (from the env through `docker login --password-stdin` into a private
    DOCKER_CONFIG, the user's Docker config, or none), after `probe` asked the registry."""
    registry = registry_of(image_name)
    auth = _auth(registry)
    _probe(image_name, auth)
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if not (user and password):
        yield Login(registry, auth, None)
        return
    # docker writes the login into the dir: named by this process, so the next carry deletes one a SIGKILL left
    fsutil.sweep_dead(Path(tempfile.gettempdir()), CONFIG_PREFIX)
    with tempfile.TemporaryDirectory(prefix=fsutil.owned_prefix(CONFIG_PREFIX)) as config_dir:
        os.chmod(config_dir, 0o700)
        login = execute(
            [docker_cli, "login", "--username", user, "--password-stdin", registry],
            stdin=password,
            text=True,
            env={**os.environ, "DOCKER_CONFIG": config_dir},
            timeout=120,
        )
        if login.returncode != 0:
            reason = login.stderr.strip().splitlines()[-1] if login.stderr.strip() else "refused"
            raise BadInput(
                f"docker login to {registry} as {user} failed ({redact.secrets(reason, password)}): check "
                f"{USER_ENV} and {PASSWORD_ENV}"
            )
        config = docker.auth.load_config(config_path=str(Path(config_dir) / "config.json"))
        yield Login(registry, docker.auth.resolve_authconfig(config, registry), config_dir)


def probe(image_name: str) -> None:
    """The image's registry asked (`GET /v2/`) with the login `credentials` would use, before any work of a command that
    pushes; not Docker Hub's default name: its API lives on another host."""
    _probe(image_name, _auth(registry_of(image_name)))


def _probe(image_name: str, auth: dict | None) -> None:
    if registry_of(image_name) != "docker.io":
        registryhttp.Repository.of(registryhttp.repository_of(image_name), auth).probe()


def _auth(registry: str) -> dict | None:
    """$CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD, else the user's Docker config for `registry`, else None."""
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if user and password:
        return {"username": user, "password": password}
    return docker.auth.resolve_authconfig(docker.auth.load_config(), registry) or None


def insecure(found: docker.DockerClient, registry: str) -> bool:
    """Whether the engine talks to `registry` over plain HTTP (its insecure registries; loopback by default), so
    that Docker CLI commands which reach the registry themselves must be told so too."""
    config = found.info().get("RegistryConfig", {})
    index = config.get("IndexConfigs", {}).get(registry)
    if index is not None:
        return not index.get("Secure", True)
    host = registry.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(cidr) for cidr in config.get("InsecureRegistryCIDRs", []))


def remote_platforms(found: docker.DockerClient, ref: str, login: Login) -> tuple[str, tuple[Platform, ...]] | None:
    """(digest, platforms) of `ref` in its registry, a manifest list naming several; None when the registry
    answers that it does not have it. A registry that cannot be reached or refuses the login is `Failed`."""
    try:
        data = found.images.get_registry_data(ref, auth_config=login.auth)
    except docker.errors.NotFound:
        return None
    except docker.errors.APIError as exc:
        raise Failed(f"cannot read {ref} from its registry: {_short(exc)}") from None
    platforms = []
    for entry in data.attrs.get("Platforms") or []:
        name = "/".join(part for part in (entry.get("os"), entry.get("architecture"), entry.get("variant")) if part)
        if name == "unknown/unknown":
            continue  # attestation manifests
        platforms.append(Platform.parse(name, f"{ref} in its registry"))
    return data.id, tuple(platforms)


def pull(found: docker.DockerClient, ref: str, platform: Platform, login: Login) -> Image:
    """Pull `platform`'s image of `ref` (replacing what the local tag held)."""
    try:
        return found.images.pull(ref, platform=str(platform), auth_config=login.auth)
    except docker.errors.APIError as exc:
        raise Failed(f"cannot pull {ref} for {platform}: {_short(exc)}") from None


def local(found: docker.DockerClient, ref: str) -> Image | None:
    """The local image for `ref`, or None."""
    try:
        return found.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def image_platform(image: Image) -> Platform:
    attrs = image.attrs
    name = "/".join(part for part in (attrs.get("Os"), attrs.get("Architecture"), attrs.get("Variant")) if part)
    return Platform.parse(name, f"image {image.id[:19]}")


def run(
    found: docker.DockerClient,
    image_id: str,
    command: list[str],
    copy_out: Callable[[str], Iterable[str]] | None = None,
    dest: Path | None = None,
) -> str:
    """Run `command` in a container of the image without network; its output, `copy_out`'s files under `dest`."""
    assert copy_out is None or dest is not None, "copy_out needs dest"
    container = found.containers.create(image_id, command=command, network_disabled=True)
    try:
        container.start()
        status = container.wait(timeout=600)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
        if status.get("StatusCode") == 0 and copy_out is not None and dest is not None:
            for path in copy_out(output):
                _copy_file_out(container, path, dest)
    finally:
        container.remove(force=True)
    if status.get("StatusCode") != 0:
        raise Failed(f"{' '.join(command[:2])} in {image_id[:19]} exited {status.get('StatusCode')}: {output[-400:]}")
    return output


def _copy_file_out(container: Container, path: str, dest: Path) -> None:
    """One regular file of the container into `dest`, at its path under it."""
    stream, _ = container.get_archive(path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
        member = archive.next()
        extracted = archive.extractfile(member) if member is not None and member.isfile() else None
        if extracted is None:
            raise Failed(f"{path} in the image is not a regular file")
        target = dest / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(extracted.read())


def _short(exc: Exception) -> str:
    """What went wrong, in one line: the engine's own explanation where it gives one (not the SDK's URL around it)."""
    explanation = getattr(exc, "explanation", None)
    text = (explanation if isinstance(explanation, str) and explanation.strip() else str(exc)).strip().splitlines()
    return text[-1] if text else type(exc).__name__
