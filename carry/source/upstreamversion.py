"""The upstream's own version, which a wheel carry builds carries in front of its local label (`1.6.0+carry.VERSION`)
when `build.wheel_version` is not set, so that what depends on the upstream (`pluggy>=1.5`) still resolves: the
tree's static `[project] version`, else the nearest version tag on the pin (as `git describe` finds it) from the tags
upstream lists now, else `0`, each saying where it came from. A tag's answer is kept in the mirror per pin, so an
offline rerun builds the same version; the image's build stage gets the host's in $CARRY_UPSTREAM_VERSION.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

from carry.config import Config
from carry.config.reader import public_url
from carry.source import git
from carry.util.cache import Cache
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import atomic_write_text

ENV = "CARRY_UPSTREAM_VERSION"
# A release tag: 1.6.0, v0.33.0, 2.0rc1 (PEP 440 public versions, optionally after a `v`).
TAG_RE = re.compile(r"^v?(\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?)$")
FIRST_DEPTH = 64  # commits of the pin's history fetched when no tag is in what the mirror has; then x4
MAX_DEPTH = 16384
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class UpstreamVersion:
    """The upstream's version and where it was found."""

    version: str
    source: str

    def template(self) -> str:
        """build.wheel_version's default: this version, with VERSION as the local label."""
        return f"{self.version}+carry.{{version}}"

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": self.version, "source": self.source}


def resolve(config: Config, cache: Cache, mirror: Path, tree: str) -> UpstreamVersion:
    """$CARRY_UPSTREAM_VERSION, else the tree's static [project] version, else the pin's nearest tag, else 0."""
    if given := os.environ.get(ENV, "").strip():
        if not TAG_RE.match(given) or given.startswith("v"):
            raise BadInput(f"${ENV} is {given!r}, not a version like 1.6.0; unset it")
        return UpstreamVersion(given, f"${ENV}, as the image build found it")
    return static(mirror, tree) or of_pin(config, cache, mirror)


def pyproject(mirror: Path, tree: str) -> dict:
    """`tree`'s pyproject.toml as a dict (empty when it has none); Failed when it does not parse."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: `build` depends on tomli there
        import tomli as tomllib  # type: ignore[no-redef]

    text = git.show_blob(mirror, f"{tree}:pyproject.toml")
    try:
        return tomllib.loads(text) if text else {}
    except tomllib.TOMLDecodeError as exc:
        raise Failed(f"the upstream's pyproject.toml does not parse ({exc})") from None


def static(mirror: Path, tree: str) -> UpstreamVersion | None:
    """The static `[project] version` of `tree`'s pyproject.toml (its public part), or None."""
    try:
        project = pyproject(mirror, tree).get("project", {})
    except Failed:
        return None
    version = project.get("version")
    if not isinstance(version, str) or "version" in project.get("dynamic", []):
        return None
    from packaging.version import InvalidVersion, Version

    try:
        public = Version(version).public
    except InvalidVersion:
        return None
    return UpstreamVersion(public, "the static [project] version in pyproject.toml")


def of_pin(config: Config, cache: Cache, mirror: Path) -> UpstreamVersion:
    """The nearest version tag on the pin (remembered per pin in the mirror), else 0."""
    pin = config.upstream.commit
    if (remembered := _remembered(mirror, pin)) is not None:
        return remembered
    tags, asked = _tags(config, mirror)
    found = _nearest(config, cache, mirror, pin, tags) if tags else None
    if found is not None:
        name, distance = found
        where = "at the pin" if distance == 0 else f"{distance} commit(s) before the pin"
        answer = UpstreamVersion(_tag_version(name), f"the nearest version tag on the pin, {name}, {where}")
    else:
        why = "" if asked else f" (upstream {public_url(config.upstream.url)} could not be asked for its tags)"
        answer = UpstreamVersion(
            "0", f"no static [project] version and no version tag on the pin{why}; set build.wheel_version"
        )
    if asked:  # remembered for an offline rerun
        path = _path(mirror, pin)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(answer.to_json(), indent=2) + "\n")
    return answer


def _path(mirror: Path, pin: str) -> Path:
    return mirror / "carry" / "versions" / f"{pin}.json"


def _remembered(mirror: Path, pin: str) -> UpstreamVersion | None:
    try:
        data = json.loads(_path(mirror, pin).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return UpstreamVersion(str(data["version"]), str(data["source"]))


def _tags(config: Config, mirror: Path) -> tuple[dict[str, list[str]], bool]:
    """commit -> the version tags naming it, from upstream now (True), else from those the mirror fetched (False)."""
    try:
        named = git.ls_remote_tags(mirror, config.upstream.url)
        asked = True
    except git.GitError:
        named = git.local_tags(mirror, "refs/carry/upstream/tags/")
        asked = False
    tags: dict[str, list[str]] = {}
    for name, commit in named.items():
        if TAG_RE.match(name):
            tags.setdefault(commit, []).append(name)
    return tags, asked


def _nearest(
    config: Config, cache: Cache, mirror: Path, pin: str, tags: dict[str, list[str]]
) -> tuple[str, int] | None:
    """(tag, commits between it and the pin) for the version tag fewest commits before the pin, deepening a shallow
    mirror's history of the pin until one is found or the history ends; None when none is."""
    depth = FIRST_DEPTH
    while True:
        history = git.rev_list(mirror, pin)
        if hits := [commit for commit in history if commit in tags]:
            counted = {commit: int(git.run(mirror, "rev-list", "--count", f"{commit}..{pin}")) for commit in hits}
            best = min(hits, key=lambda commit: counted[commit])
            return _highest(tags[best]), counted[best]
        if not (git.shallow_commits(mirror) & set(history)) or depth > MAX_DEPTH:
            return None
        with cache.lock(mirror.name):
            try:
                git.fetch(mirror, config.upstream.url, pin, extra=(f"--deepen={depth}",))
            except git.GitError:
                return None
        depth *= 4


def _highest(names: list[str]) -> str:
    from packaging.version import Version

    return max(names, key=lambda name: Version(_tag_version(name)))


def _tag_version(name: str) -> str:
    """The version a tag `_tags` kept names."""
    match = TAG_RE.match(name)
    assert match is not None  # _tags keeps only names TAG_RE matches
    return match.group(1)
