"""Talking to the Docker engine and registries through the Docker SDK; credentials never touch argv or logs.

Credentials come from the user's Docker config (`docker login --password-stdin` done beforehand) or from
$CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD, which carry hands to `docker login --password-stdin`
in a private, temporary DOCKER_CONFIG and then reads back for the SDK.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import docker
import docker.auth
import docker.errors

from carry.errors import BadInput, Failed

USER_ENV = "CARRY_REGISTRY_USER"
PASSWORD_ENV = "CARRY_REGISTRY_PASSWORD"


def client() -> docker.DockerClient:
    try:
        found = docker.from_env(timeout=600)
        found.ping()
    except docker.errors.DockerException as exc:
        raise BadInput(f"cannot reach the Docker engine ({_short(exc)}); start dockerd or set DOCKER_HOST") from None
    return found


def registry_of(image_name: str) -> str:
    """The registry host of an image name (Docker Hub when the first part is not a host)."""
    first, _, rest = image_name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


@contextlib.contextmanager
def credentials(image_name: str, docker_cli: str) -> Iterator[dict | None]:
    """The auth config for the image's registry: from the env via `docker login --password-stdin`, or
    from the user's Docker config, or None (anonymous)."""
    registry = registry_of(image_name)
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if not (user and password):
        config = docker.auth.load_config()
        yield docker.auth.resolve_authconfig(config, registry) or None
        return
    with tempfile.TemporaryDirectory(prefix="carry-docker-config-") as config_dir:
        os.chmod(config_dir, 0o700)
        login = subprocess.run(
            [docker_cli, "login", "--username", user, "--password-stdin", registry],
            input=password, text=True, capture_output=True, env={**os.environ, "DOCKER_CONFIG": config_dir},
        )
        if login.returncode != 0:
            reason = login.stderr.strip().splitlines()[-1] if login.stderr.strip() else "refused"
            raise Failed(f"login to {registry} as {user} failed: {_redact(reason, password)}")
        config = docker.auth.load_config(config_path=str(Path(config_dir) / "config.json"))
        yield docker.auth.resolve_authconfig(config, registry)


def push(found: docker.DockerClient, ref: str, auth: dict | None) -> str:
    """Push `ref`; return the digest the registry reports. Errors in the stream raise `Failed`."""
    repository, tag = ref.rsplit(":", 1)
    digest = ""
    for event in found.api.push(repository, tag=tag, stream=True, decode=True, auth_config=auth):
        if "error" in event:
            raise Failed(f"push of {ref} refused: {event['error']}")
        digest = event.get("aux", {}).get("Digest", digest)
    return digest


def get_or_pull(found: docker.DockerClient, ref: str, docker_cli: str):
    """The local image for `ref`, pulled first when it is not here."""
    try:
        return found.images.get(ref)
    except docker.errors.ImageNotFound:
        pass
    with credentials(ref, docker_cli) as auth:
        try:
            return found.images.pull(ref, auth_config=auth)
        except docker.errors.APIError as exc:
            raise Failed(f"cannot pull {ref}: {_short(exc)}") from None


def run(found: docker.DockerClient, image_id: str, command: list[str]) -> str:
    """Run `command` in a container of the image without network; return its output, fail on non-zero."""
    container = found.containers.create(image_id, command=command, network_disabled=True)
    try:
        container.start()
        status = container.wait(timeout=300)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    if status.get("StatusCode") != 0:
        raise Failed(f"{' '.join(command[:2])} in {image_id[:19]} exited {status.get('StatusCode')}: {output[-400:]}")
    return output


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


def _redact(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text
