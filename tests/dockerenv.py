"""The docker engine, registry and base images that image tests use.

`.ci/services.sh` and `.ci/base-images.sh` set them up and record them as KEY=VALUE
lines in an env file ($CARRY_CI_ENV, default /tmp/carry-ci/env); variables of the same
name in the environment win. The registry password is only ever read from its file.

Outside CI a missing service skips the test; with $CI set it fails it, so image tests
cannot silently vanish from a CI run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

DOCKER_CLI = "/usr/bin/docker"
DEFAULT_ENV_FILE = "/tmp/carry-ci/env"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
KEYS = (
    "DOCKER_HOST",
    "CARRY_TEST_REGISTRY",
    "CARRY_TEST_REGISTRY_USER",
    "CARRY_TEST_REGISTRY_PASSWORD_FILE",
    "CARRY_TEST_BUILD_BASE",
    "CARRY_TEST_RUNTIME_BASE",
    "CARRY_TEST_BUILD_BASE_ARM64",
    "CARRY_TEST_RUNTIME_BASE_ARM64",
)
SETUP_HINT = "run `bash .ci/services.sh && bash .ci/base-images.sh` as root"


@dataclass(frozen=True)
class DockerEnv:
    """Connection facts for the test engine and registry, and the base image names."""

    docker_host: str
    registry: str
    registry_user: str
    password_file: Path
    build_base: str
    runtime_base: str
    build_base_arm64: str
    runtime_base_arm64: str

    def registry_password(self) -> str:
        """The registry password, read from its mode-600 file."""
        return self.password_file.read_text().strip()

    def bases(self, platform: str) -> tuple[str, str]:
        """(build base, runtime base) for linux/amd64 or linux/arm64."""
        if platform == "linux/arm64":
            return self.build_base_arm64, self.runtime_base_arm64
        return self.build_base, self.runtime_base

    def image_section(self, name: str, platforms: tuple[str, ...] = ("linux/amd64",), extra: str = "") -> str:
        """build.yaml's image section for the demo built FROM the test bases; arm64 keeps to arch 12.1."""
        lines = ["image:", f"  name: {name}", '  tags: ["{version}", "{version}-cu{cuda}", "latest"]', "  platforms:"]
        for platform in platforms:
            build, runtime = self.bases(platform)
            lines += [f"    {platform}:", f"      base_image: {build}", f"      runtime_image: {runtime}"]
            if platform == "linux/arm64":
                lines.append('      cuda_arches: "12.1"')
        return "\n".join(lines) + "\n" + extra


def set_image_section(config: Path, section: str) -> None:
    """Replace the image section that ends `config` (as in examples/demo/build.yaml) with `section`."""
    text = config.read_text()
    config.write_text(text[: text.index("\nimage:\n") + 1] + section)


def env_file() -> Path:
    return Path(os.environ.get("CARRY_CI_ENV", DEFAULT_ENV_FILE))


def remove_repository(name: str) -> None:
    """A repository a test pushed to the test registry (`host/path`, no tag) removed from the registry's storage
    (beside the env file, as .ci/services.sh lays it out), with every blob (layer, config or manifest) no other
    repository links and the folders it leaves empty: tests leave no registry blob behind. The registry keeps no blob
    cache, so a later push of the same blob uploads it."""
    import shutil

    root = env_file().parent / "registry" / "data" / "docker" / "registry" / "v2"
    repositories = root / "repositories"
    path = repositories / name.split("/", 1)[1]

    def linked(under: Path, deep: str = "") -> set[str]:
        return {p.name for links in ("_layers", "_manifests/revisions") for p in under.glob(f"{deep}{links}/sha256/*")}

    mine = linked(path)
    shutil.rmtree(path, ignore_errors=True)
    for digest in mine - linked(repositories, "**/"):
        shutil.rmtree(root / "blobs" / "sha256" / digest[:2] / digest, ignore_errors=True)
    for parent in path.parents:
        if parent == repositories or not parent.is_dir() or any(parent.iterdir()):
            break
        with contextlib.suppress(OSError):  # a push beside this one made it again
            parent.rmdir()


def forget(name: str, made: Iterable[str] = ()) -> None:
    """What a test pushed under `name`: its local images (any tag; and the ids in `made`, images of it that a later
    push left without a tag) and its repository in the test registry."""
    import docker

    client = docker_client()
    for image_id in {image.id for image in client.images.list(name=name)} | set(made):
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(image_id, force=True)
    remove_repository(name)


def _read_env_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def recorded(key: str) -> str:
    """One fact of the env file (a tool's path, say), the environment's variable of that name winning; "" when
    neither has it."""
    return os.environ.get(key) or _read_env_file(env_file()).get(key, "")


def _settings() -> dict[str, str]:
    settings = _read_env_file(env_file())
    settings.update({key: os.environ[key] for key in KEYS if os.environ.get(key)})
    settings.setdefault("DOCKER_HOST", DEFAULT_DOCKER_HOST)
    return settings


def load() -> DockerEnv:
    """The recorded facts; raises LookupError naming what was never set up."""
    settings = _settings()
    missing = [key for key in KEYS if not settings.get(key)]
    if missing:
        names = ", ".join(missing)
        raise LookupError(f"{names} not set (looked in {env_file()} and the environment)")
    return DockerEnv(
        docker_host=settings["DOCKER_HOST"],
        registry=settings["CARRY_TEST_REGISTRY"],
        registry_user=settings["CARRY_TEST_REGISTRY_USER"],
        password_file=Path(settings["CARRY_TEST_REGISTRY_PASSWORD_FILE"]),
        build_base=settings["CARRY_TEST_BUILD_BASE"],
        runtime_base=settings["CARRY_TEST_RUNTIME_BASE"],
        build_base_arm64=settings["CARRY_TEST_BUILD_BASE_ARM64"],
        runtime_base_arm64=settings["CARRY_TEST_RUNTIME_BASE_ARM64"],
    )


def docker_client() -> docker.DockerClient:
    """An SDK client for the test engine ($DOCKER_HOST, default the local socket)."""
    return docker.DockerClient(base_url=_settings()["DOCKER_HOST"], timeout=600)


def cli_env(docker_config: Path | None = None) -> dict[str, str]:
    """Environment for running DOCKER_CLI against the test engine, BuildKit on."""
    env = dict(os.environ, DOCKER_HOST=_settings()["DOCKER_HOST"], DOCKER_BUILDKIT="1")
    if docker_config is not None:
        env["DOCKER_CONFIG"] = str(docker_config)
    return env


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def _registry_problem(registry: str) -> str | None:
    try:
        urllib.request.urlopen(f"http://{registry}/v2/", timeout=5)
    except urllib.error.HTTPError as answer:
        if answer.code == 401:
            return None
        return f"registry {registry} answered {answer.code} on /v2/, expected 401"
    except OSError as error:
        return f"registry {registry} is not reachable: {error}"
    return f"registry {registry} accepts anonymous requests; expected htpasswd auth"


@functools.cache
def _problem() -> str | None:
    """Why the docker tests cannot run here, or None when everything answers."""
    try:
        env = load()
        client = docker_client()
        client.ping()
        for image in (env.build_base, env.runtime_base, env.build_base_arm64, env.runtime_base_arm64):
            client.images.get(image)
        env.registry_password()
    except (LookupError, OSError, docker.errors.DockerException) as error:
        return f"docker test services unavailable: {error}; {SETUP_HINT}"
    return _registry_problem(env.registry)


PYLESS_KEYS = {"linux/amd64": "CARRY_TEST_PYLESS_BASE", "linux/arm64": "CARRY_TEST_PYLESS_BASE_ARM64"}


def require_pyless() -> dict[str, str]:
    """The minimal Debian images without python3 (NVIDIA's runtime images' stand-in, .ci/base-images.sh) per
    platform, after require(); skip the test (fail it when $CI is set) when they were not built."""
    require()
    settings = _settings()
    settings.update({key: os.environ[key] for key in PYLESS_KEYS.values() if os.environ.get(key)})
    found = {platform: settings.get(key, "") for platform, key in PYLESS_KEYS.items()}
    client = docker_client()
    for image in found.values():
        try:
            client.images.get(image)
        except (docker.errors.DockerException, docker.errors.NullResource) as error:
            problem = f"the python-less base images are missing ({error}); {SETUP_HINT}"
            if in_ci():
                pytest.fail(f"{problem} (CI is set, so this fails instead of skipping)", pytrace=False)
            pytest.skip(problem)
    return found


def require() -> DockerEnv:
    """The DockerEnv, or skip the test (fail it when $CI is set) if any part is missing."""
    problem = _problem()
    if problem is None:
        return load()
    if in_ci():
        pytest.fail(f"{problem} (CI is set, so this fails instead of skipping)", pytrace=False)
    pytest.skip(problem)


def requires_docker(test: Callable) -> Callable:
    """Decorate a test that needs the engine, registry and base images (see require)."""

    @functools.wraps(test)
    def checked(*args, **kwargs):
        require()
        return test(*args, **kwargs)

    return checked


def login(docker_config: Path, registry: str, user: str, password: str) -> subprocess.CompletedProcess:
    """`docker login` into DOCKER_CONFIG=docker_config; the password goes over stdin."""
    return subprocess.run(
        [DOCKER_CLI, "login", "--username", user, "--password-stdin", registry],
        input=password,
        env=cli_env(docker_config),
        capture_output=True,
        text=True,
        timeout=120,
    )


@contextlib.contextmanager
def logged_in(env: DockerEnv) -> Iterator[dict[str, str]]:
    """Log in with the test credentials in a throwaway DOCKER_CONFIG.

    Yields the environment for DOCKER_CLI calls that should use that login; the
    config dir, and the credentials docker stored in it, are deleted afterwards.
    """
    with tempfile.TemporaryDirectory(prefix="carry-docker-config-") as config:
        result = login(Path(config), env.registry, env.registry_user, env.registry_password())
        if result.returncode != 0:
            raise RuntimeError(f"docker login to {env.registry} failed: {result.stderr.strip()}")
        yield cli_env(Path(config))
