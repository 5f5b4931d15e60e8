"""Files pinned by sha256 (an upstream's released wheels and sdists), downloaded once into a content-addressed
store and checked before anyone reads them. A file is pinned (carry/util/pinned.py) by name (fetched from the
user's package index, carry/util/index.py), by a local path, or by an http(s) URL.

The store is `$CARRY_DOWNLOADS`, default `$CARRY_CACHE/downloads`: one directory per sha256 holding the file under
its own name. A download goes to a `.part` file first (resumed with an HTTP range request when one is left over) and
is renamed into place only once its size and sha256 match; a mismatch is removed and reported, never used. A
download of `Store.bar_from` bytes or more says how far it got at each quarter.

Every file is hashed once, as it is stored, and its stamp (path, size, mtime_ns, inode) remembered under `checked/`:
a file whose stamp holds is not read again (the locked image's wheels are GBs); one whose stamp changed is hashed
again before use, and removed and downloaded again when its bytes are wrong. A local path is hashed where it lies.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from carry.util.digest import sha256 as sha256_hasher
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import atomic_write_text, ensure_room, is_no_space, no_space_line
from carry.util.integrity import file_sha256
from carry.util.pinned import Pinned
from carry.util.record import record

if TYPE_CHECKING:
    from carry.util import reporter

CHUNK = 1 << 20
TIMEOUT_S = 60
ATTEMPTS = 4


@record
class Store:
    root: Path
    bar_from: int | None = None  # bytes: the smallest download whose quarters are said (None: BAR_FROM_BYTES)

    @classmethod
    def from_env(cls, cache_root: Path) -> Store:
        return cls(Path(os.environ.get("CARRY_DOWNLOADS") or cache_root / "downloads").absolute())

    def bar(self, total: int, name: str, done: int = 0) -> reporter.Bar:
        """The `download` bar of a file of `total` bytes (`done` of them there): each quarter said from `bar_from`."""
        from carry.util import reporter
        from carry.util.fsutil import human_size

        least = reporter.BAR_FROM_BYTES if self.bar_from is None else self.bar_from
        return reporter.bar("download", total, minimum=least, done=done, shown=f"{human_size(total)} {name}")

    def path(self, pinned: Pinned, name: str | None = None) -> Path:
        return self.root / pinned.sha256 / (name or pinned.name)

    def find(self, pinned: Pinned) -> Path | None:
        """The intact file of that sha256 in the store already, or None (a corrupt one is removed, and said)."""
        folder = self.root / pinned.sha256
        if pinned.name:
            found = [folder / pinned.name] if (folder / pinned.name).is_file() else []
        else:
            found = (
                [p for p in folder.iterdir() if p.is_file() and not p.name.endswith(".part")] if folder.is_dir() else []
            )
        if len(found) != 1:
            return None
        return found[0] if self.intact(found[0], pinned.sha256) else None

    def intact(self, path: Path, sha256: str) -> bool:
        """Whether stored `path` is the file of `sha256` (its stamp, else hashed); if not it is removed, and said."""
        if self._memo_says(path, sha256):
            return True
        found = file_sha256(path)
        if found == sha256:
            self._remember(path, sha256)
            return True
        from carry.util import integrity, reporter

        path.unlink(missing_ok=True)
        reporter.phase("download", integrity.Corrupt(path, found, sha256).line("removed; downloading it again"))
        return False

    def _memo(self, path: Path) -> tuple[Path, str]:
        stat = path.stat()
        key = f"{path.absolute()}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"
        return self.root / "checked" / f"{sha256_hasher(key.encode()).hexdigest()[:24]}.json", key

    def _memo_says(self, path: Path, sha256: str) -> bool:
        memo, key = self._memo(path)
        try:
            return bool(json.loads(memo.read_text()) == {"key": key, "sha256": sha256})
        except (OSError, ValueError):
            return False

    def _remember(self, path: Path, sha256: str) -> None:
        """The stamp of a file just hashed (size, mtime_ns, inode): a later hit need not read it again."""
        memo, key = self._memo(path)
        memo.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(memo, json.dumps({"key": key, "sha256": sha256}))

    def get(self, pinned: Pinned) -> Path:
        """The checked file: a local path as it is, a URL or a pin by name from the store (downloaded when missing)."""
        if pinned.requirement:
            return self.find(pinned) or self._from_index(pinned)
        if not pinned.is_url:
            return self._checked_local(pinned)
        target = self.path(pinned)
        return target if target.is_file() and self.intact(target, pinned.sha256) else self._download(pinned, target)

    # --- by name, from the package index ---------------------------------------------------------------------

    def _from_index(self, pinned: Pinned) -> Path:
        from carry.util import index, indexurl, reporter

        requirement, project = pinned.requirement, pinned.project
        if requirement is None or project is None:  # by_name pins only `project==version`
            raise BadInput(
                f"{pinned.where}: requirement {requirement!r} names no single version; pin one, e.g. 'vllm==0.33.0'"
            )
        where = pinned.where or requirement
        if pinned.name:  # a file of a known name: the link on the index's simple page, downloaded by the store
            url, listed = index.find_file(project, pinned.name, where)
            if listed and listed.lower() != pinned.sha256:
                raise BadInput(
                    f"{where}: the index lists {pinned.name} with sha256 {listed}, not the pinned "
                    f"{pinned.sha256}; fix the sha256"
                )
            import dataclasses

            return self._download(dataclasses.replace(pinned, source=url), self.path(pinned))
        if pinned.platform is None:
            raise BadInput(f"{where}: {pinned.requirement} needs a file name or a platform to pick a wheel by")
        import shutil
        import tempfile

        asked_index = indexurl.expand(pinned.index, f"{where}: index", indexurl.URL_SCHEMES) if pinned.index else None
        self.root.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        scratch = Path(tempfile.mkdtemp(prefix=".pip-", dir=self.root))
        try:
            got = index.download_wheel(requirement, pinned.sha256, pinned.platform, asked_index, scratch, where)
            found = file_sha256(got)
            if found != pinned.sha256:
                raise BadInput(
                    f"{where}: pip downloaded {got.name} with sha256 {found}, not the pinned "
                    f"{pinned.sha256}; fix the sha256 or the index"
                )
            target = self.path(pinned, got.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(got, target)
            self._remember(target, found)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        asked = index.configured(asked_index).describe()
        reporter.phase(
            "download",
            f"downloaded {target.name} ({pinned.requirement} for {pinned.platform}) with pip from {asked}: "
            f"{target.stat().st_size / 1e6:.1f} MB in {time.monotonic() - started:.1f}s, sha256 {found[:12]} ok",
        )
        return target

    def adopt(self, part: Path, name: str, sha256: str) -> Path:
        """`part`, downloaded and hashed by its caller on the store's filesystem, placed as `name` under its sha256
        (trust on first use). A file of that sha256 already there is kept and `part` removed."""
        target = self.root / sha256 / name
        if target.is_file() and self.intact(target, sha256):
            part.unlink(missing_ok=True)
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, target)
        self._remember(target, sha256)
        return target

    # --- local files ---------------------------------------------------------------------------------

    def _checked_local(self, pinned: Pinned) -> Path:
        path = pinned.local_path.absolute()
        if not path.is_file():
            raise BadInput(f"{path}: not found; give the path of {pinned.name}, or its http(s) URL")
        if self._memo_says(path, pinned.sha256):
            return path
        found = file_sha256(path)
        if found != pinned.sha256:
            raise BadInput(f"{path}: sha256 is {found}, not the pinned {pinned.sha256}; fix the sha256 or the file")
        self._remember(path, pinned.sha256)
        return path

    # --- downloads -----------------------------------------------------------------------------------

    def _download(self, pinned: Pinned, target: Path) -> Path:
        """`pinned` into `target` through `target.part`: resumed where a part is there, and on a cut connection; renamed
        into place only when its size and sha256 are the pinned ones. A resumed part of other bytes is fetched anew."""
        from carry.util import reporter

        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f"{target.name}.part")
        started = time.monotonic()
        resumed: list[int] = []
        for fresh in (False, True):
            if fresh:
                reporter.phase(
                    "download",
                    f"{pinned.name}: the resumed download is not the pinned file; downloading it again from the start",
                )
                part.unlink(missing_ok=True)
            resumed += self._fetch_with_retries(pinned, part)
            found = self._checked_part(pinned, part, last_try=fresh or not resumed)
            if found is not None:
                break
        assert found is not None  # the last try raises instead
        os.replace(part, target)
        self._remember(target, found)
        note = f", resumed at {', '.join(map(str, resumed))} bytes" if resumed else ""
        reporter.phase(
            "download",
            f"downloaded {pinned.name} from {_public(pinned.source)}: {target.stat().st_size / 1e6:.1f} MB in "
            f"{time.monotonic() - started:.1f}s{note}, sha256 {found[:12]} ok",
        )
        return target

    def _fetch_with_retries(self, pinned: Pinned, part: Path) -> list[int]:
        """`pinned.source` appended to `part` (ATTEMPTS tries, each resuming what the last one got); the offsets it
        resumed at. A full disk is not retried: one line naming the part and what it needs."""
        import http.client

        resumed: list[int] = []
        last_error: Exception | None = None
        for attempt in range(ATTEMPTS):
            have = part.stat().st_size if part.exists() else 0
            try:
                if pinned.size is not None:
                    ensure_room(part.parent, pinned.size - have, part.name)
                if have:
                    resumed.append(have)
                _fetch_into(pinned.source, part, pinned.size, self)
                return resumed
            except (OSError, http.client.HTTPException) as exc:  # OSError: URLError and TimeoutError too
                if is_no_space(exc):
                    needed = pinned.size - have if pinned.size is not None else None
                    raise Failed(no_space_line(part, needed=needed, written=have)) from None
                last_error = exc
            if attempt + 1 < ATTEMPTS:
                time.sleep(min(2**attempt, 8))  # 1, 2, 4 s: then one line, the part kept to resume
        raise Failed(
            f"{_public(pinned.source)}: download failed after {ATTEMPTS} attempts ({_reason(last_error)});"
            f" {part.stat().st_size if part.exists() else 0} bytes kept in {part} for the next try"
        )

    def _checked_part(self, pinned: Pinned, part: Path, last_try: bool) -> str | None:
        """The part's sha256 when it is the pinned file; else None (to try again), or on the last try bad input."""
        size = part.stat().st_size
        if pinned.size is not None and size != pinned.size:
            problem = f"{size} bytes, not the pinned {pinned.size}; fix the pin or URL"
        elif (found := file_sha256(part)) == pinned.sha256:
            return found
        else:
            problem = f"sha256 is {found}, not the pinned {pinned.sha256}; fix the sha256 or the URL"
        if not last_try:
            return None
        _discard(part)
        raise BadInput(f"{_public(pinned.source)}: {problem}")


def _fetch_into(url: str, part: Path, size: int | None, store: Store) -> None:
    """Append the rest of `url` to `part` (a range request when it has bytes); `size` or Content-Length to the bar."""
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
        resumed = have and response.status == 206  # a 200 is the whole file: the server ignored the range
        length = response.headers.get("Content-Length")
        before = have if resumed else 0
        total = size or (before + int(length) if length is not None and length.isdigit() else 0)
        name = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name
        bar = store.bar(total, name, done=before)
        with open(part, "ab" if resumed else "wb") as handle:
            start = handle.tell()
            while chunk := response.read(CHUNK):
                handle.write(chunk)
                bar.advance(len(chunk))
            got = handle.tell() - start
    if length is not None and length.isdigit() and got < int(length):
        # http.client ends a body cut short without an error: the next try resumes from what arrived
        raise ConnectionError(f"the connection closed after {got} of {length} bytes")


def _discard(part: Path) -> None:
    """A download that is not the pinned file: removed, with its store directory when that is left empty."""
    part.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        part.parent.rmdir()


def sha256_in_store(path: Path) -> str:
    """A wheel's sha256: in the download store, its directory's name (checked when put there); anywhere else, read."""
    import re

    name = path.parent.name
    return name if re.fullmatch(r"[0-9a-f]{64}", name) else file_sha256(path)


def _public(url: str) -> str:
    from carry.util import redact

    return redact.address(url)


def _reason(error: Exception | None) -> str:
    return str(getattr(error, "reason", None) or error)
