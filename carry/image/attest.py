"""The image family's side of signing (carry.trust): the facts of a pushed image, from what `image` resolved (the
config, the series, the lock, the wheels, the base), handed to carry.trust.publish. The push paths call `Attester`
once per pushed platform manifest and once per multi-platform index; commands.py makes it (with the key loaded
before any work) and nothing else here knows about keys. It is handed what the image installed (a lock's pins and
their wheels, the distributions read back from a hermetic build) and imports no image family."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from carry.config import Config
from carry.config.reader import strip_credentials
from carry.source.series import Series
from carry.trust import kinds, publish
from carry.trust.facts import CarriedPatch, ImageFacts, Source, Wheel

__all__ = ["Attester", "Installed", "Wheel", "wheel_of"]
from carry.trust.keys import SigningKey
from carry.util import reporter
from carry.util.download import sha256_in_store
from carry.util.integrity import file_sha256
from carry.util.record import record

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
class Installed:
    """A locked image's installed distributions: its `lock` and the wheel file of each package in it (`wheels`)."""

    lock: Lock
    wheels: dict[str, Path]


@dataclasses.dataclass
class Attester:
    key: SigningKey | None
    config: Config
    series: Series
    version: str
    carry_version: str
    dist: Path
    started: str = dataclasses.field(default_factory=kinds.now)
    timings: publish.Timings = dataclasses.field(default_factory=publish.Timings)
    published: list[publish.Published] = dataclasses.field(default_factory=list)
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

    def facts(
        self,
        platform: Platform,
        labels: dict[str, str],
        fixed: Wheel | Path,
        release: Path | None,
        base_ref: str,
        base: dict,
        installed: Installed | None = None,
        no_sbom: str = "",
    ) -> ImageFacts:
        import time

        begun = time.monotonic()
        try:
            if isinstance(fixed, Path):  # the fixed wheel's file: hashed here, counted in the facts' time
                fixed = wheel_of(fixed)
            distributions: tuple[Wheel, ...] = ()
            lock_source = None
            if installed is not None:
                lock, wheels = installed.lock, installed.wheels
                distributions = tuple(
                    Wheel(p.name, p.version, wheels[p.name].name, sha256_in_store(wheels[p.name]))
                    for p in lock.packages
                )
                root = self.config.path.absolute().parent
                try:
                    shown = str(lock.path.absolute().relative_to(root))
                except ValueError:
                    shown = lock.path.name
                lock_source = Source(shown, hashlib.sha256(lock.path.read_bytes()).hexdigest())
            return ImageFacts(
                repository=self.config.image.name,
                version=self.version,
                platform=str(platform),
                created=labels.get("org.opencontainers.image.created", self.started),
                base_ref=base_ref,
                base_digest=_base_digest(base),
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
                no_sbom=no_sbom,
            )
        finally:
            self.timings.facts += time.monotonic() - begun

    def platform(self, store: Registry, facts: ImageFacts, digest: str, locked: bool) -> publish.Published:
        """One platform's manifest published (its SBOM; signed and attested with a key), each line said; a note
        says why it has no SBOM, and, the first time, that nothing is signed without a key."""
        first = not self.published
        if self.key is not None and first:
            reporter.phase("sign", f"with the key {self.key.public.fingerprint[:19]}… ($CARRY_SIGNING_KEY)")
        making = kinds.Making(self.dist, locked, self.started)
        done = publish.platform(store, self.key, facts, digest, making, self.timings, self.attest)
        self.published.append(done)
        for line in done.lines():
            reporter.phase("trust", line)
        for note in done.notes:
            reporter.note(note)
        if self.key is None and first:
            reporter.note(UNSIGNED)
        return done

    def index(self, store: Registry, digest: str) -> publish.Published:
        done = publish.index(store, self.key, self.config.image.name, digest, self.timings)
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
