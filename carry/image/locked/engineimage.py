"""The locked image kept in the local engine after its smoke test (docs/images.md: "Smoke test"): pulled back by digest
(`pull`, which fetches only the layers the engine lacks, counted from its progress messages), tagged as the Dockerfile
path tags it, and the engine tidied (`keep`) so that it holds one image per platform of the latest VERSION however often
`image` runs; a newer VERSION's image, one a container still uses, and one another tag names are left, and said."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Iterable, Sequence

import docker.errors

from carry.image.layerpush import size_text
from carry.platforms import Platform
from carry.util.errors import Failed

VERSION_LABEL = "io.carry.version"
PLATFORM_LABEL = "io.carry.platform"


@dataclasses.dataclass(frozen=True)
class Pulled:
    """What one `docker pull` fetched: layers of the manifest, those downloaded, their compressed bytes."""

    layers: int
    fetched: int
    size: int
    seconds: float

    def to_json(self) -> dict:
        return {"layers": self.layers, "fetched": self.fetched, "bytes": self.size, "seconds": round(self.seconds, 2)}


@dataclasses.dataclass(frozen=True)
class Kept:
    """The engine after `keep`: the image's tags, what was untagged and removed, what was left and why."""

    image_id: str
    refs: tuple[str, ...]
    untagged: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  # image IDs
    left: tuple[str, ...] = ()  # "<image id> (why)"
    pulled: Pulled | None = None

    def line(self, platform: Platform) -> str:
        parts = [f"{platform}: loaded"]
        if (pulled := self.pulled) is not None:
            parts = [
                f"{platform}: pulled {pulled.fetched} of {pulled.layers} layer(s), {size_text(pulled.size)} in "
                f"{pulled.seconds:.1f}s ({pulled.layers - pulled.fetched} already in the engine)"
            ]
        parts.append(f"kept as {', '.join(self.refs)}")
        if self.untagged:
            parts.append(f"untagged {', '.join(self.untagged)} (an older VERSION)")
        if self.removed:
            parts.append(f"removed {len(self.removed)} image(s) no tag names")
        if self.left:
            parts.append(f"left {'; '.join(self.left)}")
        return "; ".join(parts)

    def to_json(self) -> dict:
        return {
            "image": self.image_id,
            "refs": list(self.refs),
            "untagged": list(self.untagged),
            "removed": list(self.removed),
            "left": list(self.left),
            "pulled": self.pulled.to_json() if self.pulled else None,
        }


def pull(
    client: docker.DockerClient, ref: str, platform: Platform, auth: dict | None, layers: Sequence[tuple[str, int]]
) -> Pulled:
    """`docker pull ref` (a digest reference) for `platform`; `layers` are the manifest's (digest, compressed size).
    A layer the engine reports as "Already exists" was not fetched; every other one was."""
    repository, _, digest = ref.partition("@")
    started = time.monotonic()
    present: set[str] = set()
    try:
        for event in client.api.pull(
            repository, tag=digest, platform=str(platform), auth_config=auth, stream=True, decode=True
        ):
            if "error" in event:
                raise Failed(f"cannot pull {ref} for {platform}: {event['error']}")
            if event.get("status") == "Already exists" and event.get("id"):
                present.add(event["id"])
    except docker.errors.APIError as exc:
        raise Failed(f"cannot pull {ref} for {platform}: {_short(exc)}") from None
    fetched = [(d, size) for d, size in layers if _short_id(d) not in present]
    return Pulled(len(layers), len(fetched), sum(size for _, size in fetched), time.monotonic() - started)


def holds(client: docker.DockerClient, repository: str, platform: Platform, diff_ids: Iterable[str]) -> bool:
    """Whether the engine holds every layer `diff_ids` names in an image of `repository` for `platform` (the one
    an earlier run kept): a pull of the new image then fetches only what changed."""
    wanted = set(diff_ids)
    held: set[str] = set()
    for image in client.images.list(name=repository):
        if (image.labels or {}).get(PLATFORM_LABEL) == str(platform):
            held.update((image.attrs.get("RootFS") or {}).get("Layers") or ())
    return bool(held) and wanted <= held


def named(client: docker.DockerClient, refs: Iterable[str]) -> set[str]:
    """The image IDs `refs` name in the engine now."""
    found = set()
    for ref in refs:
        with contextlib.suppress(docker.errors.NotFound):
            found.add(client.api.inspect_image(ref)["Id"])
    return found


def keep(
    client: docker.DockerClient,
    image_id: str,
    refs: Sequence[str],
    platform: Platform,
    version: str,
    before: Iterable[str] = (),
) -> Kept:
    """Tag `image_id` with `refs` (one repository), then tidy that repository for `platform`: the images `before`
    (what the refs named until now) and every image of an older VERSION lose the tags carry gave them (those naming
    their VERSION) and are removed once nothing names them."""
    repository = refs[0].rsplit(":", 1)[0]
    for ref in refs:
        name, tag = ref.rsplit(":", 1)
        client.api.tag(image_id, name, tag)
    candidates = {i for i in before if i != image_id}
    untagged: list[str] = []
    left: list[str] = []
    for image in client.images.list(name=repository):
        labels = image.labels or {}
        if image.id == image_id or labels.get(PLATFORM_LABEL) != str(platform):
            continue
        other = labels.get(VERSION_LABEL, "")
        if other and _newer(other, version):
            left.append(f"{image.id[:19]} ({other}: a newer VERSION)")
            continue
        candidates.add(image.id)
        if other == version:
            continue  # this VERSION's tags are `refs`, moved above; any other tag is not carry's
        for tag in image.tags:
            name, _, label = tag.rpartition(":")
            if name == repository and other and other in label:
                try:
                    client.images.remove(tag)
                except docker.errors.APIError as exc:
                    left.append(f"{tag} ({_short(exc)})")
                else:
                    untagged.append(tag)
    removed = []
    for old in sorted(candidates):
        try:
            image = client.images.get(old)
        except docker.errors.NotFound:
            removed.append(old)  # its last tag removed above took it
            continue
        if image.tags:
            left.append(f"{old[:19]} (tagged {', '.join(image.tags)})")
            continue
        try:
            client.images.remove(old)  # its digest references (NAME@sha256:...) go with it
        except docker.errors.APIError as exc:
            left.append(f"{old[:19]} ({_short(exc)})")
        else:
            removed.append(old)
    return Kept(image_id, tuple(refs), tuple(untagged), tuple(removed), tuple(left))


def forget_pulled(client: docker.DockerClient, ref: str) -> None:
    """A pulled image that failed its smoke test: its digest reference removed (the image with it, unless another
    reference names it)."""
    with contextlib.suppress(docker.errors.APIError):  # still used or named by another tag the user made
        client.images.remove(ref)


def _newer(version: str, than: str) -> bool:
    """Whether VERSION `version` (`YYYYMMDD.N`) is newer than `than`, comparing their numbers in order."""
    mine, theirs = ([int(n) for n in re.findall(r"\d+", v)] for v in (version, than))
    return mine > theirs


def _short_id(digest: str) -> str:
    """The layer ID the engine's pull progress uses: the digest's first 12 hex digits."""
    return digest.split(":", 1)[-1][:12]


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__
