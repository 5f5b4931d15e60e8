"""The publish stage: what both image families hand a pushed image to, and the one order every `image --push` and
`manifest` keeps, so that a run killed anywhere leaves no tag on an incomplete or mixed image (docs/reliability.md,
"Registry and push"). A family writes its blobs and config and hands each platform over (`Stage.platform`,
`Stage.record`); then, in this order:

1. each platform's manifest PUT by digest: no tag names it yet;
2. its signature and chosen attestations (cosign's `sha256-<hex>.sig` / `.att`, by digest: carry.image.attest); a
   locked image's smoke test (pulled by digest) and record (`sha256-<hex>.cache`, registrycache), signed alike;
3. with every platform there, the manifest list PUT by digest, and its signature;
4. only then the tags: every platform's own (`<VERSION>-<arch>`; with one platform, every tag), then the shared ones.

A tag therefore moves from one whole, signed image to another; a rerun PUTs the same bytes under the same digests.
This module is the families' one door to signing: they import neither carry.trust nor carry.image.attest
(tests/test_architecture.py), only the names below."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from carry.image import registryhttp
from carry.image.attest import PlatformFacts, Wheel, wheel_index, wheel_of
from carry.image.registryhttp import Repository
from carry.platforms import Platform
from carry.trust.kinds import DEFAULT
from carry.util import reporter

if TYPE_CHECKING:
    from carry.image.attest import Attester
    from carry.trust.keys import PublicKey

__all__ = ["DEFAULT", "Attester", "Manifest", "PublicKey", "Stage", "PlatformFacts", "Wheel", "wheel_index", "wheel_of"]


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


class Stage:
    """One push's publishing into `repo`, in the order above: `platform` for each platform image as its family
    finishes writing it, `record` for what a family records beside one, `tags` last. `trust_sent`: the bytes its
    signatures and attestations sent."""

    def __init__(self, repo: Repository, attester: Attester | None, locked: bool = False):
        self.repo, self.attester, self.locked = repo, attester, locked
        self.manifests: list[Manifest] = []
        self.trust_sent = 0

    @contextmanager
    def _trust(self) -> Iterator[None]:
        before = self.repo.sent
        try:
            yield
        finally:
            self.trust_sent += self.repo.sent - before

    def platform(self, manifest: Manifest, subject: PlatformFacts | Callable[[], PlatformFacts]) -> str:
        """Steps 1 and 2: the manifest by digest, then (with an attester) its signature and attestations, made from
        `subject` (asked only then)."""
        put(self.repo, manifest.digest, manifest.body, manifest.media_type)
        self.manifests.append(manifest)
        if self.attester is not None:
            facts = self.attester.facts(subject() if callable(subject) else subject)
            with self._trust():
                self.attester.platform(self.repo, facts, manifest.digest, self.locked)
        return manifest.digest

    def record(self, tag: str, blobs: list[bytes], manifest: bytes, media_type: str) -> tuple[int, bool]:
        """Step 2's end: an artifact a family records beside a platform manifest (its blobs, its manifest under
        `tag`), signed with the attester's key. (bytes sent, signed)."""
        before = self.repo.sent
        for blob in blobs:
            self.repo.upload_bytes(blob, registryhttp.digest_of(blob))
        put(self.repo, tag, manifest, media_type)  # a rerun's same artifact is not PUT again
        key = self.attester.key if self.attester is not None else None
        if self.attester is not None and key is not None:
            from carry.trust import attach

            attach.sign(self.repo, key, self.attester.config.image.name, registryhttp.digest_of(manifest))
        return self.repo.sent - before, key is not None

    def tags(self, shared: tuple[str, ...], manifests: list[Manifest] | None = None) -> dict[str, str]:
        """Steps 3 and 4, once each platform's manifest and signatures are in the registry (this stage's, or
        `manifests` pushed by earlier runs): with `shared` tags, the list by digest and its signature; then every
        platform's own tags, then the shared tags. ref -> digest."""
        manifests = self.manifests if manifests is None else manifests
        pushed: dict[str, str] = {}
        index = registryhttp.manifest_list((m.body, m.media_type, _platform(m.platform)) for m in manifests)
        index_digest = registryhttp.digest_of(index)
        everything = ", ".join(str(m.platform) for m in manifests)
        if shared:
            put(self.repo, index_digest, index, registryhttp.DOCKER_LIST)
            reporter.phase("manifest", f"list {index_digest[:19]} of {everything}")
            if self.attester is not None:
                with self._trust():
                    self.attester.index(self.repo, index_digest)
        named = [(ref, m.body, m.media_type, m.digest, str(m.platform)) for m in manifests for ref in m.refs]
        named += [(ref, index, registryhttp.DOCKER_LIST, index_digest, everything) for ref in shared]
        for ref, body, media_type, digest, platforms in named:
            moved = put(self.repo, tag_of(ref), body, media_type)
            reporter.phase("tag", f"{ref} {'->' if moved else 'names'} {digest[:19]} ({platforms})")
            pushed[ref] = digest
        return pushed


def put(repo: Repository, reference: str, body: bytes, media_type: str) -> bool:
    """`body` under `reference` (a tag, or its digest) unless the registry names that digest there already (a rerun
    writes nothing); True when it was PUT."""
    if repo.manifest_digest(reference) == registryhttp.digest_of(body):
        return False
    repo.put_manifest(reference, body, media_type)
    return True


def signature_problem(repo: Repository, key: PublicKey, repository: str, digest: str) -> str:
    """ "" when what an earlier push signed (`digest`, in `repo`) carries a signature `key` verifies, else why not."""
    from carry.trust import attach

    checked = attach.check_signature(repo, key, repository, digest)
    return "" if checked.ok else checked.problems[0]


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
