"""What carry knows about one platform's image when it pushes it, as plain data: the SBOM (carry.trust.sbom) and the
provenance (carry.trust.provenance) are both written from it. The image family fills it from its plan; nothing
here reads a registry, an image or a config."""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Wheel:
    """A distribution installed from a wheel: its name and version (as METADATA has them), the wheel's name, sha256."""

    name: str
    version: str
    filename: str
    sha256: str

    @property
    def canonical(self) -> str:
        return canonical(self.name)


@dataclasses.dataclass(frozen=True)
class CarriedPatch:
    """One patch of the series: file name, sha256, its text, subject and DEP-3 fields (Upstream-Status, Forwarded)."""

    name: str
    sha256: str
    text: str
    subject: str
    status: str | None
    forwarded: str | None


@dataclasses.dataclass(frozen=True)
class Source:
    """A file of the build's input (build.yaml, a runtime lock): its path relative to the config's directory,
    sha256 (hex) and, for the config, its text (credentials already stripped)."""

    path: str
    sha256: str
    text: str = ""


@dataclasses.dataclass(frozen=True)
class ImageFacts:
    repository: str  # the image name without a tag: what is signed (docker-reference)
    version: str  # VERSION
    platform: str  # linux/amd64
    created: str  # ISO 8601 UTC, the image's org.opencontainers.image.created
    base_ref: str
    base_digest: str  # sha256:… (the runtime base image's ID, or its repo digest when it has one)
    distributions: tuple[Wheel, ...]  # what the lock installs
    fixed: Wheel  # the fixed wheel
    release: Wheel | None  # the upstream's released wheel the fixed one was made from (precompiled builds)
    upstream_url: str
    upstream_commit: str
    upstream_pr: int | None
    series_hash: str
    patches: tuple[CarriedPatch, ...]
    carry_version: str
    config: Source
    lock: Source | None
    no_sbom: str = ""  # why there is no SBOM (a wheel whose sha256 carry does not know); "" when there is one

    @property
    def hermetic(self) -> bool:
        """Every installed wheel's sha256 is known (a locked image), so the SBOM can be exact."""
        return not self.no_sbom

    @property
    def installed(self) -> tuple[Wheel, ...]:
        return (*self.distributions, self.fixed)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def same_version(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def dist_name(facts: ImageFacts) -> str:
    """`<name>-<VERSION>-<os>-<arch>.cdx.json`: the SBOM's file name in dist/."""
    os_name, _, arch = facts.platform.partition("/")
    return f"{facts.fixed.canonical}-{facts.version}-{os_name}-{arch.replace('/', '-')}.cdx.json"
