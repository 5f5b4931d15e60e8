"""The runtime base of a locked image, per platform: the runtime image as configured, or, when it holds no python3
(NVIDIA's CUDA runtime images), a base with Python that carry derives from it (image.runtime_python).

Deriving is one BuildKit build of carry/resources/runtime-python.<method>.Dockerfile FROM the runtime image, for that
platform (under QEMU for another CPU: minutes, once), kept as the local image `carry-derived/python:<arch>-<key>`, the
key a hash of the source's content digest and the recipe: a second run reuses it.

What names a base, in the lock and the image's labels, is the source's *content digest* (its diff_ids and run-time
config, no creation times) and, when derived, the recipe's hash: the same on every machine that holds the same image,
unlike a local image ID."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import carry
from carry.config import Config
from carry.platforms import Platform
from carry.util import reporter
from carry.util.cache import Cache
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import atomic_write_text, temp_dir
from carry.util.record import record
from carry.util.run import BUILD_S, execute

RESOURCES = Path(carry.__file__).resolve().parent / "resources"
DEFAULT_METHOD = "apt"
PACKAGES = {"apt": "python3 python3-venv"}  # what each method always installs (said in its lines; the recipe holds it)
DERIVED_REPO = "carry-derived/python"  # the derived bases, tagged <arch>-<key>
SOURCE_REPO = "carry-derived/source"  # a runtime image's tag while a derivation builds FROM it
OWN = "own"  # base-python of a runtime image with its own python3
LABEL_BASE = "io.carry.base"  # the runtime image's content digest
LABEL_PYTHON = "io.carry.base.python"  # own, or `<method> sha256:<recipe hash>`
LABEL_BASE_NAME = "org.opencontainers.image.base.name"
LABEL_BASE_DIGEST = "org.opencontainers.image.base.digest"
CONFIG_KEYS = ("Env", "Entrypoint", "Cmd", "User", "WorkingDir", "Labels")
FACTS_DIR = "runtime-facts"
# Run by the base image's own python3: its version, its C library and CPU.
FACTS_SCRIPT = (
    "import json, os, platform; "
    "libc = os.confstr('CS_GNU_LIBC_VERSION') if hasattr(os, 'confstr') else None; "
    "print(json.dumps({'python': platform.python_version(), 'libc': libc or '', "
    "'machine': platform.machine()}))"
)
NO_PYTHON_RE = re.compile(r"executable file not found|no such file or directory", re.I)


@dataclasses.dataclass(frozen=True)
class RuntimeBase:
    """A platform's runtime base as the lock and the locked image use it."""

    platform: Platform
    ref: str  # image.platforms.<p>.runtime_image, else image.runtime_image
    content: str  # the runtime image's content digest, "sha256:<hex>" (content_digest)
    registry_digest: str | None  # its registry digest (name@sha256:... it was pulled or pinned by), if any
    python: str  # OWN, or "<method> sha256:<recipe hash>" for a derived base
    image: str  # the image the lock reads and the layers go on: `ref`, or the derived base's tag
    image_id: str  # that image's local ID
    python_version: str  # "3.11.2"
    glibc: str  # "2.36"
    note: str  # what was done, one line
    recorded: dict | None = None  # not made here: the base as a previous image's record holds it (record())

    @property
    def derived(self) -> bool:
        return self.python != OWN

    def record(self, inspected: dict) -> dict:
        """What a later run needs to use this base without deriving it again (registrycache.Record.base), with the
        run-time config and layers of the image the layers went on (`inspected`)."""
        config = inspected.get("Config") or {}
        return {
            "ref": self.ref,
            "content": self.content,
            "python": self.python,
            "python_version": self.python_version,
            "glibc": self.glibc,
            "registry_digest": self.registry_digest,
            "config": {key: config.get(key) for key in ("Env", "Labels", "WorkingDir", "User")},
            "diff_ids": list((inspected.get("RootFS") or {}).get("Layers") or []),
        }

    def labels(self) -> dict[str, str]:
        """What the locked image says of its base: the same fields as the lock's header."""
        return _derived_labels(self.ref, self.content, self.python, self.registry_digest)


def runtime_image(config: Config, platform: Platform) -> str:
    ref = config.target(platform).runtime_image or config.image.runtime_image
    if ref is None:
        raise BadInput(
            f"{config.path}: no runtime image for {platform}; set image.platforms.{platform}.runtime_image "
            f"(or image.runtime_image): the lock targets that image's Python and glibc"
        )
    return ref


def resolve(config: Config, platform: Platform, cache: Cache, known: dict | None = None) -> RuntimeBase:
    """The platform's runtime base: the runtime image (pulled when missing), used as it is when it has python3 (or
    image.runtime_python is off), else derived; not derived again when `known` (a previous image's record) shows the
    same recipe on the same image made it."""
    from carry.image.buildkit import container

    ref = runtime_image(config, platform)
    docker = container.docker_binary(config)
    source = _local_or_pulled(docker, config, ref, platform)
    found = "/".join(filter(None, (source.get("Os"), source.get("Architecture"), source.get("Variant"))))
    if Platform.parse(found, f"runtime image {ref}") is not platform:
        raise BadInput(
            f"runtime image {ref} is for {found}, not {platform}; set image.platforms.{platform}."
            f"runtime_image to a {platform} image"
        )
    content = content_digest(source)
    registry_digest = _registry_digest(ref, source)
    mode = config.runtime_python(platform)
    packages = config.image.runtime_packages
    if packages and mode == "off":
        raise BadInput(
            f"{config.path}: image.runtime_packages ({' '.join(packages)}) needs a derived base, but "
            f"image.runtime_python is off for {platform}; set it to auto or apt, or remove runtime_packages"
        )
    if mode in ("auto", "off") and not packages:
        facts = python_facts(docker, cache, source["Id"], platform, ref)
        if facts is not None:
            line = f"{platform}: {ref} ({content[:19]}…): its own python3 {facts['python']}, glibc {facts['libc']}"
            return RuntimeBase(
                platform, ref, content, registry_digest, OWN, ref, source["Id"], facts["python"], facts["libc"], line
            )
        if mode == "off":
            raise BadInput(
                f"runtime image {ref} (for {platform}) has no python3 and image.runtime_python is off; set it to "
                f"auto (carry derives a base with the distribution's python3) or name an image with python3"
            )
        method, why = DEFAULT_METHOD, "has no python3"
    elif mode == "auto":  # the runtime needs more than the image's own python3
        method, why = DEFAULT_METHOD, f"needs {' '.join(packages)} (image.runtime_packages)"
    else:
        method, why = mode, f"image.runtime_python is {mode}"
    image = SourceImage(platform=platform, ref=ref, inspected=source, content=content, registry_digest=registry_digest)
    python = f"{method} {recipe_hash(method, packages)}"
    if known and (known.get("content"), known.get("python")) == (content, python):
        tag = derived_tag(content, python, platform)
        if _matching(docker, tag, _derived_labels(ref, content, python, registry_digest)) is None:
            line = (
                f"{platform}: {ref} ({content[:19]}…) {why}: the base a previous image records (the same recipe on "
                f"the same runtime image, python3 {known.get('python_version')}, glibc {known.get('glibc')}): its "
                f"layers are in the registry, not derived again"
            )
            version, glibc = str(known.get("python_version")), str(known.get("glibc"))
            return RuntimeBase(platform, ref, content, registry_digest, python, tag, "", version, glibc, line, known)
    return derive(config, cache, docker, image, method, why, packages)


def _derived_labels(ref: str, content: str, python: str, registry_digest: str | None) -> dict[str, str]:
    labels = {LABEL_BASE_NAME: ref, LABEL_BASE: content, LABEL_PYTHON: python}
    if registry_digest:
        labels[LABEL_BASE_DIGEST] = registry_digest
    return labels


# -- identity ------------------------------------------------------------------------------------------------------


def content_digest(inspected: dict) -> str:
    """sha256 of what an image holds, as `docker image inspect` shows it: platform, layers (diff_ids) and run-time
    config; not its ID, which also hashes creation times and so differs wherever the image is rebuilt."""
    config = inspected.get("Config") or {}
    body = {
        "platform": [inspected.get("Os"), inspected.get("Architecture"), inspected.get("Variant") or ""],
        "diff_ids": list((inspected.get("RootFS") or {}).get("Layers") or []),
        "config": {key: config.get(key) or None for key in CONFIG_KEYS},
    }
    return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def recipe_path(method: str) -> Path:
    return RESOURCES / f"runtime-python.{method}.Dockerfile"


def recipe_hash(method: str, packages: tuple[str, ...] = ()) -> str:
    """sha256 of a method's recipe: its Dockerfile's instructions, comments and blank lines aside, and the packages
    named besides (image.runtime_packages, in order: none leaves the recipe's own hash)."""
    lines = [line.rstrip() for line in recipe_path(method).read_text().splitlines()]
    kept = "\n".join(line for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if packages:
        kept += "\nPACKAGES=" + " ".join(packages)
    return "sha256:" + hashlib.sha256(kept.encode()).hexdigest()


def _registry_digest(ref: str, inspected: dict) -> str | None:
    """The registry digest of `ref`'s repository the engine knows the image by (pulled or pinned by it)."""
    if "@sha256:" in ref:
        return "sha256:" + ref.rsplit("@sha256:", 1)[1]
    name = ref.rsplit("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    for entry in inspected.get("RepoDigests") or []:
        repository, _, digest = entry.partition("@")
        if repository in (name, f"docker.io/{name}", f"docker.io/library/{name}") and digest:
            return digest
    return None


# -- the engine ----------------------------------------------------------------------------------------------------


def _docker(docker: str, args: list[str], timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        return execute([docker, *args], text=True, timeout=timeout, env=env)
    except OSError as exc:
        raise BadInput(f"docker {docker} cannot run ({exc.strerror}); install Docker or set image.docker") from None


def inspect(docker: str, ref: str) -> dict | None:
    """`docker image inspect` of `ref`, or None when the engine does not hold it."""
    done = _docker(docker, ["image", "inspect", ref])
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout)[0]
    except (ValueError, IndexError):
        return None


def _local_or_pulled(docker: str, config: Config, ref: str, platform: Platform) -> dict:
    """The runtime image from the local engine, else pulled (image.name's login only in its own registry)."""
    found = inspect(docker, ref)
    if found is not None:
        return found
    from carry.image import registry

    started = time.monotonic()
    args = ["pull", "--quiet", "--platform", str(platform), ref]
    if registry.registry_of(ref) == registry.registry_of(config.image.name):
        with registry.credentials(config.image.name, docker) as login:
            done = _docker(docker, args, 3600, login.cli_env())
    else:
        done = _docker(docker, args, 3600)
    found = inspect(docker, ref) if done.returncode == 0 else None
    if found is None:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise BadInput(
            f"runtime image {ref} (for {platform}) is not in the Docker engine, and pulling it failed ({reason}); "
            f"build, load or pull it"
        )
    how = " by digest" if "@sha256:" in ref else ""
    reporter.phase("base", f"{platform}: pulled {ref}{how} in {time.monotonic() - started:.0f}s")
    return found


def python_facts(docker: str, cache: Cache, image_id: str, platform: Platform, ref: str) -> dict | None:
    """{"python", "libc"} of the image's own python3, run once and kept by image ID; None without python3."""
    memo = cache.root / FACTS_DIR / f"{image_id.removeprefix('sha256:')}.json"
    try:
        facts = json.loads(memo.read_text())
    except (OSError, ValueError):
        facts = _run_facts(docker, image_id, platform, ref)
        memo.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(memo, json.dumps(facts, sort_keys=True) + "\n")
    return None if facts.get("python3") is False else facts


def _run_facts(docker: str, image_id: str, platform: Platform, ref: str) -> dict:
    args = ["run", "--rm", "--network=none", "--platform", str(platform), "--entrypoint", "python3", image_id]
    done = _docker(docker, [*args, "-I", "-c", FACTS_SCRIPT])
    if done.returncode in (126, 127) and NO_PYTHON_RE.search(done.stderr):
        return {"python3": False}
    try:
        facts = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (ValueError, IndexError):
        facts = None
    if facts is None:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise BadInput(
            f"runtime image {ref} (for {platform}): its python3 cannot say its version ({last}); the lock "
            f"needs a base whose python3 runs"
        )
    libc = re.fullmatch(r"glibc (\d+\.\d+)(\.\d+)?", facts.get("libc", ""))
    if libc is None:
        raise BadInput(
            f"runtime image {ref} (for {platform}) has C library {facts.get('libc')!r}, not glibc; the "
            f"lock targets manylinux wheels, which need a glibc base"
        )
    if facts.get("machine") != platform.machine:
        raise BadInput(f"runtime image {ref} runs on {facts.get('machine')}, not {platform.machine}")
    return {"python": facts["python"], "libc": libc.group(1)}


# -- deriving --------------------------------------------------------------------------------------------------------


def derived_tag(content: str, python: str, platform: Platform) -> str:
    """`carry-derived/python:<arch>-<key>`: the key hashes the source's content digest, the recipe and platform."""
    key = hashlib.sha256(f"{content}\n{python}\n{platform}".encode()).hexdigest()[:16]
    return f"{DERIVED_REPO}:{platform.tag}-{key}"


@record(kw_only=True)
class SourceImage:
    """The runtime image a base is derived from, as the engine inspects it, with its content and registry digests."""

    platform: Platform
    ref: str
    inspected: dict
    content: str
    registry_digest: str | None


def derive(
    config: Config, cache: Cache, docker: str, image: SourceImage, method: str, why: str, packages: tuple[str, ...] = ()
) -> RuntimeBase:
    """The derived base of `image` by `method` with `packages` besides python3: the local image made earlier, else one
    BuildKit build (once per key; a concurrent carry waits), said with `why` when it starts."""
    platform, ref, source = image.platform, image.ref, image.inspected
    content, registry_digest = image.content, image.registry_digest
    python = f"{method} {recipe_hash(method, packages)}"
    installs = " ".join((PACKAGES[method], *packages))
    tag = derived_tag(content, python, platform)
    labels = _derived_labels(ref, content, python, registry_digest)
    with cache.lock(f"runtime-python-{tag.rsplit(':', 1)[1]}"):
        made = _matching(docker, tag, labels)
        seconds = None
        if made is None:
            reporter.phase(
                "base",
                f"{platform}: {ref} {why}: deriving a base with the distribution's {installs} by {method}"
                f"{' under QEMU' if platform is not Platform.native() else ''}, once",
            )
            seconds = _build(config, cache, docker, platform, source, (method, packages), tag, labels)
            made = _matching(docker, tag, labels)
            if made is None:
                raise Failed(f"deriving {tag} from {ref} ({platform}) left no image with its labels")
    facts = python_facts(docker, cache, made["Id"], platform, tag)
    if facts is None:
        raise Failed(f"{tag}, derived from {ref} by {method}, has no python3 either; log: {_log(cache, tag)}")
    done = f"in {seconds:.0f}s; log {_log(cache, tag)}" if seconds is not None else "made earlier"
    line = (
        f"{platform}: {ref} ({content[:19]}…) {why}: base {tag}, it + {installs} by {method}: python3 "
        f"{facts['python']}, glibc {facts['libc']} ({done})"
    )
    return RuntimeBase(
        platform, ref, content, registry_digest, python, tag, made["Id"], facts["python"], facts["libc"], line
    )


def _matching(docker: str, tag: str, labels: dict[str, str]) -> dict | None:
    """The derived base at `tag` when its labels name the same content, recipe and registry digest; not the configured
    name, so that the same image named another way is not derived again."""
    found = inspect(docker, tag)
    if found is None:
        return None
    have = (found.get("Config") or {}).get("Labels") or {}
    compared = (LABEL_BASE, LABEL_PYTHON, LABEL_BASE_DIGEST)
    return found if all(have.get(key) == labels.get(key) for key in compared) else None


def _log(cache: Cache, tag: str) -> Path:
    return cache.logs / f"runtime-python-{tag.rsplit(':', 1)[1]}.log"


def _build(
    config: Config,
    cache: Cache,
    docker: str,
    platform: Platform,
    source: dict,
    recipe: tuple[str, tuple[str, ...]],
    tag: str,
    labels: dict[str, str],
) -> float:
    """One BuildKit build of the method's recipe FROM a private tag of the source image, for `platform`, with the
    network and without BuildKit's cache (the distribution's packages as they are now); its seconds."""
    method, packages = recipe
    from carry.image.buildkit import container
    from carry.util.logtail import tail

    builder = container.resolve_builder(config, (platform,))
    log = _log(cache, tag)
    log.parent.mkdir(parents=True, exist_ok=True)
    source_tag = f"{SOURCE_REPO}:{tag.rsplit(':', 1)[1]}"
    tagged = _docker(docker, ["tag", source["Id"], source_tag])
    if tagged.returncode != 0:
        raise Failed(f"docker tag {source['Id'][:19]} {source_tag} failed: {tagged.stderr.strip()[-300:]}")
    started = time.monotonic()
    try:
        with temp_dir(cache.scratch, "runtime-python-") as context:
            (context / "Dockerfile").write_bytes(recipe_path(method).read_bytes())
            command = [builder.docker, *(["buildx", "build", "--load"] if builder.buildx else ["build", "--force-rm"])]
            command += ["--progress=plain", "--no-cache", "--platform", str(platform)]
            command += ["--build-arg", f"SOURCE={source_tag}", "--build-arg", f"PACKAGES={' '.join(packages)}"]
            command += ["--tag", tag, "--file", str(context / "Dockerfile")]
            for name, value in sorted(labels.items()):
                command += ["--label", f"{name}={value}"]
            with open(log, "wb") as handle:
                status = execute(
                    [*command, str(context)], env={**os.environ, "DOCKER_BUILDKIT": "1"}, log=handle, timeout=BUILD_S
                ).returncode
        if status != 0:
            raise Failed(
                f"deriving the Python base of {labels[LABEL_BASE_NAME]} for {platform} by {method} failed "
                f"(docker build exit {status}); log: {log}\n{tail(log)}"
            )
    finally:
        _untag(docker, source_tag)
    return time.monotonic() - started


def _untag(docker: str, tag: str) -> None:
    """Remove a private tag, never the image: kept when the tag is its only name (an image configured by ID)."""
    found = inspect(docker, tag)
    if found is not None and len(found.get("RepoTags") or []) + len(found.get("RepoDigests") or []) > 1:
        _docker(docker, ["image", "rm", "--no-prune", tag])
