"""What `image --push` and `manifest` add to a pushed image: the SBOM written to dist/, and, with a signing key,
the simple-signing signature of each platform's manifest (and of the multi-platform index), the SBOM and the SLSA
provenance as signed DSSE envelopes beside it (carry.trust.attach). Each step is timed, so that `image` can say
what signing cost against the whole push."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from carry.trust import attach, provenance, sbom
from carry.trust.facts import ImageFacts, dist_name
from carry.trust.keys import SigningKey
from carry.util.errors import Failed
from carry.util.fsutil import atomic_write_bytes


@dataclasses.dataclass
class Timings:
    facts: float = 0.0  # gathering what the SBOM and provenance say (hashing the wheels, reading the image)
    sbom: float = 0.0
    provenance: float = 0.0
    signatures: float = 0.0

    @property
    def total(self) -> float:
        return self.facts + self.sbom + self.provenance + self.signatures

    def to_json(self) -> dict:
        return {
            "facts": round(self.facts, 3),
            "sbom": round(self.sbom, 3),
            "provenance": round(self.provenance, 3),
            "signatures": round(self.signatures, 3),
        }


@dataclasses.dataclass(frozen=True)
class Published:
    """One subject's attachments (platform manifest or index) and the SBOM written for it."""

    subject: str  # the manifest's digest
    platform: str  # or "index"
    attached: tuple[attach.Attached, ...]
    sbom_path: Path | None
    sbom_bytes: int
    components: int
    note: str | None = None

    def lines(self) -> list[str]:
        """The SBOM written and each attachment pushed, one line each (notes are `note`)."""
        rows = []
        if self.sbom_path is not None:
            rows.append(
                f"sbom       {self.platform}: {self.sbom_path} ({self.sbom_bytes / 1e3:,.1f} kB, "
                f"{self.components} components, CycloneDX 1.6, schema-valid)"
            )
        return rows + [f"{a.line(self.subject)}" for a in self.attached]

    def to_json(self) -> dict:
        return {
            "subject": self.subject,
            "platform": self.platform,
            "sbom": str(self.sbom_path) if self.sbom_path else None,
            "sbom_bytes": self.sbom_bytes,
            "components": self.components,
            "attachments": [dataclasses.asdict(a) for a in self.attached],
        }


def platform(
    store: attach.Registry,
    key: SigningKey | None,
    facts: ImageFacts,
    digest: str,
    dist: Path,
    locked: bool,
    started: str,
    timings: Timings,
) -> Published:
    """The SBOM (when every installed wheel's hash is known) into dist/, then with a key: sign `digest`, attest the
    SBOM and the provenance. Without a key nothing is attached, and the result says so."""
    document = None
    path = None
    if facts.hermetic:
        begun = time.monotonic()
        document = sbom.make(facts)
        problem = sbom.validate(document)
        if problem is not None:
            raise Failed(f"the SBOM of {facts.repository} {facts.platform} is not valid CycloneDX 1.6: {problem}")
        dist.mkdir(parents=True, exist_ok=True)
        path = dist / dist_name(facts)
        atomic_write_bytes(path, document + b"\n")
        timings.sbom += time.monotonic() - begun
    components = len(json.loads(document)["components"]) if document else 0
    note = f"{facts.platform}: no SBOM: {facts.no_sbom}" if facts.no_sbom else None
    if key is None:
        return Published(digest, facts.platform, (), path, len(document or b""), components, note)
    begun = time.monotonic()
    predicate = provenance.make(facts, locked, started, _now())
    timings.provenance += time.monotonic() - begun
    begun = time.monotonic()
    signed = attach.sign(store, key, facts.repository, digest)
    predicates = [(attach.SLSA_PROVENANCE, predicate)]
    if document is not None:
        predicates.insert(0, (attach.CYCLONEDX, json.loads(document)))
    attested = attach.attest(store, key, facts.repository, digest, predicates)
    timings.signatures += time.monotonic() - begun
    return Published(digest, facts.platform, (signed, attested), path, len(document or b""), components, note)


def index(store: attach.Registry, key: SigningKey | None, repository: str, digest: str, timings: Timings) -> Published:
    """The multi-platform index's signature (the tag people pull)."""
    if key is None:
        return Published(digest, "index", (), None, 0, 0)
    begun = time.monotonic()
    signed = attach.sign(store, key, repository, digest)
    timings.signatures += time.monotonic() - begun
    return Published(digest, "index", (signed,), None, 0, 0)


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
