"""The package index the user configured for pip: where carry asks for a file it knows by name, version and sha256.

carry writes no index host anywhere. A wheel pinned by requirement is fetched by pip itself, hash-checked, for the
wheel's platform, so pip's own configuration decides where it asks (`--index-url` only where build.yaml gives an
`index:`). A file known by its exact name (an sdist, which pip cannot download without building its metadata) is
looked up on the simple-API page (PEP 503) of the index pip is configured with.
"""

from __future__ import annotations

import dataclasses
import functools
import html.parser
import os
import re
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from carry.util import redact
from carry.util.errors import BadInput, Failed
from carry.util.run import execute

if TYPE_CHECKING:
    import urllib.request

PIP_TIMEOUT_S = 1800
INDEX_KEYS = ("index-url", "extra-index-url")
# The variables that change what `pip config list` says: its own, and where it finds its files.
PIP_ENV = ("PIP_", "HOME", "XDG_CONFIG_")


class WheelPlatform(Protocol):
    """What pip's --platform list needs of a container platform: its CPU as `uname -m` says it, and its name."""

    @property
    def machine(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Indexes:
    """Where pip asks: the index URL (first) and the extra ones, and whence they come."""

    urls: tuple[str, ...]
    source: str

    def describe(self) -> str:
        return f"{', '.join(public(url) for url in self.urls)} ({self.source})"


def public(url: str) -> str:
    """A URL without user:password@ (never printed), query or fragment."""
    return redact.address(url)


def pip_settings() -> dict[str, str]:
    """pip's configuration as `pip config list` gives it (`section.key` -> value), asked once per environment."""
    return dict(_pip_config_list(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PIP_ENV)))))


@functools.cache
def _pip_config_list(environ: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    result = execute([sys.executable, "-m", "pip", "config", "list"], text=True, timeout=120)
    pairs = (line.partition("=") for line in result.stdout.splitlines())
    found = {key.strip(): value.strip().strip("'\"") for key, sep, value in pairs if sep}
    return tuple(found.items())


def pip_indexes(command: str) -> dict[str, str]:
    """pip's index-url and extra-index-url for `pip <command>`, as written: PIP_* over [command] over [global]."""
    settings = pip_settings()
    chosen = {}
    for key in INDEX_KEYS:
        for section in (":env:", command, "global"):
            if f"{section}.{key}" in settings:
                chosen[key] = settings[f"{section}.{key}"]
                break
    return chosen


def pip_default_index() -> str:
    """The index pip asks when nothing is configured (pip's own constant, not carry's)."""
    try:
        from pip._internal.models.index import PyPI
    except ImportError:
        raise BadInput(f"{sys.executable}: has no pip; install pip into carry's interpreter") from None
    return PyPI.simple_url


def configured(index: str | None = None) -> Indexes:
    """The indexes pip asks for a download: build.yaml's `index:` first where given, then pip's configuration."""
    chosen = {key: value.split() for key, value in pip_indexes("download").items()}
    extra = tuple(chosen.get("extra-index-url", ()))
    if index:
        return Indexes((index, *extra), "build.yaml's index, then pip's extra indexes")
    if chosen.get("index-url"):
        return Indexes((*chosen["index-url"][:1], *extra), "pip's configuration")
    return Indexes((pip_default_index(), *extra), "pip's default index and configuration")


# --- a file by its name, from the simple-API page ----------------------------------------------------------------


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (href, text)
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href, self._text = dict(attrs).get("href"), []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def links(page: str) -> list[tuple[str, str]]:
    """The (href, text) of every link on an HTML page (a PEP 503 page: one per file)."""
    parser = _Links()
    parser.feed(page)
    return parser.links


def canonical(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()


def find_file(project: str, filename: str, where: str) -> tuple[str, str | None]:
    """(URL, sha256 if given) of `filename` on the first index whose `project` page lists it; else bad input."""
    indexes = configured()
    for url in indexes.urls:
        page = f"{url.rstrip('/')}/{canonical(project)}/"
        text = _page(page)
        if text is None:
            continue
        for href, label in links(text):
            link = urllib.parse.urlsplit(urllib.parse.urljoin(page, href))
            if label == filename or urllib.parse.unquote(link.path.rsplit("/", 1)[-1]) == filename:
                sha = link.fragment.split("=", 1)[1] if link.fragment.startswith("sha256=") else None
                return urllib.parse.urlunsplit(link._replace(fragment="")), sha
    raise BadInput(
        f"{where}: {filename} is on no index pip asks ({indexes.describe()}); check the name and "
        f"version, or configure pip's index (PIP_INDEX_URL, pip config set global.index-url URL)"
    )


def _page(url: str) -> str | None:
    """The text of a simple-API page (None where the index has no such project)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        folder = Path(urllib.parse.unquote(parts.path))
        page = folder / "index.html"
        if page.is_file():
            return page.read_text(errors="replace")
        if folder.is_dir():
            return "".join(f'<a href="{urllib.parse.quote(p.name)}">{p.name}</a>' for p in sorted(folder.iterdir()))
        return None
    body = get(url, accept="text/html")
    return None if body is None else body.decode(errors="replace")


def get(url: str, accept: str = "*/*", timeout: float = 60) -> bytes | None:
    """The body at `url` (None for a 404); Failed naming the URL (no credentials) for any other answer."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(request(url, accept), timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise Failed(f"{public(url)}: the index answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise Failed(f"{public(url)}: cannot reach the index ({getattr(exc, 'reason', exc)})") from None


def request(url: str, accept: str = "*/*") -> urllib.request.Request:
    """A GET of `url` without its credentials, sent as a Basic login header instead where the URL names them."""
    import base64
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    headers = {"Accept": accept}
    if parts.username is not None:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    return urllib.request.Request(public(url), headers=headers)


# --- a wheel by requirement, through pip ------------------------------------------------------------------------


def manylinux_tags(machine: str, major: int = 2, minor: int = 36) -> list[str]:
    """pip's --platform list for a target of that CPU and glibc (default Debian 12's 2.36): every manylinux tag down
    to the CPU's oldest, with the legacy aliases (pip download adds none itself)."""
    floor = 5 if machine in ("x86_64", "i686") else 17
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, floor - 1, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{machine}" for m, name in legacy.items() if floor <= m <= minor]


def pip_download_command(
    requirements: Path, into: Path, python: str, tags: list[str], hashed: bool = True
) -> list[str]:
    """`pip download` of hash-pinned `requirements` (wheels only, no dependencies, no cache) for CPython `python` on
    the platform `tags` into `into`, through the user's pip configuration; not `hashed`: trust on first use."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    argv += ["--require-hashes"] if hashed else []
    argv += ["--no-cache-dir", "--disable-pip-version-check", "--progress-bar", "off", "--implementation", "cp"]
    argv += ["--python-version", python, *(arg for tag in tags for arg in ("--platform", tag))]
    return [*argv, "-d", str(into), "-r", str(requirements)]


def download_wheel(
    requirement: str, sha256: str | None, platform: WheelPlatform, index: str | None, into: Path, where: str
) -> Path:
    """The one wheel pip picks for `requirement` on `platform`, downloaded hash-checked (`sha256` None: trust on first
    use) into the empty directory `into`; bad input naming the requirement, platform and indexes when there is none."""
    indexes = configured(index)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    with tempfile.TemporaryDirectory(prefix="carry-pip-") as scratch:
        pins = Path(scratch) / "requirements.txt"
        pins.write_text(f"{requirement} --hash=sha256:{sha256}\n" if sha256 else f"{requirement}\n")
        tags = manylinux_tags(platform.machine)
        argv = pip_download_command(pins, into, python, tags, hashed=sha256 is not None)
        if index:
            argv += ["--index-url", index]
        result = execute(argv, text=True, timeout=PIP_TIMEOUT_S, env={**os.environ, "PIP_NO_INPUT": "1"})
    wheels = sorted(into.glob("*.whl"))
    asked = f"{requirement} for {platform} (cp{python.replace('.', '')}, manylinux ≤ 2.36) on {indexes.describe()}"
    if result.returncode == 0 and len(wheels) == 1:
        return wheels[0]
    said = result.stderr
    if "DO NOT MATCH THE HASHES" in said:
        got = re.search(r"Got\s+([0-9a-f]{64})", said)
        raise BadInput(
            f"{where}: the index serves {requirement} for {platform} with sha256 {got.group(1) if got else '(other)'}, "
            f"not the pinned {sha256}; fix the sha256 or the index (asked: {indexes.describe()})"
        )
    if "No matching distribution" in said or "Could not find a version" in said:
        versions = re.search(r"\(from versions: ([^)]*)\)", said)
        there = f"; versions with a wheel for it there: {versions.group(1)[-200:]}" if versions else ""
        raise BadInput(
            f"{where}: no wheel of {asked}: no such version, or none for that platform{there}; fix the "
            f"requirement, the platform or the index"
        )
    lines = [line for line in said.splitlines() if line.strip() and not line.startswith("WARNING")]
    raise Failed(f"{where}: pip could not download {asked}: {redact.credentials(lines[-1] if lines else 'no output')}")
