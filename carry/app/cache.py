"""`cache` and `cache prune`: how big each part of `$CARRY_CACHE` is, and removing what no current config needs.

Sizes are disk usage (as `du`), every inode counted once: build environments and cache copies share files by hard
links, so a removed entry frees only the inodes no link outside it keeps.

Prune keeps, for each config given, what its current state uses: its mirror and pin bundle, build dirs, the build
environment of its current `[build-system] requires`, the cached wheels of its patched tree, the download-store files
it pins, the wheelhouses of its image.platforms, and the logs of what is kept. Everything else of those parts goes,
and temp dirs of processes that are gone. Compiler caches bound themselves and are left alone.

Safe while another carry runs: each entry's own lock is taken without waiting (a held one is skipped and named), and
a removed entry is first renamed to a hidden name beside it (a reader finds it whole or not at all), then deleted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import stat
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from carry.util.cache import Cache
from carry.util.download import Store
from carry.util.errors import BadInput
from carry.util.fsutil import human_size, owned_prefix, remove, sweep_dead

if TYPE_CHECKING:
    from carry.config import Config

TRASH_PREFIX = ".carry-prune-"
PART_FRESH_S = 3600  # a .part download touched this recently is in progress
# The parts in the order shown, with what they hold; every other entry of the cache is shown after them.
PARTS = (
    ("mirrors", "mirrors", "bare git mirrors of upstreams"),
    ("bundles", "bundles", "git bundles of pinned commits"),
    ("build dirs", "build", "build worktrees and source-tree checkouts"),
    ("environments", "envs", "build environments (uv venvs)"),
    ("wheels", "artifacts", "finished wheels, by cache key"),
    ("derive bases", "derive", "the last PEP 517 build of each precompiled plan (a Python-only change derives)"),
    ("downloads", None, "sha256-pinned files (the download store)"),
    ("wheelhouses", "wheelhouse", "build requirements for hermetic builds, per platform"),
    ("upstream suites", "suites", "`suite`: test trees, each wheel's venv, the comparison side's results"),
    ("logs", "logs", "build and environment logs"),
)


# --- sizes ---------------------------------------------------------------------------------------------------------


def _walk(path: Path) -> Iterator[os.stat_result]:
    """lstat of `path` and everything under it (symlinks not followed)."""
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return
    yield top
    if not stat.S_ISDIR(top.st_mode):
        return
    stack = [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    yield info
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue


class Meter:
    """Disk usage with every inode counted once across this meter, and which inodes have links outside it."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], list] = {}  # inode -> [links seen, blocks, st_nlink, part]

    def size(self, path: Path, part: str = "") -> tuple[int, int]:
        """(bytes, files) of `path` not counted before."""
        total = files = 0
        for info in _walk(path):
            key = (info.st_dev, info.st_ino)
            if key in self.seen:
                self.seen[key][0] += 1
                continue
            links = 1 if stat.S_ISDIR(info.st_mode) else info.st_nlink  # a directory's links are its subdirs
            self.seen[key] = [1, info.st_blocks * 512, links, part]
            total += info.st_blocks * 512
            files += not stat.S_ISDIR(info.st_mode)
        return total, files

    def shared(self) -> dict[str, int]:
        """Per part, the bytes of its inodes that also have links outside everything measured."""
        found: dict[str, int] = {}
        for seen, blocks, nlink, part in self.seen.values():
            if seen < nlink:
                found[part] = found.get(part, 0) + blocks
        return found


def freed_by(path: Path) -> int:
    """The bytes removing `path` gives back: the inodes all of whose links lie inside it."""
    links: dict[tuple[int, int], list] = {}
    for info in _walk(path):
        links.setdefault((info.st_dev, info.st_ino), [0, info])[0] += 1
    return sum(
        info.st_blocks * 512 for count, info in links.values() if stat.S_ISDIR(info.st_mode) or count >= info.st_nlink
    )


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    path: Path
    bytes: int
    files: int
    entries: int
    what: str
    shared: int = 0  # bytes also linked from outside the cache (uv's cache, dist/): not freed by removing it


@dataclasses.dataclass(frozen=True)
class Usage:
    root: Path
    parts: tuple[Part, ...]

    @property
    def total(self) -> int:
        return sum(part.bytes for part in self.parts)

    def lines(self) -> list[str]:
        width = max(len(part.name) for part in self.parts) if self.parts else 5
        rows = [f"cache {self.root}"]
        for part in self.parts:
            shared = f" ({human_size(part.shared)} shared with files outside the cache)" if part.shared else ""
            entries = f"{part.entries} entr{'y' if part.entries == 1 else 'ies'}"
            rows.append(f"  {part.name:<{width}}  {human_size(part.bytes):>9}  {entries:>12}  {part.path}{shared}")
        rows.append(f"  {'total':<{width}}  {human_size(self.total):>9}  (hardlinked files counted once)")
        return rows

    def to_json(self) -> dict:
        return {
            "root": str(self.root),
            "total": self.total,
            "parts": [{**dataclasses.asdict(p), "path": str(p.path)} for p in self.parts],
        }


def usage(cache: Cache) -> Usage:
    """The size of each part of the cache (and of the download store, wherever $CARRY_DOWNLOADS puts it)."""
    meter = Meter()
    store = Store.from_env(cache.root).root
    parts, named = [], set()
    for name, relative, what in PARTS:
        path = store if relative is None else cache.root / relative
        named.add(path)
        if path.exists():
            size, files = meter.size(path, name)
            parts.append(Part(name, path, size, files, _count(path), what))
    if cache.root.is_dir():
        for entry in sorted(cache.root.iterdir()):
            if entry not in named:
                size, files = meter.size(entry, entry.name)
                parts.append(Part(entry.name, entry, size, files, _count(entry), "other"))
    shared = meter.shared()
    return Usage(cache.root, tuple(dataclasses.replace(p, shared=shared.get(p.name, 0)) for p in parts))


def _count(path: Path) -> int:
    try:
        return sum(1 for _ in os.scandir(path)) if path.is_dir() else 1
    except OSError:
        return 0


# --- what configs need -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Needed:
    """Names (per part) of the entries some config needs."""

    mirrors: set[str] = dataclasses.field(default_factory=set)
    bundles: set[str] = dataclasses.field(default_factory=set)
    builds: set[str] = dataclasses.field(default_factory=set)
    envs: set[str] = dataclasses.field(default_factory=set)
    trees: set[str] = dataclasses.field(default_factory=set)
    downloads: set[str] = dataclasses.field(default_factory=set)  # sha256 hex
    wheelhouses: set[str] = dataclasses.field(default_factory=set)
    notes: list[str] = dataclasses.field(default_factory=list)


def needed(cache: Cache, config_paths: Iterable[Path]) -> Needed:
    from carry import config as configuration

    found = Needed()
    for path in config_paths:
        _needs_of(cache, configuration.load(Path(path)), found)
    return found


def _needs_of(cache: Cache, config: Config, found: Needed) -> None:
    from carry.image.locked import runtimelock
    from carry.source import apply, git, series
    from carry.wheelbuild import buildenv

    mirror = cache.mirror(config.upstream.url)
    found.mirrors.add(mirror.name)
    found.bundles.add(cache.bundle(config.upstream.commit).name)
    found.builds.update({mirror.name.removesuffix(".git"), f"tree-{mirror.name}"})
    found.wheelhouses.update(t.platform.tag for t in config.image.platforms)
    settings = config.build.precompiled
    if settings is not None:
        found.downloads.update(w.pinned.sha256 for w in settings.wheels)
    releases = config.root / "releases.yaml"
    if releases.is_file():
        from carry.source import releases as released

        found.downloads.update(r.pinned.sha256 for r in released.load(releases))
    if config.image.lock is not None:
        for target in config.image.platforms:
            try:
                locked = runtimelock.read(config, target.platform)
            except BadInput:
                continue
            found.downloads.update(h.removeprefix("sha256:") for p in locked.packages for h in p.hashes)
    if not (mirror / "HEAD").exists() or not git.has_commit(mirror, config.upstream.commit):
        found.notes.append(
            f"{config.path}: its mirror does not hold the pin yet: no wheel or environment of it is known to keep"
        )
        return
    report = apply.check(mirror, config.upstream.commit, series.load(config.patches_dir), cache.scratch)
    if report.tree is None:
        found.notes.append(f"{config.path}: the series does not apply: no wheel or environment of it is kept")
        return
    found.trees.add(report.tree)
    if not config.build.build_isolation:
        spec = buildenv.EnvSpec.resolve(buildenv.requires_of_tree(mirror, report.tree), config.build.environment)
        found.envs.add(buildenv.env_dir(cache.root, spec).name)


# --- prune ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Removal:
    part: str
    path: Path
    bytes: int
    skipped: str | None = None  # why it was left (in use)


@dataclasses.dataclass(frozen=True)
class Pruned:
    removed: tuple[Removal, ...]
    dry_run: bool
    notes: tuple[str, ...]
    kept: int

    @property
    def freed(self) -> int:
        return sum(r.bytes for r in self.removed if r.skipped is None)

    def lines(self) -> list[str]:
        verb = "would remove" if self.dry_run else "removed"
        rows = [f"note: {note}" for note in self.notes]
        for removal in self.removed:
            if removal.skipped:
                rows.append(f"skipped {removal.part}: {removal.path} ({removal.skipped})")
            else:
                rows.append(f"{verb} {removal.part}: {removal.path} ({human_size(removal.bytes)})")
        done = [r for r in self.removed if r.skipped is None]
        skipped = len(self.removed) - len(done)
        rows.append(
            f"{verb} {len(done)} entr{'y' if len(done) == 1 else 'ies'}, {human_size(self.freed)} "
            f"{'to free' if self.dry_run else 'freed'}; kept {self.kept} that a config needs"
            + (f"; {skipped} in use, skipped" if skipped else "")
        )
        return rows


@dataclasses.dataclass(frozen=True)
class Candidate:
    part: str
    path: Path
    locks: tuple[str, ...]  # the cache locks that guard it
    busy: str | None = None  # a reason it is in use without a lock to take


def candidates(cache: Cache, keep: Needed) -> tuple[list[Candidate], int]:
    """Every entry no config needs, with the locks that guard it; and how many entries are kept."""
    found: list[Candidate] = []
    kept = 0

    def entries(directory: Path) -> list[Path]:
        return sorted(p for p in directory.iterdir() if not p.name.startswith(".")) if directory.is_dir() else []

    kept_keys = {path.name for path in entries(cache.artifacts) if _artifact_tree(path) in keep.trees}

    def log_owner(name: str) -> tuple[str, ...] | None:
        return _log_owner(name, kept_keys, keep.envs, keep.trees)

    kept_logs = {path.name for path in entries(cache.logs) if log_owner(path.name) is None}
    # kind, directory, the names kept, the locks that guard an entry of that name
    by_name: list[tuple[str, Path, set[str], Callable[[str], tuple[str, ...]]]] = [
        ("mirror", cache.root / "mirrors", keep.mirrors, lambda name: (name, f"build-{name}", f"tree-{name}")),
        ("bundle", cache.root / "bundles", keep.bundles, lambda name: ()),
        (
            "build dir",
            cache.builds,
            keep.builds,
            lambda name: (name if name.startswith("tree-") else f"build-{name}.git",),
        ),
        # a build holds its build dir's lock, not its environment's: none may run while an environment goes
        ("environment", cache.root / "envs", keep.envs, lambda name: (f"env-{name}", "build-*")),
        ("wheel", cache.artifacts, kept_keys, lambda name: (f"wheel-{name}",)),
        ("download", Store.from_env(cache.root).root, keep.downloads, lambda name: ()),
        ("wheelhouse", cache.root / "wheelhouse", keep.wheelhouses, lambda name: ()),
        ("log", cache.logs, kept_logs, lambda name: log_owner(name) or ()),
    ]
    for kind, directory, kept_names, guards in by_name:
        for path in entries(directory):
            if kind == "download" and path.name == "checked":
                continue
            if path.name in kept_names:
                kept += 1
            else:
                busy = _downloading(path) if kind == "download" else None
                found.append(Candidate(kind, path, guards(path.name), busy))
    return found, kept


def _artifact_tree(directory: Path) -> str | None:
    """The patched tree a cached wheel was built from (its carry-buildinfo.json)."""
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        return None
    try:
        with zipfile.ZipFile(wheels[0]) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/carry-buildinfo.json"))
            return json.loads(archive.read(name)).get("tree")
    except (OSError, StopIteration, ValueError, zipfile.BadZipFile, KeyError):
        return None


def _downloading(directory: Path) -> str | None:
    now = time.time()
    for part in directory.glob("*.part"):
        with contextlib.suppress(OSError):
            if now - part.stat().st_mtime < PART_FRESH_S:
                return f"a download is in progress ({part.name})"
    return None


LOG_WHEEL_RE = re.compile(r"^wheel-([0-9a-f]{16})\.log$")
LOG_ENV_RE = re.compile(r"^env-([0-9a-f]{32})\.log$")
LOG_TREE_RE = re.compile(r"^(?:image|wheel-[a-z0-9-]+)-([0-9a-f]{12})\.log$")


def _log_owner(name: str, keys: set[str], envs: set[str], trees: set[str]) -> tuple[str, ...] | None:
    """None when the log belongs to something kept; else the locks of what writes it (empty: none)."""
    wheel, env, tree = LOG_WHEEL_RE.match(name), LOG_ENV_RE.match(name), LOG_TREE_RE.match(name)
    if wheel:
        return None if any(key.startswith(wheel.group(1)) for key in keys) else (f"wheel-{wheel.group(1)}*",)
    if env:
        return None if env.group(1) in envs else (f"env-{env.group(1)}",)
    if tree:
        return None if any(t.startswith(tree.group(1)) for t in trees) else ()
    return ()


def _lock_files(cache: Cache, names: tuple[str, ...]) -> list[Path]:
    """The lock files of `names`; a name ending in * stands for every existing lock file it begins."""
    paths = []
    for name in names:
        if name.endswith("*"):
            prefix = cache.lock_path(name[:-1] + "_").name[: -len("_.lock")]
            directory = cache.root / "locks"
            if directory.is_dir():
                paths += sorted(p for p in directory.glob("*.lock") if p.name.startswith(prefix))
        else:
            paths.append(cache.lock_path(name))
    return paths


@contextlib.contextmanager
def _held(cache: Cache, names: tuple[str, ...]) -> Iterator[bool]:
    """Every lock of `names` taken without waiting; False when another process holds one."""
    import filelock

    taken = []
    try:
        for path in _lock_files(cache, names):
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = filelock.FileLock(str(path), timeout=0)
            try:
                lock.acquire()
            except filelock.Timeout:
                yield False
                return
            taken.append(lock)
        yield True
    finally:
        for lock in reversed(taken):
            lock.release()


def prune(cache: Cache, config_paths: Iterable[Path], dry_run: bool = False) -> Pruned:
    """Remove every entry no config in `config_paths` needs (see the module's doc); in-use entries are skipped."""
    keep = needed(cache, config_paths)
    found, kept = candidates(cache, keep)
    removed: list[Removal] = []
    for candidate in found:
        if candidate.busy:
            removed.append(Removal(candidate.part, candidate.path, 0, candidate.busy))
            continue
        with _held(cache, candidate.locks) as free:
            if not free:
                removed.append(Removal(candidate.part, candidate.path, 0, "in use: another carry holds its lock"))
                continue
            size = freed_by(candidate.path)
            trash = None if dry_run else _to_trash(candidate.path)
            if not dry_run and trash is None:
                continue
        if trash is not None:
            remove(trash)
        removed.append(Removal(candidate.part, candidate.path, size))
    if not dry_run:
        _sweep_tmp(cache)
        for directory in {c.path.parent for c in found}:
            sweep_dead(directory, TRASH_PREFIX)
    return Pruned(tuple(removed), dry_run, tuple(keep.notes), kept)


def _to_trash(path: Path) -> Path | None:
    """`path` renamed to a hidden name beside it (same filesystem, one rename); None when it is gone already."""
    trash = path.with_name(f"{owned_prefix(TRASH_PREFIX)}{path.name}")
    try:
        os.replace(path, trash)
    except FileNotFoundError:
        return None
    return trash


def _sweep_tmp(cache: Cache) -> None:
    """Temp dirs and files of carry processes that are gone (named `<prefix><pid>-…`, fsutil.owned_prefix)."""
    scratch = cache.scratch
    if not scratch.is_dir():
        return
    prefixes = {match.group(1) for entry in scratch.iterdir() if (match := re.match(r"^([^\d]*?)\d+-", entry.name))}
    for prefix in prefixes:
        sweep_dead(scratch, prefix)
