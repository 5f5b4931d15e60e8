"""A file pinned by sha256 (an upstream's released wheel or sdist, a precompiled wheel): by requirement from the
package index, by a local path, or by an http(s) URL. Read with build.yaml (`check` and `version` load it), so
urllib.parse is imported only where needed; carry/util/download.py fetches and checks the file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from carry.util.errors import BadInput
from carry.util.record import field, record

if TYPE_CHECKING:
    from carry.util.index import WheelPlatform

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@record
class Pinned:
    """A file known by its sha256: where to get it (a URL, a local path, or empty: by requirement from the package
    index), its name (empty until the index names the wheel) and size."""

    source: str
    sha256: str
    name: str
    size: int | None = None
    requirement: str | None = None  # `project==version`: the configured index serves the file
    index: str | None = None  # an index to ask instead of pip's configured one (build.yaml's index:)
    platform: WheelPlatform | None = None  # the platform of a wheel pinned by requirement alone
    where: str = field(default="", compare=False)  # what pinned it, for messages

    @classmethod
    def parse(cls, source: str, sha256: str | None, where: str, size: int | None = None) -> Pinned:
        sha = _sha(sha256, where)
        text = str(source or "").strip()
        if not text:
            raise BadInput(f"{where}: no file given; set a path or an http(s) URL")
        import urllib.parse

        scheme = urllib.parse.urlsplit(text).scheme.lower()
        if "://" in text and scheme not in ("http", "https", "file"):
            raise BadInput(f"{where}: {text!r} has scheme {scheme!r}; use an http(s) URL or a local path")
        name = Path(urllib.parse.unquote(urllib.parse.urlsplit(text).path)).name
        if not name or name in (".", ".."):
            raise BadInput(f"{where}: {text!r} names no file; give the URL or path of the file itself")
        return cls(text, sha, name, size, where=where)

    @classmethod
    def by_name(
        cls,
        requirement: str,
        sha256: str | None,
        where: str,
        *,
        name: str = "",
        size: int | None = None,
        index: str | None = None,
        platform: WheelPlatform | None = None,
    ) -> Pinned:
        """A file the package index serves: `project==version`, its sha256, and its file name or wheel platform."""
        sha = _sha(sha256, where)
        text = str(requirement or "").strip()
        if _exact_version(text) is None:
            raise BadInput(
                f"{where}: requirement {requirement!r} names no single version; pin one, e.g. 'vllm==0.33.0'"
            )
        if index is not None and "${" in index:  # ${NAME}: the environment's, when pip is asked (_from_index)
            from carry.util.indexurl import URL_SCHEMES, check_template

            check_template(index, f"{where}: index", URL_SCHEMES)
        elif index is not None:
            import urllib.parse

            if urllib.parse.urlsplit(index).scheme.lower() not in ("http", "https", "file"):
                raise BadInput(
                    f"{where}: index {index!r} is not an index URL; give a simple-API index "
                    f"(https://HOST/PATH or file:///PATH), or leave it out to use pip's own"
                )
        return cls("", sha, name, size, text, index, platform, where)

    @property
    def version(self) -> str | None:
        """The version the pin names: its requirement's, else the one in its file name."""
        exact = _exact_version(self.requirement) if self.requirement else None
        if exact is not None:
            return exact[1]
        parts = self.name.split("-")
        return parts[1] if len(parts) > 1 else None

    @property
    def project(self) -> str | None:
        exact = _exact_version(self.requirement) if self.requirement else None
        return exact[0] if exact is not None else None

    @property
    def is_url(self) -> bool:
        import urllib.parse

        return urllib.parse.urlsplit(self.source).scheme.lower() in ("http", "https")

    @property
    def local_path(self) -> Path:
        import urllib.parse

        parts = urllib.parse.urlsplit(self.source)
        return Path(urllib.parse.unquote(parts.path)) if parts.scheme.lower() == "file" else Path(self.source)

    def short(self) -> str:
        return f"{self.name or self.requirement} (sha256 {self.sha256[:8]}…)"


def _sha(sha256: str | None, where: str) -> str:
    sha = str(sha256 or "").strip().lower()
    if not SHA256_RE.match(sha):
        raise BadInput(f"{where}: sha256 {sha256!r} is not 64 hex digits; give the file's sha256 (sha256sum FILE)")
    return sha


# `project==version` as a pin is written: read without packaging's requirement parser, whose import (markers, tags,
# subprocess, logging) every command that loads a build.yaml with pins would pay; other forms go through it.
PLAIN_PIN_RE = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*==\s*([0-9A-Za-z!+._-]+)\s*")


def _exact_version(requirement: str) -> tuple[str, str] | None:
    """(project, version) of `project==version`; None for anything that is not one exact version."""
    plain = PLAIN_PIN_RE.fullmatch(requirement)
    if plain and all(part.isascii() and part.isdigit() for part in plain.group(2).split(".")):
        return plain.group(1), plain.group(2)  # a plain release (0.33.0): a PEP 440 version, told without packaging
    if plain:
        from packaging.version import InvalidVersion, Version

        try:
            Version(plain.group(2))
        except InvalidVersion:
            return None
        return plain.group(1), plain.group(2)
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        parsed = Requirement(requirement)
    except InvalidRequirement:
        return None
    specs = list(parsed.specifier)
    if len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version or parsed.url:
        return None
    return parsed.name, specs[0].version
