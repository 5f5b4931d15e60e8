"""A list of an upstream's released files pinned by name, version and sha256 (e.g. examples/vllm/releases.yaml),
fetched through the download store from the package index pip is configured with (carry/util/index.py): no URL is
written in the list."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

import yaml

from carry.platforms import Platform
from carry.util.cache import Cache
from carry.util.download import Store
from carry.util.errors import BadInput
from carry.util.pinned import Pinned

KINDS = ("sdist", "wheel")


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
        raise BadInput(f"{path}: 'files' must be a list of {{name, version, kind, platform, sha256, size}}")
    return tuple(_release(entry, f"{path}: files[{index}]") for index, entry in enumerate(entries))


def _release(entry: object, where: str) -> Release:
    if not isinstance(entry, dict) or not all(entry.get(k) for k in ("name", "version", "kind", "sha256")):
        raise BadInput(f"{where} needs name, version, kind, sha256 and size (and platform for a wheel)")
    name, version, kind = str(entry["name"]), str(entry["version"]), str(entry["kind"])
    if "url" in entry:
        raise BadInput(f"{where}: no url: the file is asked for by name from the index pip is configured with")
    if kind not in KINDS:
        raise BadInput(f"{where}: kind {kind!r} is none of {', '.join(KINDS)}")
    project, sep, _ = name.partition(f"-{version}")
    if not sep or not project:
        raise BadInput(f"{where}: {name} is not a file of version {version} (PROJECT-{version}…); fix one of them")
    platform = entry.get("platform")
    if kind == "wheel":
        if not platform:
            raise BadInput(f"{where}: a wheel needs its platform (e.g. linux/amd64)")
        Platform.parse(str(platform), where)
    pinned = Pinned.by_name(f"{project}=={version}", str(entry["sha256"]), where, name=name, size=entry.get("size"))
    return Release(name, version, kind, platform, pinned)


def store() -> Store:
    return Store.from_env(Cache.from_env().root)


def fetch(path: Path, names: Iterable[str] = ()) -> list[Path]:
    """The local paths of the named releases (all of them by default), downloaded first where missing."""
    releases = load(path)
    wanted = list(names) or [release.name for release in releases]
    by_name = {release.name: release for release in releases}
    if unknown := [name for name in wanted if name not in by_name]:
        raise BadInput(f"{path}: no release named {unknown[0]!r}; it lists {', '.join(by_name)}")
    where = store()
    return [where.get(by_name[name].pinned) for name in wanted]


def find(path: Path, version: str, kind: str, platform: str | None = None) -> Release:
    for release in load(path):
        if release.version == version and release.kind == kind and (platform is None or release.platform == platform):
            return release
    raise BadInput(f"{path}: no {kind} of {version}{' for ' + platform if platform else ''}")
