"""A per-commit wheel index, read the way vLLM lays it out: where `carry pin` finds the precompiled wheels.

The layout is vLLM's `.buildkite/scripts/generate-nightly-index.py` (docs/builds.md, "Finding the pins"): each
variant's PEP 503 page and metadata.json (no hashes) at `{index}/{C}/[{variant}/]{project}/`. A 404 for it means no
wheels of that variant at C; a body that is not that JSON list means the URL is not such an index (bad input).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from carry.config import Config
from carry.config.build import Nightly
from carry.platforms import Platform
from carry.util import index as indexes
from carry.util import indexurl
from carry.util.download import Store
from carry.util.errors import BadInput, Failed

if TYPE_CHECKING:
    import urllib.request

TIMEOUT_S = 60
CHUNK = 1 << 20
WHEEL_RE = re.compile(
    r"^(?P<project>[^-]+)-(?P<version>[^-]+?)(?:-(?P<build>\d[^-]*))?-(?P<python>[^-]+)-(?P<abi>[^-]+)"
    r"-(?P<platform>[^-]+)\.whl$"
)
COMMIT_RE = re.compile(r"^g([0-9a-f]{7,40})$")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One wheel a commit's metadata.json lists: its file name, absolute URL, version (from the file name, the
    variant included) and platform tag."""

    filename: str
    url: str
    project: str
    version: str
    platform_tag: str

    @property
    def platform(self) -> Platform | None:
        return Platform.from_wheel_tag(self.platform_tag)

    def names(self) -> tuple[str | None, str | None]:
        """(the commit prefix its version names, the variant after it): `0.33.1.dev12+g1a2b3c4d5.cu130` gives
        ('1a2b3c4d5', 'cu130'); a release's `0.33.0+cu130` (built at a tagged commit) (None, 'cu130')."""
        from packaging.version import InvalidVersion, Version

        try:
            local = Version(self.version).local or ""
        except InvalidVersion:
            return None, None
        head, _, rest = local.partition(".")
        if found := COMMIT_RE.match(head):
            return found.group(1), rest or None
        return None, local or None

    def release(self) -> str | None:
        """The release its version is (`0.33.0`, `0.10.2rc2`), which a tag names; None for a dev build."""
        from packaging.version import InvalidVersion, Version

        try:
            parsed = Version(self.version)
        except InvalidVersion:
            return None
        return None if parsed.is_devrelease else parsed.public


@dataclasses.dataclass(frozen=True)
class Listing:
    """A commit's metadata.json for one variant: its wheels of every project and CPU."""

    url: str
    entries: tuple[Entry, ...]

    def wheels_of(self, project: str) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if indexes.canonical(e.project) == indexes.canonical(project))

    def wheel_for(self, project: str, platform: Platform) -> Entry | None:
        """The wheel pip would take for `platform` (its CPU's newest manylinux tag up to glibc 2.36), or None."""
        allowed = indexes.manylinux_tags(platform.machine)
        fitting = [e for e in self.wheels_of(project) if e.platform_tag in allowed]
        return min(fitting, key=lambda e: (allowed.index(e.platform_tag), e.filename), default=None)


@dataclasses.dataclass(frozen=True)
class Index:
    """build.precompiled.nightly resolved for use: the root as written (`template`, maybe ${NAME}) and as asked
    now (`url`), and the variant (None: the default's pages)."""

    template: str
    url: str
    variant: str | None
    max_walk: int
    where: str

    @classmethod
    def of(cls, config: Config) -> Index:
        settings = config.build.precompiled
        nightly: Nightly | None = settings.nightly if settings else None
        where = f"{config.path}: build.precompiled.nightly"
        if nightly is None:
            raise BadInput(
                f"{where} is not set; `carry pin` finds the precompiled wheels on a per-commit wheel index: add "
                f"build.precompiled.nightly: {{index: URL or ${{NAME}}, variant: NAME}}"
            )
        url = indexurl.expand(nightly.index, f"{where}.index").rstrip("/")
        return cls(nightly.index, url, nightly.variant, nightly.max_walk, where)

    @property
    def variant_name(self) -> str:
        return self.variant or "default"

    def root(self, commit: str, written: bool = False) -> str:
        """The PEP 503 root of `commit`'s wheels of this variant, `{index}/{C}/[{variant}/]`: as build.yaml's pin
        writes it (`written`: the template, ${NAME} kept), or as asked now."""
        base = self.template.rstrip("/") if written else self.url
        return f"{base}/{commit}/" + (f"{self.variant}/" if self.variant else "")

    def listing(self, commit: str, project: str) -> Listing | None:
        """`commit`'s metadata.json of this variant (None: 404); bad input for a body that is not vLLM's list."""
        url = f"{self.root(commit)}{indexes.canonical(project)}/metadata.json"
        body = indexes.get(url, timeout=TIMEOUT_S)
        return None if body is None else Listing(url, tuple(self._entries(url, body)))

    def _entries(self, url: str, body: bytes) -> Iterator[Entry]:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            data = None
        fields = ("filename", "path", "package_name", "platform_tag")
        if not isinstance(data, list) or not all(
            isinstance(item, dict) and all(isinstance(item.get(key), str) for key in fields) for item in data
        ):
            raise BadInput(
                f"{self.where}.index: {indexes.public(url)} answered {_kind(body)}, not the JSON list of wheels a "
                f"per-commit wheel index holds there; {indexes.public(self.url)} is not such an index: check the URL"
            )
        for item in data:
            match = WHEEL_RE.match(item["filename"])
            if match is None or "/" in item["filename"]:
                raise BadInput(
                    f"{self.where}.index: {indexes.public(url)} lists {item['filename']!r}, which is not a wheel's "
                    f"file name; {indexes.public(self.url)} is not a per-commit wheel index: check the URL"
                )
            yield Entry(
                item["filename"],
                urllib.parse.urljoin(url, item["path"]),
                item["package_name"],
                urllib.parse.unquote(match.group("version")),
                item["platform_tag"],
            )

    def has(self, commit: str) -> tuple[str, ...] | None:
        """What `{index}/{C}/` lists (its projects and variant folders), to name what a commit has instead of the
        variant asked for; None when it has no such page."""
        body = indexes.get(f"{self.url}/{commit}/", timeout=TIMEOUT_S)
        if body is None:
            return None
        found = [href.strip("./") for href, _ in indexes.links(body.decode(errors="replace"))]
        return tuple(sorted({name for name in found if name and "/" not in name}))

    def check_page(self, commit: str, entry: Entry) -> None:
        """`entry`'s project page lists it, linking the same file (pip reads it where the store lacks it)."""
        page = f"{self.root(commit)}{indexes.canonical(entry.project)}/"
        body = indexes.get(page, timeout=TIMEOUT_S)
        if body is None:
            raise Failed(
                f"{indexes.public(page)}: 404, but its metadata.json lists {entry.filename}; the index is incomplete "
                f"(pip reads that page): try again once it is published"
            )
        found = indexes.links(body.decode(errors="replace"))
        if not found:
            raise BadInput(
                f"{self.where}.index: {indexes.public(page)} answered {_kind(body)} without a link, not a PEP 503 "
                f"page; {indexes.public(self.url)} is not a per-commit wheel index: check the URL"
            )
        if not any(urllib.parse.urljoin(page, href).split("#", 1)[0] == entry.url for href, _ in found):
            raise Failed(
                f"{indexes.public(page)} does not link {entry.filename}, which its metadata.json lists; the index "
                f"is inconsistent (pip reads that page): try again once it is published"
            )


def _kind(body: bytes) -> str:
    head = body.lstrip()[:200].lower()
    if head.startswith((b"<!doctype html", b"<html")) or b"<body" in head:
        return "an HTML page"
    return f"{len(body)} bytes of something else" if body else "an empty body"


class Stopped(Failed):
    """A download stopped because another one failed."""


def download(entry: Entry, store: Store, stop: threading.Event | None = None) -> tuple[Path, str]:
    """`entry`'s wheel in the download store and its sha256, hashed as it streams; Failed, keeping nothing, for a
    404 (a listed wheel that is not there) or a body shorter than announced (`stop` set: Stopped)."""
    import http.client
    import urllib.error
    import urllib.request

    from carry.util import reporter

    store.root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".nightly-", dir=store.root))
    part, digest, size, started = scratch / entry.filename, hashlib.sha256(), 0, time.monotonic()
    try:
        try:
            response = urllib.request.urlopen(indexes.request(entry.url), timeout=TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            raise Failed(
                f"{indexes.public(entry.url)}: {exc.code} {exc.reason}, but the index lists {entry.filename}; "
                f"nothing was written"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise Failed(f"{indexes.public(entry.url)}: download failed ({getattr(exc, 'reason', exc)})") from None
        with response, open(part, "wb") as handle:
            announced = response.headers.get("Content-Length")
            total = int(announced) if announced is not None and announced.isdigit() else 0
            bar = store.bar(total, entry.filename)
            try:
                while chunk := response.read(CHUNK):
                    if stop is not None and stop.is_set():
                        raise Stopped(f"{entry.filename}: stopped, another download failed")
                    digest.update(chunk)
                    handle.write(chunk)
                    size += len(chunk)
                    bar.advance(len(chunk))
            except (OSError, http.client.HTTPException) as exc:  # a chunked body cut short: IncompleteRead
                raise Failed(
                    f"{indexes.public(entry.url)}: the download broke off after {size} bytes ({exc}); nothing was "
                    f"written"
                ) from None
        if announced is not None and announced.isdigit() and size != int(announced):
            raise Failed(
                f"{indexes.public(entry.url)}: the download was cut short: {size} of {announced} bytes; nothing was "
                f"written"
            )
        sha = digest.hexdigest()
        path = store.adopt(part, entry.filename, sha)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    reporter.phase(
        "download",
        f"downloaded {entry.filename} from {indexes.public(entry.url)}: {size / 1e6:.1f} MB in "
        f"{time.monotonic() - started:.1f}s, sha256 {sha[:12]}",
    )
    return path, sha
