"""Pushing layers and an image config over the registry's HTTP API, for both image paths: layer digests remembered by
their key (`Digests`), an engine image's layers pushed as `docker save` gives them (`push_engine_layers`), and the
config with its manifest (`push_config`) for the caller to PUT by digest."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from carry.image.gzlayer import CHUNK, Written, compressed, gzip_key
from carry.image.registryhttp import DOCKER_CONFIG, DOCKER_LAYER, DOCKER_MANIFEST
from carry.platforms import Platform
from carry.util import reporter
from carry.util.errors import Failed
from carry.util.fsutil import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    import docker

    from carry.image.registryhttp import Repository


@dataclasses.dataclass(frozen=True)
class Digests:
    """Layer digests remembered by their key ($CARRY_CACHE/image-layers/<key>.json), each sealed by its sha256: a
    corrupt entry (a wrong diff_id would make a broken image) is removed, said, and the layer written again."""

    root: Path

    def get(self, key: str, said: bool = False) -> Written | None:
        """The entry of `key`, or None; a corrupt one is removed (and, when `said`, a `layer` line says so)."""
        path = self.root / f"{key}.json"
        try:
            text = path.read_text()
        except OSError:
            return None
        try:
            data = json.loads(text)
            body, recorded = data["written"], data["sha256"]
            found = _body_sha256(body)
            if found == recorded:
                return Written(**body)
            why = ""
        except (ValueError, TypeError, KeyError):  # unreadable, or an older carry's entry without its sha256
            found, recorded, why = "", "", "not a digest entry with its sha256 (unreadable, or an older carry's)"
        from carry.util import integrity

        path.unlink(missing_ok=True)
        if said:
            what = "removed; not used (the layer is written again, or taken from the registry's record)"
            reporter.phase("layer", integrity.Corrupt(path, found, recorded, why).line(what))
        return None

    def put(self, key: str, written: Written) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        body = written.to_json()
        atomic_write_text(self.root / f"{key}.json", json.dumps({"written": body, "sha256": _body_sha256(body)}))


def _body_sha256(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class LayerOutcome:
    name: str
    written: Written
    action: str  # pushed | already exists | mounted | loaded | in the engine
    files: int = 0
    key: str = ""  # what the layer is made of (a locked layer's LayerPlan.key; a base layer's base_key)
    source: str = ""  # where a layer not written was known from: "" (this machine), "recorded by REF", "from REPO"
    why: str = ""  # why a pushed layer was written (nothing reusable, and what was found instead)

    def line(self, platform: Platform) -> str:
        tail = f"  ({self.source})" if self.source else f"  (written: {self.why})" if self.why else ""
        return (
            f"{self.name:<13} {str(platform):<12} {size_text(self.written.size):>9} compressed "
            f"{size_text(self.written.installed):>9} installed {self.files:>6} files  {self.action:<14} "
            f"{self.written.digest[:19]}{tail}"
        )


def size_text(value: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value} B"


def push_config(repo: Repository, body: bytes, outcomes: list[LayerOutcome]) -> tuple[bytes, str]:
    """The config pushed unless the registry has it; (the Docker v2 manifest, what was done with the config)."""
    config_digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
    config_action = "pushed" if repo.upload_bytes(body, config_digest) else "already exists"
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": {"mediaType": DOCKER_CONFIG, "size": len(body), "digest": config_digest},
            "layers": [
                {"mediaType": DOCKER_LAYER, "size": o.written.size, "digest": o.written.digest} for o in outcomes
            ],
        },
        separators=(",", ":"),
    ).encode()
    return manifest, config_action


def base_key(diff_id: str) -> str:
    """An engine layer's key: its diff_id (what it holds) and the compressor."""
    return hashlib.sha256(json.dumps({**gzip_key(), "base": diff_id}, sort_keys=True).encode()).hexdigest()


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
    want_config: bool = False,
    known: Callable[[str], LayerOutcome | None] | None = None,
    why: Callable[[str], str] = lambda key: "",
) -> tuple[list[LayerOutcome], bytes | None]:
    """The engine image's layers (`docker save`'s tars) compressed and pushed, remembered by diff_id; with
    `want_config`, the engine's own config bytes too. `known(key)` finds a layer elsewhere, `why(key)` says why one was
    written."""
    diff_ids = list(image.inspect.get("RootFS", {}).get("Layers") or [])
    config = _kept_config(digests, image.hex) if want_config else None
    found: dict[str, LayerOutcome] = {}
    for diff_id in diff_ids:
        key = base_key(diff_id)
        if known is not None:
            outcome = known(key)
        else:
            remembered = digests.get(key, said=True)
            has = remembered is not None and remembered.digest and repo.has_blob(remembered.digest)
            outcome = LayerOutcome("base", remembered, "already exists", 0, key) if has and remembered else None
        if outcome is not None:
            found[diff_id] = outcome
    if len(found) < len(diff_ids) and not image.inspect.get("Id"):
        missing = next(d for d in diff_ids if d not in found)
        raise Failed(
            f"{image.ref}: the registry no longer holds its layer {missing[:19]}… and the engine has no copy of it "
            f"to push that from; run the command again (the image is then made here)"
        )
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
                    key = base_key(written.diff_id)
                    digests.put(key, written)
                    found[written.diff_id] = LayerOutcome("base", written, "pushed", 0, key, why=why(key))
    missing = [d for d in diff_ids if d not in found]
    if missing:
        raise Failed(
            f"{image.ref}: `docker save` gave no layer for {missing[0]}; the engine's copy of the image is incomplete"
        )
    if want_config and config is None:
        raise Failed(f"{image.ref}: `docker save` gave no image config for {image.hex[:12]}")
    outcomes = [found[d] for d in diff_ids]
    for outcome in outcomes:
        reporter.phase("layer", outcome.line(image.platform))
    return outcomes, config


def _push_saved(
    repo: Repository, client: docker.DockerClient, image: EngineImage, archive: tarfile.TarFile, member: tarfile.TarInfo
) -> Written:
    """One layer tar of `docker save`'s stream pushed; an attempt after a fault reads it from a save of its own."""
    handle = archive.extractfile(member)
    assert handle is not None  # a regular file
    box: dict[str, Written] = {}
    first: list[Iterator[bytes]] = [iter(functools.partial(handle.read, CHUNK), b"")]

    def stream() -> Iterator[bytes]:
        raw = first.pop() if first else _saved_member(client, image.inspect["Id"], member.name)
        return compressed(raw, lambda w: box.update(w=w), member.size)

    repo.upload(stream, lambda: box["w"].digest, f"layer {member.name[:30]} of {image.ref}")
    return box["w"]


def _saved_member(client: docker.DockerClient, image_id: str, name: str) -> Iterator[bytes]:
    """The bytes of one member of the image's `docker save` stream, from a save of its own."""
    with tarfile.open(fileobj=_ChunkReader(client.api.get_image(image_id)), mode="r|") as archive:  # type: ignore[call-overload]
        for member in archive:
            if member.name == name:
                handle = archive.extractfile(member)
                if handle is not None:
                    yield from iter(functools.partial(handle.read, CHUNK), b"")
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
