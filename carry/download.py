"""Files pinned by sha256 (an upstream's released wheels and sdists), downloaded once into a content-addressed
store and checked before anyone reads them.

The store lives in `$CARRY_DOWNLOADS`, default `$CARRY_CACHE/downloads` (`~/.cache/carry/downloads`): one
directory per sha256 holding the file under its own name. A download goes to a `.part` file first, resumes it
with an HTTP range request when a killed run left one, and is renamed into place only once its size and sha256
match; a mismatch removes it and is reported, never used. A local path is hashed where it lies (once per
size/mtime/inode, remembered beside the store) and not copied.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Callable

from carry.errors import BadInput, Failed
from carry.fsutil import atomic_write_text

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20
TIMEOUT_S = 60
ATTEMPTS = 4


@dataclasses.dataclass(frozen=True)
class Pinned:
    """A file known by its sha256: where to get it (an http(s) URL or a local path) and its name and size."""

    source: str
    sha256: str
    name: str
    size: int | None = None

    @classmethod
    def parse(cls, source: str, sha256: str, where: str, size: int | None = None) -> Pinned:
        sha = str(sha256 or "").strip().lower()
        if not SHA256_RE.match(sha):
            raise BadInput(f"{where}: sha256 {sha256!r} is not 64 hex digits; give the file's sha256 (sha256sum FILE)")
        text = str(source or "").strip()
        if not text:
            raise BadInput(f"{where}: no file given; set a path or an http(s) URL")
        scheme = urllib.parse.urlsplit(text).scheme.lower()
        if "://" in text and scheme not in ("http", "https", "file"):
            raise BadInput(f"{where}: {text!r} has scheme {scheme!r}; use an http(s) URL or a local path")
        name = Path(urllib.parse.unquote(urllib.parse.urlsplit(text).path)).name
        if not name or name in (".", ".."):
            raise BadInput(f"{where}: {text!r} names no file; give the URL or path of the file itself")
        return cls(text, sha, name, size)

    @property
    def is_url(self) -> bool:
        return urllib.parse.urlsplit(self.source).scheme.lower() in ("http", "https")

    @property
    def local_path(self) -> Path:
        parts = urllib.parse.urlsplit(self.source)
        return Path(urllib.parse.unquote(parts.path)) if parts.scheme.lower() == "file" else Path(self.source)

    def short(self) -> str:
        return f"{self.name} (sha256 {self.sha256[:8]}…)"


@dataclasses.dataclass(frozen=True)
class Store:
    root: Path

    @classmethod
    def from_env(cls, cache_root: Path) -> Store:
        return cls(Path(os.environ.get("CARRY_DOWNLOADS") or cache_root / "downloads").absolute())

    def path(self, pinned: Pinned) -> Path:
        return self.root / pinned.sha256 / pinned.name

    def get(self, pinned: Pinned, say: Callable[[str], None] | None = None) -> Path:
        """The checked file: a local path as it is, a URL from the store (downloaded first when missing)."""
        if not pinned.is_url:
            return self._checked_local(pinned)
        target = self.path(pinned)
        if target.is_file():
            return target
        return self._download(pinned, target, say or (lambda line: None))

    # --- local files ---------------------------------------------------------------------------------

    def _checked_local(self, pinned: Pinned) -> Path:
        path = pinned.local_path.absolute()
        if not path.is_file():
            raise BadInput(f"{path}: not found; give the path of {pinned.name}, or its http(s) URL")
        stat = path.stat()
        key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"
        memo = self.root / "checked" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
        try:
            if json.loads(memo.read_text()) == {"key": key, "sha256": pinned.sha256}:
                return path
        except (OSError, ValueError):
            pass
        found = sha256_of(path)
        if found != pinned.sha256:
            raise BadInput(f"{path}: sha256 is {found}, not the pinned {pinned.sha256}; fix the sha256 or the file")
        memo.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(memo, json.dumps({"key": key, "sha256": pinned.sha256}))
        return path

    # --- downloads -----------------------------------------------------------------------------------

    def _download(self, pinned: Pinned, target: Path, say: Callable[[str], None]) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f"{target.name}.part")
        started = time.monotonic()
        started_at = part.stat().st_size if part.exists() else 0
        last_error: Exception | None = None
        import urllib.error

        for attempt in range(ATTEMPTS):
            try:
                _fetch_into(pinned.source, part)
                last_error = None
                break
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                last_error = exc
                time.sleep(min(2 ** attempt, 8))
        if last_error is not None:
            raise Failed(f"{_public(pinned.source)}: download failed after {ATTEMPTS} attempts ({_reason(last_error)});"
                         f" {part.stat().st_size if part.exists() else 0} bytes kept in {part} for the next try")
        size = part.stat().st_size
        if pinned.size is not None and size != pinned.size:
            _discard(part)
            raise BadInput(f"{_public(pinned.source)}: {size} bytes, not the pinned {pinned.size}; fix the pin or URL")
        found = sha256_of(part)
        if found != pinned.sha256:
            _discard(part)
            raise BadInput(f"{_public(pinned.source)}: sha256 is {found}, not the pinned {pinned.sha256}; "
                           f"fix the sha256 or the URL")
        os.replace(part, target)
        resumed = f", resumed at {started_at} bytes" if started_at else ""
        say(f"downloaded {pinned.name} from {_public(pinned.source)}: {size / 1e6:.1f} MB in "
            f"{time.monotonic() - started:.1f}s{resumed}, sha256 {found[:12]} ok")
        return target


def _fetch_into(url: str, part: Path) -> None:
    """Append the rest of `url` to `part` (a range request when it has bytes already)."""
    import urllib.error
    import urllib.request

    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the part file is complete already
            return
        raise
    with response:
        resumed = have and response.status == 206
        with open(part, "ab" if resumed else "wb") as handle:
            shutil.copyfileobj(response, handle, CHUNK)


def _discard(part: Path) -> None:
    """A download that is not the pinned file: removed, with its store directory when that is left empty."""
    part.unlink(missing_ok=True)
    try:
        part.parent.rmdir()
    except OSError:
        pass


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK * 4):
            digest.update(chunk)
    return digest.hexdigest()


def _public(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1], query="", fragment=""))


def _reason(error: Exception) -> str:
    return str(getattr(error, "reason", None) or error)

