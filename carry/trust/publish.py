"""What `image --push` and `manifest` add to a pushed image: each attestation kind chosen (carry.trust.kinds: the
SBOM, also written to dist/, and the SLSA provenance by default) and, with a signing key, the simple-signing
signature of each platform's manifest (and of the multi-platform index) and the kinds' predicates as signed DSSE
envelopes beside it (carry.trust.attach). Each step is timed, so that `image` can say what signing cost against the
whole push."""

from __future__ import annotations

import dataclasses
import time

from carry.trust import attach, kinds
from carry.trust.facts import ImageFacts
from carry.trust.keys import SigningKey


@dataclasses.dataclass
class Timings:
    facts: float = 0.0  # gathering what the attestations say (hashing the wheels, reading the image)
    kinds: dict[str, float] = dataclasses.field(default_factory=dict)  # making each kind's predicate, by name
    signatures: float = 0.0

    @property
    def total(self) -> float:
        return self.facts + sum(self.kinds.values()) + self.signatures

    def to_json(self) -> dict:
        made = {name: round(seconds, 3) for name, seconds in self.kinds.items()}
        return {"facts": round(self.facts, 3), **made, "signatures": round(self.signatures, 3)}


@dataclasses.dataclass(frozen=True)
class Published:
    """One subject's attachments (platform manifest or index) and what each kind made for it."""

    subject: str  # the manifest's digest
    platform: str  # or "index"
    attached: tuple[attach.Attached, ...]
    made: tuple[kinds.Made, ...] = ()

    @property
    def notes(self) -> tuple[str, ...]:
        """Why a kind has no statement for this image."""
        return tuple(made.why_not for made in self.made if made.why_not)

    def lines(self) -> list[str]:
        """What the kinds wrote and each attachment pushed, one line each (notes are `notes`)."""
        return [made.line for made in self.made if made.line] + [a.line(self.subject) for a in self.attached]

    def to_json(self) -> dict:
        fields = {key: value for made in self.made for key, value in made.fields.items()}
        return {
            "subject": self.subject,
            "platform": self.platform,
            **fields,
            "attachments": [dataclasses.asdict(a) for a in self.attached],
        }


def platform(
    store: attach.Registry,
    key: SigningKey | None,
    facts: ImageFacts,
    digest: str,
    making: kinds.Making,
    timings: Timings,
    chosen: tuple[tuple[str, str], ...] = kinds.DEFAULT,
) -> Published:
    """Each chosen kind's predicate made (the SBOM, when every installed wheel's hash is known, also into dist/),
    then with a key: sign `digest` and attest the predicates. Without a key nothing is attached."""
    made = []
    for name, arg in chosen:
        begun = time.monotonic()
        made.append(kinds.KINDS[name].make(facts, making, arg))
        timings.kinds[name] = timings.kinds.get(name, 0.0) + time.monotonic() - begun
    if key is None:
        return Published(digest, facts.platform, (), tuple(made))
    begun = time.monotonic()
    signed = attach.sign(store, key, facts.repository, digest)
    predicates = [
        (kinds.KINDS[name].predicate_type, one.predicate)
        for (name, _), one in zip(chosen, made, strict=True)
        if one.predicate is not None
    ]
    attested = attach.attest(store, key, facts.repository, digest, predicates)
    timings.signatures += time.monotonic() - begun
    return Published(digest, facts.platform, (signed, attested), tuple(made))


def index(store: attach.Registry, key: SigningKey | None, repository: str, digest: str, timings: Timings) -> Published:
    """The multi-platform index's signature (the tag people pull)."""
    if key is None:
        return Published(digest, "index", ())
    begun = time.monotonic()
    signed = attach.sign(store, key, repository, digest)
    timings.signatures += time.monotonic() - begun
    return Published(digest, "index", (signed,))
