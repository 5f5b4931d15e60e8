"""A list of an upstream's released files pinned by sha256 (e.g. examples/vllm/releases.yaml), fetched through the
download store."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Iterable

import yaml

from carry.cache import Cache
from carry.download import Pinned, Store
from carry.errors import BadInput


@dataclasses.dataclass(frozen=True)
class Release:
    """One released file: its name, version, kind (`sdist` or `wheel`), platform for a wheel, and its pin."""

    name: str
    version: str
    kind: str
    platform: str | None
    pinned: Pinned


def load(path: Path) -> tuple[Release, ...]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BadInput(f"{path}: cannot read the release list ({exc}); fix the file") from None
    entries = data.get("files") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise BadInput(f"{path}: 'files' must be a list of {{name, version, kind, sha256, size, url}}")
    found = []
    for index, entry in enumerate(entries):
        where = f"{path}: files[{index}]"
        if not isinstance(entry, dict) or not all(entry.get(k) for k in ("name", "version", "kind", "url")):
            raise BadInput(f"{where} needs name, version, kind, sha256, size and url")
        pinned = Pinned.parse(str(entry["url"]), str(entry.get("sha256", "")), where, entry.get("size"))
        if pinned.name != entry["name"]:
            raise BadInput(f"{where}: the url names {pinned.name}, not {entry['name']}; fix one of them")
        found.append(Release(str(entry["name"]), str(entry["version"]), str(entry["kind"]), entry.get("platform"),
                             pinned))
    return tuple(found)


def store() -> Store:
    return Store.from_env(Cache.from_env().root)


def fetch(path: Path, names: Iterable[str] = (), say: Callable[[str], None] | None = None) -> list[Path]:
    """The local paths of the named releases (all of them by default), downloaded first where missing."""
    releases = load(path)
    wanted = list(names) or [release.name for release in releases]
    by_name = {release.name: release for release in releases}
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        raise BadInput(f"{path}: no release named {unknown[0]!r}; it lists {', '.join(by_name)}")
    where = store()
    return [where.get(by_name[name].pinned, say) for name in wanted]


def find(path: Path, version: str, kind: str, platform: str | None = None) -> Release:
    for release in load(path):
        if release.version == version and release.kind == kind and (platform is None or release.platform == platform):
            return release
    raise BadInput(f"{path}: no {kind} of {version}{' for ' + platform if platform else ''}")
