"""Running the top-level Dockerfile: the build context assembled from this repo, the wheelhouse of a hermetic build, and
one BuildKit build per platform through the Docker CLI (buildx where it exists, else `DOCKER_BUILDKIT=1 docker build`),
logged to a file; another CPU's platform builds under its binfmt_misc emulator."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import shlex
import shutil
import sys
from pathlib import Path

import yaml

import carry
from carry.config import Config
from carry.config.reader import strip_credentials
from carry.image.vocabulary import ENTRYPOINT, docker_binary
from carry.platforms import Emulation, Platform
from carry.source import upstream
from carry.util import reporter
from carry.util.cache import Cache
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import write_private
from carry.util.logtail import tail
from carry.util.run import BUILD_S, NETWORK_S, PROBE_S, execute

DOCKERFILE = Path(carry.__file__).resolve().parent / "resources" / "Dockerfile"  # the top-level Dockerfile links here
# What carry itself needs inside the build stage (the docker SDK is only used on the host).
CARRY_REQUIREMENTS: tuple[str, ...] = ("click", "pyyaml", "filelock", "pyelftools", "wheel", "packaging", "build")
CARRY_REQUIREMENTS += ("pyproject_hooks", "uv", "isal")
SECRET_ID = "carry_env"
# The image settings the build stage's `wheel` reads (each platform's arches, the bases); the rest of image (name,
# tags, labels, env, entrypoint, ...) is left out of its build.yaml, so that changing it re-runs no build stage.
STAGE_IMAGE_KEYS = ("platforms", "base_image", "runtime_image", "build_args", "lock", "runtime_python")
# What BuildKit and pip say when a base image cannot be pulled, or the build stage's pip cannot reach the index.
BASE_PULL_FAILED = ("failed to resolve source metadata", "pull access denied", "failed to create LLB definition")
INDEX_UNREACHABLE = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Failed to establish a new connection",
    "CERTIFICATE_VERIFY_FAILED",
    "Network is unreachable",
    "Could not fetch URL",
    "No matching distribution found",
)
WHEEL_STAGE = "wheel"
RUNTIME_STAGE = "runtime"
# Docker 23 dropped BuildKit builds through `DOCKER_BUILDKIT=1 docker build` without the buildx plugin.
FIRST_CLI_NEEDING_BUILDX = 23
# glibc versions whose manylinux wheels a Debian bookworm / Ubuntu 24.04 base can install.
MANYLINUX_GLIBC_MINORS = range(17, 40)


@dataclasses.dataclass(frozen=True)
class Builder:
    """The Docker CLI to build with and whether it has buildx."""

    docker: str
    buildx: bool


def resolve_builder(config: Config, platforms: tuple[Platform, ...]) -> Builder:
    """The Docker CLI to build with, checked before any work (every platform native or emulated): $CARRY_DOCKER or
    image.docker as named, else the first `docker` on PATH with buildx or before Docker 23 (Debian's docker.io)."""
    emulation = Emulation()
    for platform in platforms:
        emulation.require(platform)
    named = os.environ.get("CARRY_DOCKER") or (config.image.docker if config.image.docker != "docker" else None)
    candidates = [docker_binary(config)] if named else _all_on_path("docker") or [docker_binary(config)]
    for docker in candidates:
        if execute([docker, "buildx", "version"], timeout=PROBE_S).returncode == 0:
            return Builder(docker, True)
        if _client_major(docker) < FIRST_CLI_NEEDING_BUILDX:
            return Builder(docker, False)
    tried = ", ".join(f"{docker} (Docker {_client_major(docker)})" for docker in candidates)
    raise BadInput(
        f"no Docker CLI here builds with BuildKit: {tried} lack(s) the buildx plugin, which Docker "
        f"{FIRST_CLI_NEEDING_BUILDX} and later need; install docker-buildx, or set image.docker / "
        f"$CARRY_DOCKER to a Docker CLI before {FIRST_CLI_NEEDING_BUILDX} (Debian's docker.io)"
    )


def _all_on_path(name: str) -> list[str]:
    """Every executable `name` on PATH, in PATH order, each once."""
    found = []
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.realpath(os.path.join(directory or ".", name))
        if os.path.isfile(path) and os.access(path, os.X_OK) and path not in found:
            found.append(path)
    return found


def _client_major(docker: str) -> int:
    """The Docker CLI's major version, from `docker --version` (`Docker version 28.2.2, build ...`)."""
    words = execute([docker, "--version"], text=True, timeout=PROBE_S).stdout.split()
    version = words[2] if len(words) > 2 and words[:2] == ["Docker", "version"] else "0"
    return int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0


def distribution_name(config: Config, pyproject: dict) -> str | None:
    """The upstream's distribution name: build.distribution, else its [project] name (static by PEP 621); None when
    neither says (metadata in setup.cfg or setup.py): then the name of the wheel the build makes tells."""
    name = config.build.distribution or pyproject.get("project", {}).get("name")
    return name if isinstance(name, str) and name else None


def build_requirements(pyproject: dict) -> list[str]:
    """What the build stage installs: carry's own needs plus the upstream's [build-system] requires."""
    return [*CARRY_REQUIREMENTS, *pyproject.get("build-system", {}).get("requires", [])]


def assemble_context(
    config: Config,
    cache: Cache,
    mirror: Path,
    context: Path,
    requirements: list[str],
    platforms: tuple[Platform, ...] = (),
) -> None:
    """carry, the config with VERSION and patches, the pin's bundle (sha256-checked as copied) and `platforms`'
    precompiled wheels: the build stage needs no network for them."""
    project = context / "project"
    project.mkdir(parents=True)
    shutil.copy2(config.version_file, project / _inside(config, config.version_file))
    # The build stage fetches nothing (it has the bundle): a user:token in upstream.url stays out of its layers.
    (project / _inside(config, config.path)).write_text(stage_config(strip_credentials(config.path.read_text())))
    # DROPPED.md stays out: the host checked it against the pin (the stage has only the pin's bundle to tell by).
    shutil.copytree(
        config.patches_dir, project / _inside(config, config.patches_dir), ignore=shutil.ignore_patterns("DROPPED.md")
    )
    package = Path(carry.__file__).resolve().parent
    shutil.copytree(package, context / "carry", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ENTRYPOINT, context / "entrypoint.sh")
    env_lines = "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(config.image.env.items()))
    (context / "runtime.env").write_text(env_lines)
    (context / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements))
    upstream.copy_bundle(mirror, cache, config.upstream.commit, context / "cache" / "bundles")
    _precompiled_wheels(config, cache, platforms, context / "cache" / "downloads")
    (context / "wheelhouse").mkdir()


def stage_config(text: str) -> str:
    """build.yaml as the build stage gets it: the image section without what names, tags, labels or runs the image
    (only STAGE_IMAGE_KEYS stay), so that a change to those is no input of the build stage (its BuildKit cache)."""
    data = yaml.safe_load(text) or {}
    image = data.get("image")
    if isinstance(image, dict):
        data["image"] = {key: value for key, value in image.items() if key in STAGE_IMAGE_KEYS}
    return yaml.safe_dump(data, sort_keys=False)


def _precompiled_wheels(config: Config, cache: Cache, platforms: tuple[Platform, ...], store_dir: Path) -> None:
    """The precompiled wheels laid out as a download store for the build stage, hardlinked where possible: the one hard
    link out of the store carry makes, as the context is carry's own scratch, never published (docs/reliability.md)."""
    from carry.util.download import Store

    settings = config.build.precompiled
    wanted = [settings.wheel_for(p) for p in platforms] if settings else []
    source, inside = Store.from_env(cache.root), Store(store_dir)
    for chosen in filter(None, wanted):
        found = source.get(chosen.pinned)
        target = inside.path(chosen.pinned, found.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(found, target)
        except OSError:
            shutil.copy2(found, target)


def _inside(config: Config, path: Path) -> Path:
    try:
        return path.relative_to(config.root)
    except ValueError:
        raise BadInput(
            f"{config.path}: {path} is outside the config's directory; the image build copies only that "
            f"directory's VERSION and patches, so keep them beside build.yaml"
        ) from None


def hermetic_wheelhouse(
    config: Config,
    cache: Cache,
    building: tuple[Platform, ...],
    requirements: list[str],
    given: Path | None,
    dest: Path,
) -> None:
    """The wheelhouse of a hermetic build: wheels for every platform the config lists and every one being built,
    the same set whatever is built now, so that `wheel --platform` and `image` share BuildKit's build stage."""
    platforms = tuple(dict.fromkeys([*(t.platform for t in config.image.platforms), *building]))
    reporter.phase(
        "wheelhouse",
        f"{len(requirements)} requirement(s) for {', '.join(map(str, platforms))}, for a --network=none build",
    )
    for platform in platforms:
        fill_wheelhouse(cache, requirements, given, dest, platform)


def fill_wheelhouse(cache: Cache, requirements: list[str], given: Path | None, dest: Path, platform: Platform) -> None:
    """Wheels for a --network=none build stage on `platform`: from --wheelhouse, or downloaded once per platform into
    the cache (for this Python's version) under a lock, a second run at once waiting, then copying whole wheels."""
    if given is not None:
        _copy_wheels(given, dest)
        return
    given = cache.root / "wheelhouse" / platform.tag
    with cache.lock(f"wheelhouse-{platform.tag}"):
        given.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
        command += ["--only-binary=:all:", "-d", str(given), *_target_flags(platform), *requirements]
        result = execute(command, text=True, timeout=NETWORK_S)
        if result.returncode != 0:
            raise Failed(
                f"pip download of {platform} wheels for the wheelhouse failed: "
                f"{result.stderr.strip().splitlines()[-1:]}; pass --wheelhouse DIR with the wheels"
            )
        _copy_wheels(given, dest)


def _copy_wheels(source: Path, dest: Path) -> None:
    for wheel in source.glob("*.whl"):
        shutil.copy2(wheel, dest / wheel.name)


def _target_flags(platform: Platform) -> list[str]:
    """pip's flags for wheels that install on `platform` (none for this machine's own)."""
    if platform is Platform.native():
        return []
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    tags = [f"manylinux_2_{minor}_{platform.machine}" for minor in MANYLINUX_GLIBC_MINORS]
    tags += [f"manylinux2014_{platform.machine}", f"linux_{platform.machine}"]
    flags = ["--python-version", version, "--implementation", "cp", "--abi", f"cp{version}"]
    for tag in tags:
        flags += ["--platform", tag]
    return flags


def secret_file(config: Config, scratch: Path, extra: dict[str, str] | None = None) -> Path | None:
    """image.secret_env values from carry's environment, and `extra`, in a 0600 file handed to BuildKit as a
    secret (sourced by the build stage's RUN, never in a layer, an argument or the cache key)."""
    values = {name: os.environ[name] for name in config.image.secret_env if os.environ.get(name)}
    values.update(extra or {})
    if not values:
        return None
    return write_private(
        scratch / "secret.env", "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(values.items()))
    )


@dataclasses.dataclass(frozen=True)
class StageAccess:
    """What a build stage gets besides its context: the secret file and the network it builds on."""

    secret: Path | None
    network: str | None  # none (hermetic), host (to reach a compile cache on loopback), None: the engine's own


def stage_access(config: Config, scratch: Path, hermetic: bool) -> StageAccess:
    """The secret file (the compile cache's URL and credentials for the stage's `build.py wheel`) and the build's
    network: a hermetic build cannot reach the cache, so the stage builds without it; one on loopback needs the
    host's."""
    from carry.wheelbuild import compilecache, distbuild

    remote = compilecache.remote_setting(config, os.environ)
    network = "none" if hermetic else None
    extra: dict[str, str] = {}
    distributed = distbuild.setting(config, os.environ)
    if distributed is not None or config.build.distributed is not None:
        # the build cluster is not handed to the stage yet (issue 51): its compiles run in the stage
        extra[distbuild.URL_ENV] = "none"
        if distributed is not None:
            reporter.phase("distributed", f"{distributed} not used in the build stage: it compiles there itself")
    if remote is None and config.build.remote_cache is not None:
        extra[compilecache.URL_ENV] = "none"  # turned off here ($CARRY_REMOTE_CACHE_URL=none): off in the stage too
    elif remote is not None and hermetic:
        reporter.phase(
            "remote cache",
            f"{remote} not used in the build stage: a --hermetic build has no network; "
            f"it compiles with its own cache mount",
        )
        extra[compilecache.URL_ENV] = "none"
    elif remote is not None:
        extra[compilecache.URL_ENV] = str(remote)
        extra.update(
            {
                name: os.environ[name]
                for name in (compilecache.USER_ENV, compilecache.PASSWORD_ENV)
                if os.environ.get(name)
            }
        )
        if _loopback(remote.host):
            network = "host"
        reporter.phase(
            "remote cache",
            f"{remote} handed to the build stage as a BuildKit secret"
            + ("; on loopback, so the build uses the host's network" if network else ""),
        )
    return StageAccess(secret_file(config, scratch, extra), network)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class StageBuild:
    """One BuildKit build of a Dockerfile stage for one platform."""

    platform: Platform
    stage: str
    build_args: dict[str, str]
    network: str | None
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    tags: tuple[str, ...] = ()
    output_dir: Path | None = None  # export the stage's files here instead of loading an image
    cache_args: tuple[str, ...] = ()  # --cache-from/--cache-to flags (carry.image.buildkit.layercache)

    def command(self, builder: Builder, secret: Path | None, context: Path) -> list[str]:
        docker = builder.docker
        command = [docker, "buildx", "build"] if builder.buildx else [docker, "build"]
        command += ["--progress=plain", "--file", str(DOCKERFILE), "--target", self.stage]
        command += ["--platform", str(self.platform)]
        if self.output_dir is not None:
            command += ["--output", f"type=local,dest={self.output_dir}"]
        elif builder.buildx:
            command.append("--load")  # one platform per build: the docker driver loads single-platform results
        if not builder.buildx:
            command.append("--force-rm")
        if self.network is not None:
            command.append(f"--network={self.network}")
            if self.network == "host" and builder.buildx:
                command += ["--allow", "network.host"]
        command += self.cache_args
        if secret is not None:
            command += ["--secret", f"id={SECRET_ID},src={secret}"]
        for name, value in sorted(self.build_args.items()):
            command += ["--build-arg", f"{name}={value}"]
        for name, value in sorted(self.labels.items()):
            command += ["--label", f"{name}={value}"]
        for ref in self.tags:
            command += ["--tag", ref]
        return [*command, str(context)]

    def run(
        self, builder: Builder, secret: Path | None, context: Path, log: Path, env: dict[str, str] | None = None
    ) -> str:
        """Build with the CLI's `env`, streaming BuildKit's output to `log` and returning it; fail with its tail."""
        log.parent.mkdir(parents=True, exist_ok=True)
        start = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as handle:
            handle.write(f"== {self.stage} for {self.platform}\n".encode())
            handle.flush()
            status = execute(
                self.command(builder, secret, context),
                env={**(env or os.environ), "DOCKER_BUILDKIT": "1"},
                log=handle,
                timeout=BUILD_S,
            ).returncode
        with open(log, "rb") as handle:
            handle.seek(start)
            output = handle.read().decode(errors="replace")
        if status != 0:
            hint = self.hint(output)
            raise Failed(
                f"docker build of {self.stage} for {self.platform} failed (exit {status}){hint}; log: {log}\n"
                f"{tail(log)}"
            )
        return output

    def hint(self, output: str) -> str:
        """The way out of a failed build carry knows: a base image that cannot be pulled, or an unreachable index."""
        if any(sign in output for sign in BASE_PULL_FAILED):
            bases = (
                ", ".join(
                    f"{name}={self.build_args[name]}"
                    for name in ("BASE_IMAGE", "RUNTIME_IMAGE")
                    if name in self.build_args
                )
                or "the Dockerfile's defaults"
            )
            return (
                f": a base image could not be pulled ({bases}); pull it first, or set image.base_image and "
                f"image.runtime_image (or image.platforms' own) to images this Docker engine has"
            )
        if self.network != "none" and any(sign in output for sign in INDEX_UNREACHABLE):
            return (
                ": pip in the build stage could not reach the package index; build with --hermetic (its "
                "requirements downloaded here, through your index settings, into a wheelhouse; the stage offline)"
            )
        return ""


def python_bases() -> tuple[str, str]:
    """The bases of a Python-only image (no CUDA arches): the Python image of the Python carry runs on, whose build
    stage has git and a compiler, and its slim variant to run (the same Python: a --hermetic wheelhouse fits both)."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"python:{python}", f"python:{python}-slim"


def stage_args(
    config: Config, platform: Platform, arches: str, hermetic: bool, upstream_version: str | None = None
) -> dict[str, str]:
    """The build stage's build args for `platform`, the same for `wheel --platform` and `image` so that BuildKit reuses
    one's build stage for the other; a Python-only build (arches `none`) defaults to Python's own images."""
    target = config.target(platform)
    args = {
        **config.image.build_args,
        "CARRY_CONFIG": "project/" + config.path.name,
        "CARRY_ARCHES": arches,
        "PIP_INSTALL_ARGS": "--no-index --find-links=/carry/wheelhouse" if hermetic else "",
    }
    if upstream_version is not None:
        args["CARRY_UPSTREAM_VERSION"] = upstream_version
    build_base, runtime_base = python_bases() if arches == "none" else (None, None)
    for name, value in (
        ("BASE_IMAGE", target.base_image or config.image.base_image or build_base),
        ("RUNTIME_IMAGE", target.runtime_image or config.image.runtime_image or runtime_base),
    ):
        if value:
            args[name] = value
    return args
