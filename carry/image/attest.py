"""The publish stage's side of signing (carry.trust): the facts of a pushed image, from what a family hands over
(`PlatformFacts`) and what `image` resolved, and each chosen kind's predicate (carry.trust.kinds) signed and attested
(carry.trust.attach), each step timed against the whole push. The stage calls `Attester` once per platform manifest and
once per index; app/imaging.py makes it (the key loaded before any work). It imports no image family."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from carry.config import Config
from carry.config.reader import strip_credentials
from carry.source.series import Series
from carry.trust import attach, kinds
from carry.trust.facts import CarriedPatch, ImageFacts, Source, Wheel

__all__ = ["Attester", "PlatformFacts", "Wheel", "wheel_of"]
from carry.trust.keys import SigningKey
from carry.util import reporter
from carry.util.download import sha256_in_store
from carry.util.integrity import file_sha256
from carry.util.record import field, record

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import docker

    from carry.platforms import Platform
    from carry.trust.attach import Registry

    # What a hermetic Dockerfile build installed, read back from the engine's image (ref, platform) and matched to
    # the wheels carry holds (the fixed one, the wheelhouse's): (distributions, "") or ((), why not). It is
    # carry.image.inspect.hermetic.distributions, handed in by the Attester's maker.
    ReadInstalled = Callable[
        [docker.DockerClient, str, Platform, Wheel, dict[tuple[str, str], Wheel]], tuple[tuple[Wheel, ...], str]
    ]


UNSIGNED = "not signed, nothing attached: set $CARRY_SIGNING_KEY to a key (`carry keygen DIR`)"


def wheel_of(path: Path, sha256: str | None = None) -> Wheel:
    from packaging.utils import parse_wheel_filename

    name, version, _, _ = parse_wheel_filename(path.name)
    return Wheel(str(name), str(version), path.name, sha256 or file_sha256(path))


def _base_digest(base: dict) -> str:
    """The base's registry digest when it came from one (RepoDigests), else its image ID (a local base)."""
    digests = [d.split("@", 1)[1] for d in base.get("RepoDigests") or [] if "@" in d]
    return digests[0] if digests else base.get("Id", "")


class Pin(Protocol):
    """One distribution a lock pins (carry.image.locked.runtimelock.Locked is one)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...


class Lock(Protocol):
    """What the facts read of a lock file (carry.image.locked.runtimelock.Lock is one): where it is and its pins."""

    @property
    def path(self) -> Path: ...

    @property
    def packages(self) -> Sequence[Pin]: ...


@record(kw_only=True)
class PlatformFacts:
    """What a family knows of one platform image it hands over, for its attestations: its labels, the fixed wheel
    (its file, or what is known of it), the release wheel, the base; a locked image's `lock` and the wheel file of
    each package in it (`wheels`); a hermetic Dockerfile build's `engine` (the Docker client, the image's ref and
    its wheelhouse, read back for the SBOM); `no_sbom`: why it has none otherwise."""

    platform: Platform
    labels: dict[str, str]
    fixed: Wheel | Path
    base_ref: str
    base: dict
    release: Path | None = None
    lock: Lock | None = None
    wheels: dict[str, Path] = field(default_factory=dict)
    engine: tuple[Any, str, dict[tuple[str, str], Wheel]] | None = None
    no_sbom: str = ""


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


@dataclasses.dataclass
class Attester:
    key: SigningKey | None
    config: Config
    series: Series
    version: str
    carry_version: str
    dist: Path
    started: str = dataclasses.field(default_factory=kinds.now)
    timings: Timings = dataclasses.field(default_factory=lambda: Timings())
    published: list[Published] = dataclasses.field(default_factory=list)
    read_installed: ReadInstalled = dataclasses.field(default=lambda *_: ((), "nothing read the image's files back"))
    attest: tuple[tuple[str, str], ...] = kinds.DEFAULT  # the kinds attached, by name, and each one's ARG

    def _config_source(self) -> Source:
        text = strip_credentials(self.config.path.read_text())
        return Source(self.config.path.name, hashlib.sha256(text.encode()).hexdigest(), text)

    def _patches(self) -> tuple[CarriedPatch, ...]:
        return tuple(
            CarriedPatch(
                patch.name,
                patch.sha256,
                patch.path.read_text(),
                patch.subject,
                str(patch.upstream_status) if patch.upstream_status else None,
                patch.forwarded,
            )
            for patch in self.series.patches
        )

    def facts(self, subject: PlatformFacts) -> ImageFacts:
        begun = time.monotonic()
        try:
            return self._facts(subject)
        finally:
            self.timings.facts += time.monotonic() - begun

    def _facts(self, subject: PlatformFacts) -> ImageFacts:
        fixed, labels, lock, why = subject.fixed, subject.labels, subject.lock, subject.no_sbom
        distributions: tuple[Wheel, ...] = ()
        if subject.engine is not None and isinstance(fixed, Wheel):  # a hermetic build's, read back from the engine
            client, ref, wheelhouse = subject.engine
            distributions, why = self.read_installed(client, ref, subject.platform, fixed, wheelhouse)
        if isinstance(fixed, Path):  # the fixed wheel's file: hashed here, counted in the facts' time
            fixed = wheel_of(fixed)
        lock_source = None
        if lock is not None:
            wheels = subject.wheels
            distributions = tuple(
                Wheel(p.name, p.version, wheels[p.name].name, sha256_in_store(wheels[p.name])) for p in lock.packages
            )
            root = self.config.path.absolute().parent
            try:
                shown = str(lock.path.absolute().relative_to(root))
            except ValueError:
                shown = lock.path.name
            lock_source = Source(shown, hashlib.sha256(lock.path.read_bytes()).hexdigest())
        release = subject.release
        return ImageFacts(
            repository=self.config.image.name,
            version=self.version,
            platform=str(subject.platform),
            created=labels.get("org.opencontainers.image.created", self.started),
            base_ref=subject.base_ref,
            base_digest=_base_digest(subject.base),
            distributions=distributions,
            fixed=fixed,
            release=wheel_of(release, sha256_in_store(release)) if release is not None else None,
            upstream_url=labels.get("io.carry.upstream.url", ""),
            upstream_commit=self.config.upstream.commit,
            upstream_pr=self.config.upstream.pr,
            series_hash=self.series.hash,
            patches=self._patches(),
            carry_version=self.carry_version,
            config=self._config_source(),
            lock=lock_source,
            no_sbom=why,
        )

    def platform(self, store: Registry, facts: ImageFacts, digest: str, locked: bool) -> Published:
        """One platform's manifest published: each chosen kind's predicate made (the SBOM, when every installed
        wheel's hash is known, also into dist/), then with a key `digest` signed and the predicates attested; each
        line said, a note says why a kind has none, and, the first time, that nothing is signed without a key."""
        first = not self.published
        if self.key is not None and first:
            reporter.phase("sign", f"with the key {self.key.public.fingerprint[:19]}… ($CARRY_SIGNING_KEY)")
        making, made = kinds.Making(self.dist, locked, self.started), []
        for name, arg in self.attest:
            begun = time.monotonic()
            made.append(kinds.KINDS[name].make(facts, making, arg))
            self.timings.kinds[name] = self.timings.kinds.get(name, 0.0) + time.monotonic() - begun
        attached: tuple[attach.Attached, ...] = ()
        if self.key is not None:
            begun = time.monotonic()
            predicates = [
                (kinds.KINDS[name].predicate_type, one.predicate)
                for (name, _), one in zip(self.attest, made, strict=True)
                if one.predicate is not None
            ]
            signed = attach.sign(store, self.key, facts.repository, digest)
            attached = (signed, attach.attest(store, self.key, facts.repository, digest, predicates))
            self.timings.signatures += time.monotonic() - begun
        done = self._said(Published(digest, facts.platform, attached, tuple(made)))
        for note in done.notes:
            reporter.note(note)
        if self.key is None and first:
            reporter.note(UNSIGNED)
        return done

    def index(self, store: Registry, digest: str) -> Published:
        """The multi-platform index's signature (the tag people pull)."""
        if self.key is None:
            return self._said(Published(digest, "index", ()))
        begun = time.monotonic()
        signed = attach.sign(store, self.key, self.config.image.name, digest)
        self.timings.signatures += time.monotonic() - begun
        return self._said(Published(digest, "index", (signed,)))

    def _said(self, done: Published) -> Published:
        self.published.append(done)
        for line in done.lines():
            reporter.phase("trust", line)
        return done

    def lines(self) -> list[str]:
        return [line for done in self.published for line in done.lines()]

    def to_json(self) -> dict:
        return {
            "signed": self.key is not None,
            "key": self.key.public.fingerprint if self.key is not None else None,
            "seconds": self.timings.to_json(),
            "published": [done.to_json() for done in self.published],
        }


def wheel_index(directory: Path) -> dict[tuple[str, str], Wheel]:
    """(canonical name, version) -> the wheel file of a wheelhouse."""
    from carry.trust.facts import canonical

    found = {}
    for path in sorted(directory.glob("*.whl")):
        wheel = wheel_of(path)
        found[(canonical(wheel.name), wheel.version)] = wheel
    return found
