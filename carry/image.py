"""The container image: a build context assembled from this repo, a BuildKit build through the Docker CLI,
tags and labels from VERSION and the series, push and pull through the Docker SDK, and verification."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import carry
from carry import upstream
from carry.apply import CheckReport
from carry.arch import ArchList
from carry.cache import Cache
from carry.config import PLATFORM_RE, TAG_RE, Config, public_url, strip_credentials
from carry.errors import BadInput, Failed
from carry.fsutil import temp_dir
from carry.progress import Progress
from carry.series import Series
from carry.verify import Expected, Mismatch, Verification, compare
from carry.wheel import tail

DOCKERFILE = Path(carry.__file__).resolve().parent.parent / "Dockerfile"
ENTRYPOINT = Path(carry.__file__).resolve().parent / "image_files" / "entrypoint.sh"
# What carry itself needs inside the build stage (the docker SDK is only used on the host).
CARRY_REQUIREMENTS = ("click", "pyyaml", "gitpython", "filelock", "pyelftools", "wheel", "packaging", "build")
LABEL_PREFIX = "io.carry"
SECRET_ID = "carry_env"
BUILDINFO_SCRIPT = """
import importlib, importlib.metadata as metadata, json, sys
dist = metadata.distribution(sys.argv[1])
top = (dist.read_text("top_level.txt") or sys.argv[1]).split()[0]
importlib.import_module(top)
print(dist.read_text("carry-buildinfo.json"))
"""


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """`image` flags, resolved once."""

    push: bool
    extra_tags: tuple[str, ...]
    platforms: tuple[str, ...]
    hermetic: bool
    wheelhouse: Path | None
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for tag in self.extra_tags:
            if not TAG_RE.fullmatch(tag):
                raise BadInput(f"--tag {tag!r} is not a valid tag; use letters, digits, '_', '.', '-' (at most 128)")
        for platform in self.platforms:
            if not PLATFORM_RE.fullmatch(platform):
                raise BadInput(f"--platform {platform!r} is not OS/ARCH[/VARIANT]; use e.g. linux/arm64")


@dataclasses.dataclass(frozen=True)
class ImagePlan:
    refs: tuple[str, ...]
    labels: dict[str, str]
    build_args: dict[str, str]
    arches: ArchList
    dist_name: str


@dataclasses.dataclass(frozen=True)
class ImageResult:
    refs: tuple[str, ...]
    image_id: str
    pushed: dict[str, str]
    notes: tuple[str, ...]


def docker_binary(config: Config) -> str:
    """`$CARRY_DOCKER`, else image.docker from build.yaml; it must exist."""
    name = os.environ.get("CARRY_DOCKER") or config.image.docker
    found = shutil.which(name)
    if found is None:
        raise BadInput(f"docker binary {name!r} not found; install Docker or set image.docker / $CARRY_DOCKER")
    return found


def has_buildx(docker: str) -> bool:
    return subprocess.run([docker, "buildx", "version"], capture_output=True).returncode == 0


def render_tags(config: Config, version: str, series: Series, cuda: str) -> tuple[str, ...]:
    fields = {
        "version": version,
        "base_short": config.upstream.commit[:12],
        "cuda": cuda,
        "series_short": series.hash[:12],
    }
    tags = []
    for template in config.image.tags:
        tag = template.format(**fields)
        if tag not in tags:
            tags.append(tag)
    return tuple(tags)


def cuda_tag(nvcc_version: str | None) -> str:
    """`130` from nvcc's `release 13.0, V13.0.88` line."""
    if nvcc_version and "release " in nvcc_version:
        release = nvcc_version.split("release ", 1)[1].split(",", 1)[0]
        return release.replace(".", "")
    return "none"


def plan(
    config: Config,
    report: CheckReport,
    series: Series,
    version: str,
    arches: ArchList,
    dist_name: str,
    cuda: str,
    options: ImageOptions,
) -> ImagePlan:
    if report.tree is None:
        raise Failed("the series does not apply; run `check` for details")
    tags = render_tags(config, version, series, cuda) + options.extra_tags
    refs = tuple(dict.fromkeys(f"{config.image.name}:{tag}" for tag in tags))
    labels = {
        **config.image.labels,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": report.base,
        "org.opencontainers.image.source": public_url(config.upstream.url),
        "org.opencontainers.image.created": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        ),
        f"{LABEL_PREFIX}.version": version,
        f"{LABEL_PREFIX}.upstream.url": public_url(config.upstream.url),
        f"{LABEL_PREFIX}.upstream.pr": str(config.upstream.pr or ""),
        f"{LABEL_PREFIX}.upstream.commit": report.base,
        f"{LABEL_PREFIX}.series.hash": series.hash,
        f"{LABEL_PREFIX}.patches": ",".join(p.name for p in series.patches),
        f"{LABEL_PREFIX}.cuda_arches": str(arches),
        f"{LABEL_PREFIX}.tree": report.tree,
        f"{LABEL_PREFIX}.wheel": dist_name,
    }
    build_args = {
        **config.image.build_args,
        "CARRY_CONFIG": "project/" + config.path.name,
        "CARRY_ARCHES": str(arches),
        "PIP_INSTALL_ARGS": "--no-index --find-links=/carry/wheelhouse" if options.hermetic else "",
    }
    for name, value in (("BASE_IMAGE", config.image.base_image), ("RUNTIME_IMAGE", config.image.runtime_image)):
        if value:
            build_args[name] = value
    return ImagePlan(refs, labels, build_args, arches, dist_name)


def upstream_pyproject(text: str | None) -> dict:
    """The upstream's pyproject.toml as a dict (empty when it has none)."""
    try:
        return tomllib.loads(text) if text else {}
    except tomllib.TOMLDecodeError as exc:
        raise Failed(f"the upstream's pyproject.toml does not parse ({exc})") from None


def distribution_name(pyproject: dict) -> str:
    """The upstream's distribution name, from [project] name."""
    name = pyproject.get("project", {}).get("name")
    if not name:
        raise BadInput("the upstream's pyproject.toml has no [project] name; carry cannot tell which wheel to verify")
    return name


def build_requirements(pyproject: dict) -> list[str]:
    """What the build stage installs: carry's own needs plus the upstream's [build-system] requires."""
    return [*CARRY_REQUIREMENTS, *pyproject.get("build-system", {}).get("requires", [])]


@dataclasses.dataclass(frozen=True)
class Builder:
    """The Docker CLI to build with, whether it has buildx, and the platforms it will build."""

    docker: str
    buildx: bool
    platforms: tuple[str, ...]
    notes: tuple[str, ...]


def resolve_builder(config: Config, options: ImageOptions) -> Builder:
    """Decide how to build before any work starts; without buildx only the native platform is possible."""
    docker = docker_binary(config)
    buildx = has_buildx(docker)
    platforms = options.platforms or config.image.platforms
    if options.cache_to and not buildx:
        raise BadInput(f"--cache-to needs buildx, which {docker} lacks; drop it or install docker-buildx")
    if buildx or not platforms:
        return Builder(docker, buildx, platforms, ())
    native = _native_platform()
    if native not in platforms:
        raise BadInput(
            f"without buildx ({docker}) only the native platform {native} can be built, not "
            f"{', '.join(platforms)}; install docker-buildx or build on a {', '.join(platforms)} machine"
        )
    others = [p for p in platforms if p != native]
    notes = (f"without buildx only the native platform {native} can be built; skipping {', '.join(others)}",)
    return Builder(docker, buildx, (), notes if others else ())


def build(
    config: Config,
    cache: Cache,
    mirror: Path,
    the_plan: ImagePlan,
    options: ImageOptions,
    builder: Builder,
    requirements: list[str],
    progress: Progress,
) -> ImageResult:
    log = cache.logs / f"image-{the_plan.labels[f'{LABEL_PREFIX}.tree'][:12]}.log"
    with temp_dir(cache.scratch, "image-") as scratch:
        context = scratch / "context"
        progress.phase("context", f"project, carry, bundle of {config.upstream.commit[:12]}")
        _assemble_context(config, cache, mirror, context, requirements)
        if options.hermetic:
            progress.phase("wheelhouse", f"{len(requirements)} requirement(s) for a --network=none build")
            _fill_wheelhouse(cache, requirements, options.wheelhouse, context / "wheelhouse")
        secret = _secret_file(config, scratch)
        command = _build_command(builder, the_plan, options, secret, context)
        progress.phase("build", f"{' '.join(command[:2])} -> {', '.join(the_plan.refs)}; log {log}")
        _run_logged(command, log, {"DOCKER_BUILDKIT": "1"})
    registry = _registry()
    client = registry.client()
    image = client.images.get(the_plan.refs[0])
    pushed: dict[str, str] = {}
    if options.push:
        with registry.credentials(config.image.name, builder.docker) as auth:
            for ref in the_plan.refs:
                progress.phase("push", ref)
                pushed[ref] = registry.push(client, ref, auth)
    return ImageResult(the_plan.refs, image.id, pushed, builder.notes)


def _registry():
    """carry.registry imports the docker SDK, which only the host needs: the build stage runs without it."""
    from carry import registry

    return registry


def _native_platform() -> str:
    machine = os.uname().machine
    return {"x86_64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}.get(machine, f"linux/{machine}")


def _assemble_context(config: Config, cache: Cache, mirror: Path, context: Path, requirements: list[str]) -> None:
    """carry, build.py, the config with VERSION and patches, and a bundle of the pinned commit."""
    project = context / "project"
    project.mkdir(parents=True)
    shutil.copy2(config.version_file, project / _inside(config, config.version_file))
    # The build stage fetches nothing (it has the bundle): a user:token in upstream.url stays out of its layers.
    (project / _inside(config, config.path)).write_text(strip_credentials(config.path.read_text()))
    shutil.copytree(config.patches_dir, project / _inside(config, config.patches_dir))
    package = Path(carry.__file__).resolve().parent
    shutil.copytree(package, context / "carry", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(package.parent / "build.py", context / "build.py")
    shutil.copy2(ENTRYPOINT, context / "entrypoint.sh")
    env_lines = "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(config.image.env.items()))
    (context / "runtime.env").write_text(env_lines)
    (context / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements))
    bundle = upstream.write_bundle(mirror, cache, config.upstream.commit)
    (context / "cache" / "bundles").mkdir(parents=True)
    shutil.copy2(bundle, context / "cache" / "bundles" / bundle.name)
    (context / "wheelhouse").mkdir()


def _inside(config: Config, path: Path) -> Path:
    try:
        return path.relative_to(config.root)
    except ValueError:
        raise BadInput(
            f"{config.path}: {path} is outside the config's directory; the image build copies only that "
            f"directory's VERSION and patches, so keep them beside build.yaml"
        ) from None


def _fill_wheelhouse(cache: Cache, requirements: list[str], given: Path | None, dest: Path) -> None:
    """Wheels for the build stage, from --wheelhouse or downloaded once into the cache."""
    if given is None:
        given = cache.root / "wheelhouse"
        given.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                   "--only-binary=:all:", "-d", str(given), *requirements]
        result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise Failed(f"pip download for the wheelhouse failed: {result.stderr.strip().splitlines()[-1:]}; "
                         f"pass --wheelhouse DIR with the wheels")
    for wheel in given.glob("*.whl"):
        shutil.copy2(wheel, dest / wheel.name)


def _secret_file(config: Config, scratch: Path) -> Path | None:
    """image.secret_env values from carry's environment, in a 0600 file handed to BuildKit as a secret."""
    names = [name for name in config.image.secret_env if os.environ.get(name)]
    if not names:
        return None
    path = scratch / "secret.env"
    path.touch(mode=0o600)
    path.write_text("".join(f"{name}={shlex.quote(os.environ[name])}\n" for name in names))
    return path


def _build_command(builder: Builder, the_plan: ImagePlan, options: ImageOptions, secret, context) -> list[str]:
    docker = builder.docker
    command = [docker, "buildx", "build", "--load"] if builder.buildx else [docker, "build"]
    command += ["--progress=plain", "--file", str(DOCKERFILE), "--target", "runtime"]
    if not builder.buildx:
        command.append("--force-rm")
    if options.hermetic:
        command.append("--network=none")
    for source in options.cache_from:
        command += ["--cache-from", source]
    for target in options.cache_to:
        command += ["--cache-to", target]
    if builder.platforms:
        command += ["--platform", ",".join(builder.platforms)]
    if secret is not None:
        command += ["--secret", f"id={SECRET_ID},src={secret}"]
    for name, value in sorted(the_plan.build_args.items()):
        command += ["--build-arg", f"{name}={value}"]
    for name, value in sorted(the_plan.labels.items()):
        command += ["--label", f"{name}={value}"]
    for ref in the_plan.refs:
        command += ["--tag", ref]
    command.append(str(context))
    return command


def _run_logged(command: list[str], log: Path, extra_env: dict[str, str]) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as handle:
        status = subprocess.run(command, env={**os.environ, **extra_env}, stdout=handle,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if status != 0:
        raise Failed(f"docker build failed (exit {status}); log: {log}\n{tail(log)}")


def verify_image(ref: str, config: Config, expected: Expected) -> Verification:
    """Pull if needed, compare labels with this repo, run the image's Python to print the wheel's buildinfo."""
    registry = _registry()
    client = registry.client()
    image = registry.get_or_pull(client, ref, docker_binary(config))
    labels = image.labels or {}
    from_labels = {
        "version": labels.get(f"{LABEL_PREFIX}.version"),
        "series": {"hash": labels.get(f"{LABEL_PREFIX}.series.hash")},
        "upstream": {"commit": labels.get(f"{LABEL_PREFIX}.upstream.commit")},
    }
    mismatches = [Mismatch(f"label {m.field}", m.expected, m.found) for m in compare(from_labels, expected)]
    dist = labels.get(f"{LABEL_PREFIX}.wheel")
    if not dist:
        raise Failed(f"{ref}: no {LABEL_PREFIX}.wheel label; it was not built by carry")
    output = registry.run(client, image.id, ["python3", "-c", BUILDINFO_SCRIPT, dist])
    try:
        info = json.loads(output)
    except ValueError:
        raise Failed(f"{ref}: the image's python did not print a buildinfo for {dist}: {output[-300:]}") from None
    mismatches += [Mismatch(f"buildinfo {m.field}", m.expected, m.found) for m in compare(info, expected)]
    return Verification(f"{ref} ({image.id[:19]})", info, tuple(mismatches), None)
