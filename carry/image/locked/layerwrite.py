"""Writing a locked image (carry.image.locked.lockedimage): its image config, the layers' digests remembered by
their contents, and the layers and config pushed over the registry's HTTP API (carry.image.registryhttp) or streamed
into the local engine with `docker load`."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import tarfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from carry.config import Config
from carry.image.locked import ocilayer
from carry.image.locked.engineimage import Kept
from carry.image.locked.layerplan import PREFIX, LayerPlan, PlatformPlan
from carry.image.locked.ocilayer import Written
from carry.platforms import Platform
from carry.util.errors import Failed
from carry.util.fsutil import atomic_write_bytes, atomic_write_text
from carry.util.progress import Progress

if TYPE_CHECKING:
    import docker

    from carry.image.registryhttp import Repository

# -- the image config ------------------------------------------------------------------------------------------


def image_config(config: Config, plan: PlatformPlan, diff_ids: list[str], labels: dict[str, str]) -> bytes:
    base = plan.base.get("Config") or {}
    env = [line for line in base.get("Env") or [] if not line.startswith("PATH=")]
    path = next(
        (line[5:] for line in base.get("Env") or [] if line.startswith("PATH=")),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    )
    env = [line for line in env if line.split("=", 1)[0] not in config.image.env]
    env += [f"{name}={value}" for name, value in sorted(config.image.env.items())]
    env.append(f"PATH={PREFIX}/bin:{path}")
    entrypoint = ["/usr/local/bin/carry-entrypoint", *(config.image.entrypoint or ())]
    if config.image.cmd is not None:
        cmd = list(config.image.cmd)
    else:
        cmd = ["python3"] if config.image.entrypoint is None else []
    body = {
        "architecture": plan.platform.architecture,
        "os": plan.platform.os,
        "created": labels.get("org.opencontainers.image.created", "1970-01-01T00:00:00Z"),
        "config": {
            "Env": env,
            "Entrypoint": entrypoint,
            "Cmd": cmd,
            "Labels": {**(base.get("Labels") or {}), **labels},
            "WorkingDir": base.get("WorkingDir") or "",
            "User": base.get("User") or "",
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    if plan.platform.variant:
        body["variant"] = plan.platform.variant
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


# -- remembered digests ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Digests:
    """Layer digests remembered by their key ($CARRY_CACHE/image-layers/<key>.json)."""

    root: Path

    def get(self, key: str) -> Written | None:
        try:
            return Written(**json.loads((self.root / f"{key}.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def put(self, key: str, written: Written) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.root / f"{key}.json", json.dumps(written.to_json()))


@dataclasses.dataclass(frozen=True)
class LayerOutcome:
    name: str
    written: Written
    action: str  # pushed | already exists | loaded | in the engine
    files: int = 0

    def line(self, platform: Platform) -> str:
        return (
            f"{self.name:<13} {str(platform):<12} {size_text(self.written.size):>9} compressed "
            f"{size_text(self.written.installed):>9} installed {self.files:>6} files  {self.action:<14} "
            f"{self.written.digest[:19]}"
        )


def size_text(value: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value} B"


# -- writing: push over the registry API, or `docker load` ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlatformOutcome:
    platform: Platform
    refs: tuple[str, ...]
    digest: str  # the manifest's digest (pushed) or the image ID (loaded)
    layers: tuple[LayerOutcome, ...]  # base layers first
    config_action: str
    seconds: float
    smoke: str | None = None
    kept: Kept | None = None  # the smoke-tested image in the engine: what its pull fetched, its tags, what went


def push_platform(
    repo: Repository,
    client: docker.DockerClient,
    plan: PlatformPlan,
    digests: Digests,
    labels: dict[str, str],
    config: Config,
    progress: Progress,
) -> tuple[bytes, str, list[LayerOutcome], str]:
    """Every layer (base ones included) and the config pushed unless the registry has them; the manifest
    returned (bytes, digest) for the caller to tag."""
    outcomes = _push_base(repo, client, plan, digests, progress)
    for layer in plan.layers:
        outcomes.append(_push_layer(repo, layer, digests, progress, plan.platform))
    diff_ids = [o.written.diff_id for o in outcomes]
    body = image_config(config, plan, diff_ids, labels)
    manifest, config_action = push_config(repo, body, outcomes)
    return manifest, f"sha256:{hashlib.sha256(manifest).hexdigest()}", outcomes, config_action


def push_config(repo: Repository, body: bytes, outcomes: list[LayerOutcome]) -> tuple[bytes, str]:
    """The image config pushed unless the registry has it, and the Docker v2 manifest of it and the layers (for
    the caller to PUT by digest, then tag: carry.image.pushorder); (manifest, what was done with the config)."""
    config_digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
    config_action = "pushed" if repo.upload_bytes(body, config_digest) else "already exists"
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": registryhttp_types()[0],
            "config": {"mediaType": registryhttp_types()[1], "size": len(body), "digest": config_digest},
            "layers": [
                {"mediaType": registryhttp_types()[2], "size": o.written.size, "digest": o.written.digest}
                for o in outcomes
            ],
        },
        separators=(",", ":"),
    ).encode()
    return manifest, config_action


def registryhttp_types() -> tuple[str, str, str]:
    from carry.image import registryhttp

    return registryhttp.DOCKER_MANIFEST, registryhttp.DOCKER_CONFIG, registryhttp.DOCKER_LAYER


def _push_layer(
    repo: Repository, layer: LayerPlan, digests: Digests, progress: Progress, platform: Platform
) -> LayerOutcome:
    known = digests.get(layer.key)
    if known is not None and known.digest and repo.has_blob(known.digest):
        outcome = LayerOutcome(layer.name, known, "already exists", layer.files)
        progress.phase("layer", outcome.line(platform))
        return outcome
    started = time.monotonic()
    box: dict[str, Written] = {}

    def stream() -> Iterator[bytes]:  # made again for each attempt (registryhttp.Repository.upload)
        return ocilayer.prefetched(
            ocilayer.compressed(
                ocilayer.prefetched(ocilayer.stream(layer.items)), lambda w: box.update(w=w), layer.installed
            )
        )

    repo.upload(stream, lambda: box["w"].digest, f"layer {layer.name} ({platform})")
    written = box["w"]
    digests.put(layer.key, written)
    outcome = LayerOutcome(layer.name, written, "pushed", layer.files)
    progress.phase("layer", f"{outcome.line(platform)}  {time.monotonic() - started:.1f}s")
    return outcome


def _keep(box: dict, written: Written) -> None:
    box["w"] = written


def _kept_digest(box: dict) -> str:
    return box["w"].digest


def _base_key(diff_id: str) -> str:
    return hashlib.sha256(json.dumps({**ocilayer.gzip_key(), "base": diff_id}, sort_keys=True).encode()).hexdigest()


def _push_base(
    repo: Repository, client: docker.DockerClient, plan: PlatformPlan, digests: Digests, progress: Progress
) -> list[LayerOutcome]:
    """The base image's layers, as the engine holds them, pushed unless the registry has them."""
    return push_engine_layers(repo, client, EngineImage(plan.base, plan.base_ref, plan.platform), digests, progress)[0]


@dataclasses.dataclass(frozen=True)
class EngineImage:
    """An image of the local engine (`inspect`: what `docker inspect` says of it), named `ref` in messages."""

    inspect: dict
    ref: str
    platform: Platform

    @property
    def hex(self) -> str:
        return str(self.inspect["Id"]).removeprefix("sha256:")


def push_engine_layers(
    repo: Repository,
    client: docker.DockerClient,
    image: EngineImage,
    digests: Digests,
    progress: Progress,
    want_config: bool = False,
) -> tuple[list[LayerOutcome], bytes | None]:
    """The image's layers as the engine holds them (`docker save`'s uncompressed tars), compressed and pushed the
    same way; remembered by diff_id, so a rerun only asks the registry. With `want_config`, also the image's config
    as the engine stores it (the bytes its image ID hashes), kept beside the digests for the next run."""
    diff_ids = list(image.inspect.get("RootFS", {}).get("Layers") or [])
    config = _kept_config(digests, image.hex) if want_config else None
    found: dict[str, LayerOutcome] = {}
    for diff_id in diff_ids:
        known = digests.get(_base_key(diff_id))
        if known is not None and known.digest and repo.has_blob(known.digest):
            found[diff_id] = LayerOutcome("base", known, "already exists")
    if len(found) < len(diff_ids) or (want_config and config is None):
        saved = client.api.get_image(image.inspect["Id"])
        with tarfile.open(fileobj=_ChunkReader(saved), mode="r|") as archive:  # type: ignore[call-overload]
            for member in archive:
                if not member.isfile():
                    continue
                if member.name in (f"{image.hex}.json", f"blobs/sha256/{image.hex}"):
                    handle = archive.extractfile(member)
                    config = _keep_config(digests, image.hex, handle.read() if handle else b"")
                    continue
                if not (member.name.endswith("layer.tar") or member.name.startswith("blobs/")):
                    continue
                if member.name.startswith("blobs/") and f"sha256:{member.name.rsplit('/', 1)[1]}" not in diff_ids:
                    continue
                written = _push_saved(repo, client, image, archive, member)
                if written.diff_id in diff_ids and written.diff_id not in found:
                    digests.put(_base_key(written.diff_id), written)
                    found[written.diff_id] = LayerOutcome("base", written, "pushed")
    missing = [d for d in diff_ids if d not in found]
    if missing:
        raise Failed(
            f"{image.ref}: `docker save` gave no layer for {missing[0]}; the engine's copy of the image is incomplete"
        )
    if want_config and config is None:
        raise Failed(f"{image.ref}: `docker save` gave no image config for {image.hex[:12]}")
    outcomes = [found[d] for d in diff_ids]
    for outcome in outcomes:
        progress.phase("layer", outcome.line(image.platform))
    return outcomes, config


def _push_saved(
    repo: Repository, client: docker.DockerClient, image: EngineImage, archive: tarfile.TarFile, member: tarfile.TarInfo
) -> Written:
    """One layer tar of `docker save`'s stream pushed; an attempt after a fault reads it from a save of its own."""
    handle = archive.extractfile(member)
    assert handle is not None  # a regular file
    box: dict[str, Written] = {}
    first: list[Iterator[bytes]] = [iter(functools.partial(handle.read, ocilayer.CHUNK), b"")]

    def stream() -> Iterator[bytes]:
        raw = first.pop() if first else _saved_member(client, image.inspect["Id"], member.name)
        return ocilayer.compressed(raw, functools.partial(_keep, box), member.size)

    repo.upload(stream, functools.partial(_kept_digest, box), f"layer {member.name[:30]} of {image.ref}")
    return box["w"]


def _saved_member(client: docker.DockerClient, image_id: str, name: str) -> Iterator[bytes]:
    """The bytes of one member of the image's `docker save` stream, from a save of its own."""
    with tarfile.open(fileobj=_ChunkReader(client.api.get_image(image_id)), mode="r|") as archive:  # type: ignore[call-overload]
        for member in archive:
            if member.name == name:
                handle = archive.extractfile(member)
                if handle is not None:
                    yield from iter(functools.partial(handle.read, ocilayer.CHUNK), b"")
                return
    raise Failed(f"`docker save` of {image_id[:19]} holds no {name} on a second read")


def _kept_config(digests: Digests, image_hex: str) -> bytes | None:
    """The image config kept by an earlier push, when its bytes still hash to the image ID."""
    try:
        data = (digests.root / "configs" / f"{image_hex}.json").read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == image_hex else None


def _keep_config(digests: Digests, image_hex: str, data: bytes) -> bytes:
    if hashlib.sha256(data).hexdigest() != image_hex:
        raise Failed(f"`docker save` gave an image config that does not hash to its image ID {image_hex[:12]}")
    (digests.root / "configs").mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(digests.root / "configs" / f"{image_hex}.json", data)
    return data


class _ChunkReader:
    """A read()-able file over an iterator of byte chunks (the engine's `docker save` stream)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._buffer = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        if size < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data


def load_platform(
    client: docker.DockerClient,
    plan: PlatformPlan,
    digests: Digests,
    labels: dict[str, str],
    config: Config,
    refs: tuple[str, ...],
    progress: Progress,
) -> tuple[str, list[LayerOutcome]]:
    """The image into the local engine: one `docker load` of a docker-archive streamed from the layers
    (uncompressed; the base's layers are the engine's own already and are not sent)."""
    base_ids = list(plan.base.get("RootFS", {}).get("Layers") or [])
    outcomes: list[LayerOutcome] = [LayerOutcome("base", Written("", 0, d, 0, 0), "in the engine") for d in base_ids]
    done: list[Written] = []

    def archive() -> Iterator[bytes]:
        for index, layer in enumerate(plan.layers):
            size = ocilayer.tar_size(layer.items)
            yield _tar_header(f"carry-{index}/layer.tar", size)
            diff = hashlib.sha256()
            for chunk in ocilayer.stream(layer.items):
                diff.update(chunk)
                yield chunk
            yield b"\0" * (-size % 512)
            done.append(Written("", 0, f"sha256:{diff.hexdigest()}", size, layer.installed))
        diff_ids = base_ids + [w.diff_id for w in done]
        body = image_config(config, plan, diff_ids, labels)
        config_name = f"{hashlib.sha256(body).hexdigest()}.json"
        manifest = json.dumps(
            [
                {
                    "Config": config_name,
                    "RepoTags": list(refs),
                    "Layers": [f"base-{i}/layer.tar" for i in range(len(base_ids))]
                    + [f"carry-{i}/layer.tar" for i in range(len(plan.layers))],
                }
            ]
        ).encode()
        for name, data in ((config_name, body), ("manifest.json", manifest)):
            yield _tar_header(name, len(data)) + data + b"\0" * (-len(data) % 512)
        yield b"\0" * 1024

    started = time.monotonic()
    try:
        answer = client.api.load_image(archive())
    except Exception as exc:  # docker.errors.APIError
        raise Failed(f"docker load of the {plan.platform} image failed: {str(exc).strip().splitlines()[-1]}") from None
    text = " ".join(str(part.get("stream") or part.get("error") or "") for part in answer) if answer else ""
    if "error" in text.lower() and "Loaded image" not in text:
        raise Failed(f"docker load of the {plan.platform} image failed: {text.strip()[-300:]}")
    for layer, written in zip(plan.layers, done):
        outcomes.append(LayerOutcome(layer.name, written, "loaded", layer.files))
        progress.phase("layer", outcomes[-1].line(plan.platform))
    image_id = client.api.inspect_image(refs[0])["Id"]
    progress.phase("load", f"{plan.platform}: {image_id[:19]} in {time.monotonic() - started:.1f}s")
    return image_id, outcomes


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)
