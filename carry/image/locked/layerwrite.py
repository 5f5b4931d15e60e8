"""Writing a locked image: its image config, and the layers and config pushed over the registry's HTTP API or streamed
into the local engine with `docker load`; a layer of reporter.BAR_FROM_BYTES or more says each quarter of its tar
written."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tarfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from carry.config import Config
from carry.image.gzlayer import Written, compressed, prefetched
from carry.image.layerpush import Digests, EngineImage, LayerOutcome, push_config, push_engine_layers, size_text
from carry.image.locked import ocilayer
from carry.image.locked.engineimage import Kept
from carry.image.locked.layerplan import PREFIX, LayerPlan, PlatformPlan
from carry.platforms import Platform
from carry.util import reporter
from carry.util.errors import Failed

if TYPE_CHECKING:
    from collections.abc import Iterable

    import docker

    from carry.image.locked.registrycache import Attached, Reuse
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
    smoke_record: dict | None = None  # what the smoke test proved, recorded with the image (smoketest)
    record: Attached | None = None  # the record pushed beside the manifest (registrycache.push_record)
    sent: int = 0  # bytes sent to the registry by the whole run so far (blobs, manifests, records)
    received: int = 0  # bytes read from it
    trust_sent: int = 0  # of `sent`: the signatures and attestations (SBOM, provenance), with a key


def push_platform(
    repo: Repository,
    client: docker.DockerClient,
    plan: PlatformPlan,
    reuse: Reuse,
    labels: dict[str, str],
    config: Config,
) -> tuple[bytes, str, list[LayerOutcome], str]:
    """Every layer and the config pushed unless the registry has them (`reuse`); the manifest (bytes, digest) returned
    for the caller to tag."""
    outcomes = _push_base(repo, client, plan, reuse)
    outcomes += [_push_layer(repo, layer, reuse, plan.platform) for layer in plan.layers]
    diff_ids = [o.written.diff_id for o in outcomes]
    body = image_config(config, plan, diff_ids, labels)
    manifest, config_action = push_config(repo, body, outcomes)
    return manifest, f"sha256:{hashlib.sha256(manifest).hexdigest()}", outcomes, config_action


def _push_layer(repo: Repository, layer: LayerPlan, reuse: Reuse, platform: Platform) -> LayerOutcome:
    found = reuse.find(platform, layer.name, layer.key)
    if found is not None:
        files = layer.files if layer.planned else found.files
        outcome = LayerOutcome(layer.name, found.written, found.action, files, layer.key, found.source)
        reporter.phase("layer", outcome.line(platform))
        return outcome
    if not layer.planned:
        raise Failed(f"layer {layer.name} of {platform} was not planned, and the registry has none of its key")
    why = reuse.why(platform, layer.name, layer.key)
    started = time.monotonic()
    box: dict[str, Written] = {}
    said = reporter.current()  # the bar is advanced in the thread that reads the tar (gzlayer.prefetched)
    # (installed bytes, fewer than the tar's: a small layer's tar is not measured for a bar it would not show)
    size = ocilayer.tar_size(layer.items) if layer.installed >= reporter.BAR_FROM_BYTES else 0

    def stream() -> Iterator[bytes]:  # made again for each attempt (registryhttp.Repository.upload)
        tar = _counted(ocilayer.stream(layer.items), _bar(said, size, layer, platform))
        return prefetched(compressed(prefetched(tar), lambda w: box.update(w=w), layer.installed))

    repo.upload(stream, lambda: box["w"].digest, f"layer {layer.name} ({platform})")
    written = box["w"]
    reuse.digests.put(layer.key, written)
    outcome = LayerOutcome(layer.name, written, "pushed", layer.files, layer.key, why=why)
    reporter.phase("layer", f"{outcome.line(platform)}  {time.monotonic() - started:.1f}s")
    return outcome


def _push_base(repo: Repository, client: docker.DockerClient, plan: PlatformPlan, reuse: Reuse) -> list[LayerOutcome]:
    """The base image's layers, as the engine holds them, pushed unless the registry has them (this machine's
    remembered digests or the previous image's record, `reuse`)."""

    def known(key: str) -> LayerOutcome | None:
        found = reuse.find(plan.platform, "base", key)
        return None if found is None else LayerOutcome("base", found.written, found.action, 0, key, found.source)

    image = EngineImage(plan.base, plan.base_ref, plan.platform)
    return push_engine_layers(
        repo, client, image, reuse.digests, known=known, why=lambda key: reuse.why(plan.platform, "base", key)
    )[0]


def load_platform(
    client: docker.DockerClient,
    plan: PlatformPlan,
    digests: Digests,
    labels: dict[str, str],
    config: Config,
    refs: tuple[str, ...],
) -> tuple[str, list[LayerOutcome]]:
    """The image into the local engine: one `docker load` of a docker-archive streamed from the layers
    (uncompressed; the base's layers are the engine's own already and are not sent)."""
    base_ids = list(plan.base.get("RootFS", {}).get("Layers") or [])
    outcomes: list[LayerOutcome] = [LayerOutcome("base", Written("", 0, d, 0, 0), "in the engine") for d in base_ids]
    done: list[Written] = []
    said = reporter.current()

    def archive() -> Iterator[bytes]:
        for index, layer in enumerate(plan.layers):
            size = ocilayer.tar_size(layer.items)
            yield _tar_header(f"carry-{index}/layer.tar", size)
            diff = hashlib.sha256()
            for chunk in _counted(ocilayer.stream(layer.items), _bar(said, size, layer, plan.platform)):
                diff.update(chunk)
                yield chunk
            yield b"\0" * (-size % 512)
            done.append(Written("", 0, f"sha256:{diff.hexdigest()}", size, layer.installed))
        diff_ids = base_ids + [w.diff_id for w in done]
        body = image_config(config, plan, diff_ids, labels)
        config_name = f"{hashlib.sha256(body).hexdigest()}.json"
        layers = [f"base-{i}/layer.tar" for i in range(len(base_ids))]
        layers += [f"carry-{i}/layer.tar" for i in range(len(plan.layers))]
        manifest = json.dumps([{"Config": config_name, "RepoTags": list(refs), "Layers": layers}]).encode()
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
        reporter.phase("layer", outcomes[-1].line(plan.platform))
    image_id = client.api.inspect_image(refs[0])["Id"]
    reporter.phase("load", f"{plan.platform}: {image_id[:19]} in {time.monotonic() - started:.1f}s")
    return image_id, outcomes


def _bar(said: reporter.Reporter, size: int, layer: LayerPlan, platform: Platform) -> reporter.Bar:
    """The bar of one layer's tar of `size` bytes: `layer: 25% of 3.21 GB torch (linux/amd64)`."""
    shown = f"{size_text(size)} {layer.name} ({platform})"
    return said.bar("layer", size, minimum=reporter.BAR_FROM_BYTES, shown=shown)


def _counted(chunks: Iterable[bytes], bar: reporter.Bar) -> Iterator[bytes]:
    for chunk in chunks:
        bar.advance(len(chunk))
        yield chunk


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)
