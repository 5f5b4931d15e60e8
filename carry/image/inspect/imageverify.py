"""`verify IMAGE`: what a tag holds, per platform, against this repo: the labels, the installed wheel's buildinfo, the
CPU its Python runs on, and the wheel's shared objects (ELF machine and the arch gate). A locked image is read from its
layers on this machine instead (carry.image.inspect.imagefs: no pull, no container, no emulator) and its files proven
against the lock and the fixed wheel in dist/ (carry.image.inspect.installcheck)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from carry.arch import ArchList
from carry.config import Config
from carry.image.vocabulary import LABEL_PREFIX, WHEEL_LABEL, docker_binary, own_tag
from carry.platforms import Platform
from carry.util import prog
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import temp_dir
from carry.util.record import record
from carry.wheelbuild.verify import Expected, Inspection, Mismatch, Verification, compare, recorded_policy

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Iterable

    import docker
    from docker.models.images import Image

    from carry.image.inspect.imagefs import ImageFiles
    from carry.image.inspect.installcheck import ContentCheck, FixedWheel
    from carry.image.locked.runtimelock import Lock, Locked
    from carry.image.registry import Login
    from carry.trust.keys import PublicKey

# Run inside an image: import the wheel's package, print the buildinfo, the CPU and the wheel's shared objects.
INSPECT_SCRIPT = """
import importlib, importlib.metadata as metadata, json, os, platform, sys
dist = metadata.distribution(sys.argv[1])
top = (dist.read_text("top_level.txt") or sys.argv[1]).split()[0]
importlib.import_module(top)
libs = sorted([str(f), os.path.realpath(dist.locate_file(f))] for f in dist.files or ()
              if ".so" in f.name.split("/")[-1])
print(json.dumps({"machine": platform.machine(), "python": platform.python_version(), "libs": libs,
                  "buildinfo": json.loads(dist.read_text("carry-buildinfo.json"))}))
"""


@record(kw_only=True)
class Request:
    """What `verify` was asked of an image, resolved once: the reference `ref`; its `platform` (None: each it holds);
    the `arches` to gate (None: those the wheel records); `local`: this Docker engine's image, not the registry's;
    with `key`, its signature, SBOM and provenance too, the provenance against `patches` (name, sha256)."""

    ref: str
    platform: Platform | None = None
    arches: ArchList | None = None
    local: bool = False
    key: PublicKey | None = None
    patches: tuple[tuple[str, str], ...] = ()
    require: tuple[str, ...] = ()  # the attestation kinds (carry.trust.kinds) that must be there


def verify_image(request: Request, config: Config, expected: Expected, scratch: Path) -> tuple[Verification, ...]:
    """Verify each platform `request.ref` holds (or the one asked) as pulled from its registry, or with `local` this
    engine's image: labels, buildinfo, the CPU its Python runs on, and the installed wheel's shared objects."""
    from carry.image import registry

    client = registry.client()
    docker_cli = docker_binary(config)
    if getattr(config.image, "lock", None):
        return verify_locked(client, docker_cli, request, config, expected)
    ref, platform, arches, local, key = request.ref, request.platform, request.arches, request.local, request.key
    with _login(ref, docker_cli, local) as login:
        remote = None if local else _remote(client, ref, login)
        if remote is None:
            images = [_local(client, ref)]
            coverage = []
        else:
            wanted = [platform] if platform is not None else list(remote[1])
            missing = [p for p in wanted if p not in remote[1]]
            if missing:
                raise Failed(f"{ref} holds {', '.join(map(str, remote[1]))}, not {', '.join(map(str, missing))}")
            images = [(p, registry.pull(client, ref, p, login)) for p in wanted]
            coverage = _coverage(ref, config, expected.version, remote[1]) if platform is None else []
    results = []
    for found_platform, image in images:
        if platform is not None and found_platform is not platform:
            raise Failed(f"{ref} is a {found_platform} image, not {platform}")
        result = _verify_one(client, ref, image, found_platform, expected, arches, scratch, coverage)
        if key is not None:
            trusted = _trust_dockerfile(client, docker_cli, found_platform, request, remote, expected)
            result = _with_trust(result, trusted)
        results.append(result)
    return tuple(results)


def _remote(client: docker.DockerClient, ref: str, login: Login) -> tuple[str, tuple[Platform, ...]]:
    """What the registry holds under `ref`. A registry that cannot be read, or that has no such tag, is bad input
    naming the way out: a local image of the same name never passes for the pushed one (that is `--local`)."""
    from carry.image import registry

    try:
        found = registry.remote_platforms(client, ref, login)
    except Failed as unreadable:
        raise BadInput(
            f"{unreadable}; verify reads the pushed image from {login.registry}: set {registry.USER_ENV} and "
            f"{registry.PASSWORD_ENV} (or `docker login {login.registry}`) and check the name, or verify this "
            f"Docker engine's image with --local"
        ) from None
    if found is None:
        raise BadInput(
            f"{ref}: its registry {login.registry} has no such tag; push it (`{prog.command('image', '--push')}`), "
            f"or verify this Docker engine's image with --local"
        )
    return found


def _login(ref: str, docker_cli: str, local: bool) -> contextlib.AbstractContextManager[Login]:
    """The registry login for `ref`; none for an image verified in this engine (nothing reaches the registry)."""
    import contextlib

    from carry.image import registry

    if local:
        return contextlib.nullcontext(registry.Login(registry.registry_of(ref), None, None))
    return registry.credentials(ref, docker_cli)


def _local(client: docker.DockerClient, ref: str) -> tuple[Platform, Image]:
    """(platform, image) of `ref` in this Docker engine's image store."""
    from carry.image import registry

    image = registry.local(client, ref)
    if image is None:
        raise BadInput(f"{ref}: this Docker engine has no such image; build it (`{prog.command('image')}`) first")
    return registry.image_platform(image), image


def _with_trust(result: Verification, found: tuple[list[str], list[str]]) -> Verification:
    """`result` with the signature, SBOM and provenance checks (carry.image.inspect.trustcheck) added."""
    proven, problems = found
    checks = result.checks
    if checks is None:
        return result
    return dataclasses.replace(
        result,
        checks=dataclasses.replace(checks, proven=(*checks.proven, *proven), problems=(*checks.problems, *problems)),
    )


def _trust_dockerfile(
    client: docker.DockerClient,
    docker_cli: str,
    platform: Platform,
    request: Request,
    remote: tuple[str, tuple[Platform, ...]] | None,
    expected: Expected,
) -> tuple[list[str], list[str]]:
    """A Dockerfile-built image's signature (and the index's), provenance and, from a --hermetic build, SBOM."""
    from carry.image import registry, registryhttp
    from carry.image.inspect import imagefs, trustcheck
    from carry.trust import provenance

    if remote is None:
        return [], ["signature: the image is only in the local engine; a signature lives in a registry"]
    ref, key = request.ref, request.key
    assert key is not None  # verify_image asks for trust only with a key
    repository = registryhttp.repository_of(ref)
    with registry.credentials(ref, docker_cli) as login:
        insecure = registry.insecure(client, registry.registry_of(ref))
        files = imagefs.from_registry(ref, platform, trustcheck.dist_info_selection(), login.auth, insecure)
        if files is None:
            return [], [f"signature: {ref} is not in its registry"]
        store = registryhttp.Repository.of(repository, login.auth)
        wanted = provenance.Expected(expected.commit, request.patches, expected.version, "", None)
        manifest = trustcheck.Manifest(
            repository=repository, digest=files.digest, platform=platform, labels=files.labels
        )
        installed = trustcheck.installed_in(files)
        return trustcheck.check_platform(
            store, key, manifest, installed, wanted, hermetic=False, require=request.require, index=remote[0]
        )


def _coverage(ref: str, config: Config, version: str, held: tuple[Platform, ...]) -> list[Mismatch]:
    """A shared tag must name every configured platform; a platform's own tag only that platform."""
    configured = [t.platform for t in config.image.platforms]
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    own = [p for p in configured if tag == own_tag(version, p)]
    wanted = own or configured
    if not wanted or set(wanted) == set(held):
        return []
    return [Mismatch("platforms", ", ".join(map(str, wanted)), ", ".join(map(str, held)))]


def _verify_one(
    client: docker.DockerClient,
    ref: str,
    image: Image,
    platform: Platform,
    expected: Expected,
    arches: ArchList | None,
    scratch: Path,
    coverage: list[Mismatch],
) -> Verification:
    from carry.binaries import gate
    from carry.binaries import sharedobjects as binaries
    from carry.image import registry

    labels = image.labels or {}
    mismatches = list(coverage) + _label_mismatches(labels, expected)
    dist = labels.get(WHEEL_LABEL)
    if not dist:
        raise Failed(f"{ref}: no {LABEL_PREFIX}.wheel label; it was not built by carry")
    with temp_dir(scratch, "verify-image-") as files:
        output = registry.run(
            client,
            image.id,
            ["python3", "-c", INSPECT_SCRIPT, dist],
            copy_out=lambda out: [real for _, real in _inspect_output(ref, dist, out)["libs"]],
            dest=files,
        )
        seen = _inspect_output(ref, dist, output)
        objects = [binaries.named(installed, files / real.lstrip("/")) for installed, real in seen["libs"]]
    info = seen["buildinfo"]
    policy = recorded_policy(info, f"{ref} buildinfo")
    report = gate.check(objects, policy.with_arches(arches) if arches is not None else policy, platform)
    mismatches += [Mismatch(f"buildinfo {m.field}", m.expected, m.found) for m in compare(info, expected)]
    if seen["machine"] != platform.machine:
        mismatches.append(Mismatch("python machine", platform.machine, seen["machine"]))
    notes = (f"platform {platform}{platform.where()}: python {seen['python']} on {seen['machine']}",)
    return Verification(f"{ref} {platform} ({image.id[:19]})", info, tuple(mismatches), Inspection(report, None), notes)


def _inspect_output(ref: str, dist: str, output: str) -> dict:
    for line in reversed(output.strip().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "buildinfo" in found:
            return found
    raise Failed(f"{ref}: the image's python did not report the buildinfo of {dist}: {output[-300:]}")


# --- locked images: proven from their layers -----------------------------------------------------------------------

WHEEL_SHA256_LABEL = f"{LABEL_PREFIX}.wheel.sha256"


def verify_locked(
    client: docker.DockerClient,
    docker_cli: str,
    request: Request,
    config: Config,
    expected: Expected,
    dist: Path = Path("dist"),
) -> tuple[Verification, ...]:
    """Each platform of `request.ref` (or the one asked) read from its layers and proven against its lock and the fixed
    wheel in `dist`; with `key`, also its signature, SBOM and provenance."""
    from carry.image.locked import runtimelock

    ref, platform, arches, local = request.ref, request.platform, request.arches, request.local

    with _login(ref, docker_cli, local) as login:
        remote = None if local else _remote(client, ref, login)
        if remote is None:
            held: tuple[Platform, ...] = (_local(client, ref)[0],)
            coverage = []
        else:
            held = remote[1]
            coverage = _coverage(ref, config, expected.version, held) if platform is None else []
        wanted = [platform] if platform is not None else list(held)
        missing = [p for p in wanted if p not in held]
        if missing:
            raise Failed(f"{ref} holds {', '.join(map(str, held))}, not {', '.join(map(str, missing))}")
        results = []
        for target in wanted:
            lock = runtimelock.read(config, target)
            locked = tuple((package.name, package.version) for package in lock.packages)
            fixed = fixed_wheel(dist, expected.version, target)
            files, content = read_and_check(
                client,
                login,
                ref,
                target,
                locked,
                fixed,
                from_registry=remote is not None,
                wheels=stored_wheels(lock.packages),
            )
            result = judge(ref, files, content, fixed, expected, arches, coverage, lock)
            if request.key is not None:
                result = _with_trust(
                    result, _trust_locked(login, request, files, content, fixed, lock, expected, remote)
                )
            results.append(result)
    return tuple(results)


def _trust_locked(
    login: Login,
    request: Request,
    files: ImageFiles,
    content: ContentCheck,
    fixed: FixedWheel,
    lock: Lock,
    expected: Expected,
    remote: tuple[str, tuple[Platform, ...]] | None,
) -> tuple[list[str], list[str]]:
    """A locked image's signature, SBOM and provenance (against this repository); `request.key` is set."""
    import hashlib

    from carry.image import registryhttp
    from carry.image.inspect import installcheck, trustcheck
    from carry.trust import provenance

    if remote is None:
        return [], ["signature: the image is only in the local engine; a signature lives in a registry"]
    key, patches = request.key, request.patches
    assert key is not None  # verify_locked asks for trust only with a key
    repository = registryhttp.repository_of(request.ref)
    store = registryhttp.Repository.of(repository, login.auth)
    dists = installcheck.installed(files.nodes, content.site, [])
    locked = (lock.path.name, hashlib.sha256(lock.path.read_bytes()).hexdigest())
    wanted = provenance.Expected(expected.commit, patches, expected.version, fixed.sha256, locked)
    manifest = trustcheck.Manifest(
        repository=repository, digest=files.digest, platform=files.platform, labels=files.labels
    )
    installed = [(d.shown, d.version) for d in dists]
    return trustcheck.check_platform(store, key, manifest, installed, wanted, require=request.require, index=remote[0])


def fixed_wheel(dist: Path, version: str, platform: Platform) -> FixedWheel:
    """The fixed wheel of VERSION in `dist` tagged for `platform` (else a pure `-none-any` one): exactly one."""
    from carry.image.inspect import installcheck
    from carry.wheelbuild.verify import wheel_platform

    ours = [path for path in dist.glob("*.whl") if version in path.name.split("-")[1]]
    found = sorted(path for path in ours if wheel_platform(path) is platform) or sorted(
        path for path in ours if path.name.endswith("-none-any.whl")
    )
    if len(found) != 1:
        names = ", ".join(path.name for path in found) or "none"
        raise Failed(
            f"the fixed wheel of {version} for {platform} in {dist}/: expected one, found {names}; "
            f"build it ({prog.command('wheel', '--platform', str(platform))}) or run from the directory holding dist/"
        )
    return installcheck.FixedWheel.read(found[0])


def stored_wheels(packages: Iterable[Locked]) -> dict[str, Path]:
    """The locked wheels the download store holds (by the sha256 the lock pins): canonical name -> file."""
    from carry.source import releases

    root, found = releases.store().root, {}
    for package in packages:
        for pinned in package.hashes:
            directory = root / pinned.split(":", 1)[-1]
            wheel = next(iter(sorted(directory.glob("*.whl"))), None) if directory.is_dir() else None
            if wheel is not None:
                found[package.name] = wheel
                break
    return found


def read_and_check(
    client: docker.DockerClient,
    login: Login,
    ref: str,
    platform: Platform,
    locked: tuple[tuple[str, str], ...],
    fixed: FixedWheel,
    from_registry: bool = True,
    wheels: dict[str, Path] | None = None,
) -> tuple[ImageFiles, ContentCheck]:
    """`platform`'s image of `ref` read from its layers and its files checked against the lock and `fixed`."""
    from carry.binaries import sharedobjects as binaries
    from carry.image import registry
    from carry.image.inspect import imagefs, installcheck

    wanted = installcheck.selection([fixed], binaries.from_bytes)
    files = None
    if from_registry:
        files = imagefs.from_registry(
            ref, platform, wanted, login.auth, registry.insecure(client, registry.registry_of(ref))
        )
    if files is None:
        files = imagefs.from_engine(client, ref, platform, wanted)
    return files, installcheck.check(files, locked, fixed, wheels)


def judge(
    ref: str,
    files: ImageFiles,
    content: ContentCheck,
    fixed: FixedWheel,
    expected: Expected,
    arches: ArchList | None,
    coverage: list[Mismatch],
    lock: Lock | None = None,
) -> Verification:
    """The labels, the installed buildinfo and the gate of the installed shared objects, with what the files
    proved (`content`), as one platform's verification; with the `lock`, the base the labels name is its base."""
    from carry.binaries import gate
    from carry.trust.facts import canonical

    labels = files.labels
    mismatches = list(coverage) + _label_mismatches(labels, expected)
    base_line = _base_mismatches(labels, lock, mismatches) if lock is not None else None
    if canonical(labels.get(f"{LABEL_PREFIX}.wheel", "")) != fixed.name:
        mismatches.append(Mismatch(f"label {LABEL_PREFIX}.wheel", fixed.name, str(labels.get(f"{LABEL_PREFIX}.wheel"))))
    recorded = labels.get(WHEEL_SHA256_LABEL)
    if recorded is not None and recorded != fixed.sha256:
        mismatches.append(Mismatch(f"label {WHEEL_SHA256_LABEL}", f"{fixed.sha256} ({fixed.path.name})", recorded))
    node = files.nodes.get(f"{content.site}/{fixed.dist_info}/carry-buildinfo.json")
    try:
        info = json.loads(node.data) if node is not None and node.data else {}
    except ValueError:
        info = {}
    if not info:
        mismatches.append(Mismatch("buildinfo", f"{fixed.dist_info}/carry-buildinfo.json", "none readable"))
    mismatches += [Mismatch(f"buildinfo {m.field}", m.expected, m.found) for m in compare(info, expected)]
    policy = recorded_policy(info, f"{ref} buildinfo")
    report = gate.check(content.shared, policy.with_arches(arches) if arches is not None else policy, files.platform)
    compressed = sum(layer.compressed for layer in files.layers)
    unpacked = sum(layer.bytes for layer in files.layers)
    where = (
        f"{len(files.layers)} layer(s), {compressed / 1e6:,.1f} MB compressed, {unpacked / 1e6:,.1f} MB"
        if compressed
        else f"{len(files.layers)} layer(s), {unpacked / 1e6:,.1f} MB"
    )
    sha_line = (
        f"wheel sha256: {WHEEL_SHA256_LABEL} = {fixed.path.name}'s"
        if recorded == fixed.sha256
        else f"wheel sha256: no {WHEEL_SHA256_LABEL} label; the wheel is proven by its installed files"
    )
    proven = (
        f"platform {files.platform}: read natively from {files.source} ({where}) in {files.seconds:.1f} s",
        *content.proven,
        sha_line,
        *([base_line] if base_line else []),
    )
    checks = Inspection(report, None, proven=proven, problems=content.problems)
    return Verification(f"{ref} {files.platform} ({files.digest[:19]})", info, tuple(mismatches), checks)


def _base_mismatches(labels: dict, lock: Lock, mismatches: list[Mismatch]) -> str | None:
    """The base the image's labels name (carry.image.locked.runtimebase.RuntimeBase.labels) against the lock's header:
    the same content digest and Python; a line saying so, None for an image without those labels."""
    from carry.image.locked import runtimebase, runtimelock

    found = labels.get(runtimebase.LABEL_BASE), labels.get(runtimebase.LABEL_PYTHON)
    if found == (None, None):
        return None
    for label, value, want in zip(
        (runtimebase.LABEL_BASE, runtimebase.LABEL_PYTHON), found, (lock.base_content, lock.base_python)
    ):
        if value != want:
            mismatches.append(Mismatch(f"label {label}", f"{want} ({lock.path.name})", str(value)))
    python = runtimelock.short_python(lock.base_python)
    return f"base: {lock.base} ({lock.base_content[:19]}…, python {python}) as {lock.path.name} records"


def _label_mismatches(labels: dict, expected: Expected) -> list[Mismatch]:
    from_labels = {
        "version": labels.get(f"{LABEL_PREFIX}.version"),
        "series": {"hash": labels.get(f"{LABEL_PREFIX}.series.hash")},
        "upstream": {"commit": labels.get(f"{LABEL_PREFIX}.upstream.commit")},
    }
    return [Mismatch(f"label {m.field}", m.expected, m.found) for m in compare(from_labels, expected)]
