"""The registry as the cache of a locked image (docs/images.md, "A fresh runner"): beside each pushed platform manifest,
under the tag `sha256-<hex>.cache`, an OCI artifact whose config is the `Record` (per layer its key, digests and sizes;
the base; the fixed wheel; the smoke result) and whose layers are one gzip `Facts` blob per layer (the modules it
installs and removes, the wheels it was written from). It is pushed once the image's smoke test passed, signed with the
image's key when there is one. A later run with an empty cache reads it back.

What a run trusts, and why:
- a record only beside the manifest it names (`subject`), each entry only when it is that manifest's layer at its
  position (digest and size) and the config's diff_id there: the record describes the image as pushed;
- with a key, only a record whose artifact carries a signature that verifies with it;
- an entry only for a layer whose key is this run's, and only while the target repository holds its blob at its
  size (HEAD), or takes it by a cross-repo mount. A remembered digest is never used without its blob.
Anything else is built, and one line says why."""

from __future__ import annotations

import dataclasses
import gzip
import json
from typing import TYPE_CHECKING

from carry.image import publish
from carry.image.gzlayer import Written
from carry.image.locked.ocilayer import Item
from carry.image.registryhttp import OCI_MANIFEST, digest_of
from carry.platforms import Platform
from carry.util.errors import Failed

if TYPE_CHECKING:
    from carry.image.layerpush import Digests
    from carry.image.publish import PublicKey
    from carry.image.registryhttp import Repository


FORMAT = 1
SUFFIX = ".cache"
RECORD_MEDIA = "application/vnd.carry.layers.v1+json"
FACTS_MEDIA = "application/vnd.carry.layer-facts.v1+json+gzip"


def cache_tag(digest: str) -> str:
    """`sha256-<hex>.cache`: the record of the platform manifest `digest`."""
    return digest.replace(":", "-", 1) + SUFFIX


# -- the record ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
    """One layer of a pushed image: what it is (`key`), where it is (digest, sizes) and its facts blob."""

    name: str
    key: str
    digest: str
    diff_id: str
    size: int
    tar_size: int
    installed: int
    files: int = 0
    facts: str = ""  # the digest of its Facts blob, "" when it has none

    def written(self) -> Written:
        return Written(self.digest, self.size, self.diff_id, self.tar_size, self.installed)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Record:
    """What one pushed platform image records for a later run."""

    subject: str  # the platform manifest's digest
    platform: str
    entries: tuple[Entry, ...]
    base: dict | None = None  # the runtime base the layers are on (runtimebase.RuntimeBase.record)
    wheel: dict | None = None  # the fixed wheel: {"file", "sha256", "layer"}
    smoke: dict | None = None  # what the smoke test proved (smoketest), None: it did not run

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT,
            "subject": self.subject,
            "platform": self.platform,
            "layers": [entry.to_json() for entry in self.entries],
            "base": self.base,
            "wheel": self.wheel,
            "smoke": self.smoke,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Record:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ValueError(f"format {body.get('format') if isinstance(body, dict) else '?'}, not {FORMAT}")
        entries = tuple(Entry(**entry) for entry in body["layers"])
        return cls(
            str(body["subject"]), str(body["platform"]), entries, body.get("base"), body.get("wheel"), body.get("smoke")
        )


@dataclasses.dataclass(frozen=True)
class Facts:
    """What one layer holds, for a later run that does not read it: the dotted modules it installs into site-packages,
    those its whiteouts remove, and the wheel files it was written from (name, file name, sha256)."""

    modules: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    wheels: tuple[tuple[str, str, str], ...] = ()

    def blob(self) -> bytes:
        body = {"modules": list(self.modules), "removed": list(self.removed), "wheels": [list(w) for w in self.wheels]}
        return gzip.compress(json.dumps(body, sort_keys=True, separators=(",", ":")).encode(), mtime=0)

    @classmethod
    def from_blob(cls, data: bytes) -> Facts:
        body = json.loads(gzip.decompress(data))
        return cls(
            tuple(body.get("modules") or ()),
            tuple(body.get("removed") or ()),
            tuple((str(w[0]), str(w[1]), str(w[2])) for w in body.get("wheels") or ()),
        )


def module_name(relative: str) -> str | None:
    """The dotted module a path under site-packages makes importable (`torch/nn/functional.py` -> torch.nn.functional,
    `vllm/_C.abi3.so` -> vllm._C, a directory -> a package or namespace), None for anything else (data, metadata)."""
    parts = relative.split("/")
    last = parts[-1]
    if last.endswith(".py"):
        parts[-1] = last[:-3]
        if parts[-1] == "__init__":
            parts.pop()
    elif last.endswith((".so", ".pyd")):
        parts[-1] = last.split(".", 1)[0]
    elif "." in last:
        return None
    if not parts or not all(part.isidentifier() for part in parts):
        return None
    return ".".join(parts)


def facts_of(items: tuple[Item, ...], site: str, wheels: tuple[tuple[str, str, str], ...] = ()) -> Facts:
    """A layer's facts from its items (`site`: site-packages, without the leading '/')."""
    modules, removed = set(), set()
    prefix = site.strip("/") + "/"
    for item in items:
        name = module_name(item.path[len(prefix) :]) if item.path.startswith(prefix) else None
        if name and item.kind == "whiteout":
            removed.add(name)
        elif name and item.kind in ("dir", "file", "symlink"):
            modules.add(name)
    return Facts(tuple(sorted(modules)), tuple(sorted(removed)), wheels)


# -- the previous image ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Previous:
    """One platform's previous image in the registry: where, its record, its trusted entries and a note why."""

    platform: Platform
    ref: str
    repo: Repository | None = None  # the repository it is in (reads its blobs; another one of this registry: mounts)
    digest: str = ""
    record: Record | None = None
    trusted: dict[str, Entry] = dataclasses.field(default_factory=dict)
    untrusted: dict[str, str] = dataclasses.field(default_factory=dict)  # layer name -> why its entry is not used
    note: str = ""
    _blobs: dict[str, bytes] = dataclasses.field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return self.record is not None and bool(self.trusted)

    def by_name(self, name: str) -> Entry | None:
        """The record's entry of the layer named `name` (the last one of that name)."""
        found = [entry for entry in self.record.entries if entry.name == name] if self.record else []
        return found[-1] if found else None

    def facts_blob(self, entry: Entry) -> bytes | None:
        """An entry's facts blob, read from the registry once (checked against its digest)."""
        if not entry.facts or self.repo is None:
            return None
        if entry.facts not in self._blobs:
            data = self.repo.get_blob(entry.facts)
            if digest_of(data) != entry.facts:
                raise Failed(
                    f"{self.ref}: the facts of layer {entry.name} hash to {digest_of(data)[:19]}…, not "
                    f"{entry.facts[:19]}…"
                )
            self._blobs[entry.facts] = data
        return self._blobs[entry.facts]

    def facts(self, entry: Entry) -> Facts | None:
        data = self.facts_blob(entry)
        return Facts.from_blob(data) if data is not None else None

    def line(self) -> str:
        return f"{self.platform}: {self.note}"


def candidates(refs: tuple[str, ...], image_name: str) -> tuple[str, ...]:
    """The refs to look for a previous image at, in the order given, each once (a bare tag under `image_name`)."""
    # a tag holds no '/': anything else names an image
    return tuple(dict.fromkeys(ref if "/" in ref else f"{image_name}:{ref}" for ref in refs))


def find(
    repo: Repository, image_name: str, platform: Platform, refs: tuple[str, ...], key: PublicKey | None
) -> Previous:
    """The first of `refs` (full refs: NAME:TAG or NAME@DIGEST) that holds an image for `platform`, with its record
    read and checked. `repo` is the target repository (its login reaches every repository of its registry)."""
    from carry.image import registryhttp

    tried = []
    for ref in refs:
        name, reference = _split(ref)
        other = repo if name == image_name else _sibling(repo, name)
        if other is None:
            tried.append(f"{ref} (another registry: its blobs cannot be mounted here)")
            continue
        found = other.get_manifest(reference)
        if found is None:
            tried.append(ref)
            continue
        media, body = found
        manifest = json.loads(body)
        digest = digest_of(body) if "@" not in ref else reference
        if media in (registryhttp.DOCKER_LIST, registryhttp.OCI_INDEX) or "manifests" in manifest:
            entry = next((m for m in manifest.get("manifests") or [] if _platform_of(m) == str(platform)), None)
            if entry is None:
                tried.append(f"{ref} (no {platform} image in it)")
                continue
            digest = entry["digest"]
            found = other.get_manifest(digest)
            if found is None:
                tried.append(f"{ref} ({digest[:19]}… is gone)")
                continue
            manifest = json.loads(found[1])
        previous = Previous(platform, ref, other, digest)
        _read_record(previous, manifest, key, image_name if other is repo else name)
        return previous
    return Previous(
        platform, "", note=f"no previous image ({', '.join(tried) or 'nothing to look at'}): every layer is written"
    )


def _split(ref: str) -> tuple[str, str]:
    if "@" in ref:
        name, _, digest = ref.partition("@")
        return name, digest
    name, _, tag = ref.rpartition(":")
    if "/" in tag or not name:
        return ref, "latest"
    return name, tag


def _sibling(repo: Repository, name: str) -> Repository | None:
    """The repository `name` (a full image name) on `repo`'s registry, with the same login; None on another."""
    host = name.split("/", 1)[0]
    if host != repo.host:
        return None
    return dataclasses.replace(repo, name=name[len(host) + 1 :], sent=0, received=0)


def _platform_of(entry: dict) -> str:
    found = entry.get("platform") or {}
    return "/".join(part for part in (found.get("os"), found.get("architecture"), found.get("variant")) if part)


def _read_record(previous: Previous, manifest: dict, key: PublicKey | None, image_name: str) -> None:
    """The record beside `previous.digest`, checked: signed (with a key), and naming that manifest's layers."""
    assert previous.repo is not None  # find() sets it
    ref, repo = previous.ref, previous.repo
    found = repo.get_manifest(cache_tag(previous.digest))
    if found is None:
        previous.note = (
            f"{ref} ({previous.digest[:19]}…) has no {cache_tag(previous.digest)[:15]}…{SUFFIX} record (pushed by an "
            f"older carry, or its push or smoke test did not finish): every layer is written"
        )
        return
    try:
        artifact = json.loads(found[1])
        data = repo.get_blob(artifact["config"]["digest"])
        if digest_of(data) != artifact["config"]["digest"]:
            raise ValueError("its bytes do not hash to its digest")
        record = Record.from_bytes(data)
    except (ValueError, KeyError, TypeError) as exc:
        previous.note = f"{ref}: its record cannot be read ({exc}): every layer is written"
        return
    problem = publish.signature_problem(repo, key, image_name, digest_of(found[1])) if key is not None else ""
    if problem:
        previous.note = f"{ref}: its record is not signed with this key ({problem}): every layer is written"
        return
    if record.subject != previous.digest or record.platform != str(previous.platform):
        previous.note = (
            f"{ref}: its record names {record.subject[:19]}… ({record.platform}), not this image: every layer is "
            f"written"
        )
        return
    previous.record = record
    try:
        config = json.loads(repo.get_blob(manifest["config"]["digest"]))
        diff_ids = list(config["rootfs"]["diff_ids"])
        layers = list(manifest["layers"])
    except (ValueError, KeyError, TypeError):
        previous.note = f"{ref}: its manifest or config cannot be read: every layer is written"
        return
    for index, entry in enumerate(record.entries):
        layer = layers[index] if index < len(layers) else {}
        if len(record.entries) != len(layers):
            why = f"the record lists {len(record.entries)} layers, the image {len(layers)}"
        elif (layer.get("digest"), layer.get("size")) != (entry.digest, entry.size):
            why = (
                f"its digest {entry.digest[:19]}… is not the image's layer {index + 1} "
                f"({str(layer.get('digest'))[:19]}…)"
            )
        elif diff_ids[index] != entry.diff_id:
            why = f"its diff_id is not the image's layer {index + 1}'s"
        else:
            previous.trusted.setdefault(entry.key, entry)
            continue
        previous.untrusted[entry.name] = why
    signed = ", signed" if key is not None else ""
    previous.note = (
        f"previous image {ref} ({previous.digest[:19]}…{signed}): {len(previous.trusted)} of {len(record.entries)} "
        f"layer(s) recorded" + (f"; {len(previous.untrusted)} entry(ies) not trusted" if previous.untrusted else "")
    )


# -- reuse ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Found:
    """A layer the target repository has (or took by a mount), how it was known, and the previous entry if any."""

    written: Written
    action: str  # "already exists" | "mounted"
    source: str = ""  # "" (this machine remembered it), "recorded by REF", "from REPO"
    entry: Entry | None = None
    files: int = 0


class Reuse:
    """Which layers the target repository has, asked once per key: remembered digests first, then the record."""

    def __init__(self, repo: Repository, digests: Digests, previous: dict[Platform, Previous]):
        self.repo, self.digests, self.previous = repo, digests, previous
        self._found: dict[tuple[Platform, str], Found | None] = {}
        self._why: dict[tuple[Platform, str], str] = {}

    def find(self, platform: Platform, name: str, key: str) -> Found | None:
        if (platform, key) not in self._found:
            self._found[(platform, key)] = self._look(platform, name, key)
        return self._found[(platform, key)]

    def why(self, platform: Platform, name: str, key: str) -> str:
        """Why the layer `name` with `key` is written (after `find` gave None)."""
        return self._why.get((platform, key), "")

    def entry(self, platform: Platform, key: str) -> Entry | None:
        """The previous image's trusted entry of `key`, if any (its facts, its file count)."""
        previous = self.previous.get(platform)
        return previous.trusted.get(key) if previous is not None else None

    def _look(self, platform: Platform, name: str, key: str) -> Found | None:
        previous = self.previous.get(platform)
        entry = self.entry(platform, key)
        known = self.digests.get(key, said=True)  # a corrupt entry is removed, and said
        if known is not None and known.digest and self.repo.blob_size(known.digest) == known.size:
            return Found(known, "already exists", "", entry, entry.files if entry else 0)
        if previous is None or previous.record is None:
            return None  # the platform's one line said why (Previous.note)
        if entry is None:
            self._why[(platform, key)] = self._no_entry(previous, name)
            return None
        size = self.repo.blob_size(entry.digest)
        action, source = "already exists", f"recorded by {previous.ref}"
        other = previous.repo is not None and previous.repo.name != self.repo.name
        if size is None and other and previous.repo is not None and self.repo.mount(entry.digest, previous.repo.name):
            size, action, source = self.repo.blob_size(entry.digest), "mounted", f"from {previous.repo.name}"
        if size != entry.size:
            self._why[(platform, key)] = (
                f"its blob {entry.digest[:19]}… (recorded by {previous.ref}) is not in the registry"
                if size is None
                else f"its blob {entry.digest[:19]}… is {size} bytes in the registry, the record says {entry.size}"
            )
            return None
        self.digests.put(key, entry.written())
        return Found(entry.written(), action, source, entry, entry.files)

    @staticmethod
    def _no_entry(previous: Previous, name: str) -> str:
        if name in previous.untrusted:
            return f"{previous.ref}'s entry does not verify: {previous.untrusted[name]}"
        before = previous.by_name(name)
        if before is None:
            return f"{previous.ref} has no layer {name}"
        return f"its key differs from {previous.ref}'s {name} ({before.key[:12]} -> this run's)"


# -- writing the record --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Attached:
    tag: str
    digest: str
    sent: int  # bytes pushed for it (its record, the facts blobs the registry did not have, its manifest)
    signed: bool

    def line(self, platform: Platform) -> str:
        return (
            f"{platform}: record {self.tag[:19]}…{SUFFIX} {self.digest[:19]}… ({self.sent} bytes pushed"
            f"{', signed' if self.signed else ''})"
        )

    def to_json(self) -> dict:
        return {"tag": self.tag, "digest": self.digest, "sent": self.sent, "signed": self.signed}


def push_record(stage: publish.Stage, record: Record, facts: dict[str, bytes]) -> Attached:
    """The record of `record.subject` under its `.cache` tag through the publish stage (which signs it): its facts blobs
    (those the registry has not sent), the record as the artifact's config, the artifact's manifest."""
    body = record.to_bytes()
    descriptors = [
        {"mediaType": FACTS_MEDIA, "size": len(facts[entry.facts]), "digest": entry.facts}
        for entry in record.entries
        if entry.facts and entry.facts in facts
    ]
    unique = list({d["digest"]: d for d in descriptors}.values())
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": RECORD_MEDIA, "size": len(body), "digest": digest_of(body)},
            "layers": unique,
            "annotations": {"io.carry.cache.subject": record.subject},
        },
        separators=(",", ":"),
    ).encode()
    tag = cache_tag(record.subject)
    sent, signed = stage.record(tag, [data for _, data in sorted(facts.items())] + [body], manifest, OCI_MANIFEST)
    return Attached(tag, digest_of(manifest), sent, signed)
