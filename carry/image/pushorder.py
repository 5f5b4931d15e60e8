"""The order every `image --push` and `manifest` keeps, for the locked and the Dockerfile image alike, so that a run
killed anywhere leaves no tag on an incomplete or mixed image (docs/reliability.md, "Registry and push"):

1. each platform's blobs and config, then its manifest PUT by digest: no tag names it yet;
2. its signature and attestations (cosign's `sha256-<hex>.sig` / `.att`, by digest too); a locked image's smoke
   test (pulled by digest) and its record (`sha256-<hex>.cache`, carry.image.locked.registrycache);
3. with every platform there, the manifest list PUT by digest, and its signature;
4. only then the tags, each one PUT: every platform's own (`<VERSION>-<arch>`; with one platform, every tag), then
   the shared ones (VERSION, the templates, --tag), each naming the list.

A tag therefore moves from one whole, signed image to another. A rerun finds every blob, manifest and signature in
the registry and PUTs the same bytes again: the digests are the same, nothing in the registry changes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from carry.image import registryhttp
from carry.image.registryhttp import Repository
from carry.platforms import Platform
from carry.util import reporter


@dataclasses.dataclass(frozen=True)
class Manifest:
    """One platform's image manifest, and the tags that name it alone."""

    platform: Platform
    body: bytes
    media_type: str
    refs: tuple[str, ...]

    @property
    def digest(self) -> str:
        return registryhttp.digest_of(self.body)


def put_platform(repo: Repository, manifest: Manifest) -> str:
    """Step 1's end: the platform's manifest under its digest, no tag."""
    put(repo, manifest.digest, manifest.body, manifest.media_type)
    return manifest.digest


def put(repo: Repository, reference: str, body: bytes, media_type: str) -> bool:
    """`body` under `reference` (a tag, or its digest) unless the registry names that digest there already (a rerun
    writes nothing); True when it was PUT."""
    if repo.manifest_digest(reference) == registryhttp.digest_of(body):
        return False
    repo.put_manifest(reference, body, media_type)
    return True


def index_of(manifests: list[Manifest]) -> bytes:
    """The manifest list of the platforms' manifests, in their order."""
    return registryhttp.manifest_list((m.body, m.media_type, _platform(m.platform)) for m in manifests)


def finish(
    repo: Repository,
    manifests: list[Manifest],
    shared: tuple[str, ...],
    sign_index: Callable[[str], object] | None,
) -> dict[str, str]:
    """Steps 3 and 4 (each platform's manifest and signatures are in the registry): with `shared` tags, the list by
    digest and `sign_index(digest)`; then every platform's own tags, then the shared tags. ref -> digest."""
    pushed: dict[str, str] = {}
    index = index_of(manifests) if shared else b""
    index_digest = registryhttp.digest_of(index) if shared else ""
    everything = ", ".join(str(m.platform) for m in manifests)
    if shared:
        put(repo, index_digest, index, registryhttp.DOCKER_LIST)
        reporter.phase("manifest", f"list {index_digest[:19]} of {everything}")
        if sign_index is not None:
            sign_index(index_digest)
    for manifest in manifests:
        for ref in manifest.refs:
            moved = put(repo, tag_of(ref), manifest.body, manifest.media_type)
            reporter.phase("tag", f"{ref} {'->' if moved else 'names'} {manifest.digest[:19]} ({manifest.platform})")
            pushed[ref] = manifest.digest
    for ref in shared:
        moved = put(repo, tag_of(ref), index, registryhttp.DOCKER_LIST)
        reporter.phase("tag", f"{ref} {'->' if moved else 'names'} {index_digest[:19]} ({everything})")
        pushed[ref] = index_digest
    return pushed


def pushed_platform(repo: Repository, tag: str, platform: Platform) -> Manifest | None:
    """`platform`'s image manifest under `tag` in the registry (no tags of its own: `manifest` re-tags only the
    lists): the tag's own when its config says that platform, or the entry of a list that names it; None when the
    registry has neither."""
    found = repo.get_manifest(tag)
    if found is None:
        return None
    media_type, body = found[0].split(";", 1)[0].strip(), found[1]
    try:
        document = json.loads(body)
        if media_type in (registryhttp.DOCKER_LIST, registryhttp.OCI_INDEX):
            for entry in document.get("manifests") or []:
                if _matches(entry.get("platform") or {}, platform):
                    return pushed_platform(repo, entry["digest"], platform)
            return None
        held = json.loads(repo.get_blob(document["config"]["digest"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return Manifest(platform, body, media_type, ()) if _matches(held, platform) else None


def _matches(held: dict, platform: Platform) -> bool:
    """Whether an image config or a list entry's platform is `platform`."""
    variant = held.get("variant") or None
    if held.get("architecture") == "arm64" and variant == "v8":
        variant = None  # arm64's only variant, which some builders write and others leave out
    return (held.get("os"), held.get("architecture"), variant) == (platform.os, platform.architecture, platform.variant)


def tag_of(ref: str) -> str:
    return ref.rsplit(":", 1)[1]


def _platform(platform: Platform) -> dict[str, str]:
    entry = {"architecture": platform.architecture, "os": platform.os}
    if platform.variant:
        entry["variant"] = platform.variant
    return entry
