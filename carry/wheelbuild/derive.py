"""A precompiled build after a Python-only change, without running the upstream's build again (docs/builds.md,
"A Python-only change derives the wheel").

When the plan differs from an earlier PEP 517 build only in its tree (its `family`; across VERSIONs, its `lineage`)
and every file that differs between the two trees is one that wheel carries byte for byte (or a Python module added
to or removed from a package it ships), the new wheel is that wheel with those members replaced; else the upstream's
build runs, and the line says why. Only PEP 517 builds become bases. Limit: a file the build writes (not in the tree)
is carried over from the base: right for vLLM's vllm/_version.py, and one naming the base's commit stops the
derivation; a build writing files from the content of its Python sources would need its build every time.
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import json
import posixpath
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

from carry.binaries import wheelzip
from carry.binaries.buildinfo import FILENAME as BUILDINFO
from carry.source import git
from carry.util.cache import Cache
from carry.util.fsutil import atomic_write_text
from carry.wheelbuild import artifacts

PART = "derive"  # $CARRY_CACHE/derive/<family>.json: the last PEP 517 build of each family
MODES = ("100644", "100755")


@dataclasses.dataclass(frozen=True)
class Base:
    """An earlier build of the same family (or lineage): its tree, cache key and wheel; `source` names where it came
    from when it is not this machine's PEP 517 build, and `temporary` that the wheel is removed after the build."""

    tree: str
    key: str
    commit: str  # the commit of `tree` the build checked out (a generated file may name it)
    wheel: Path
    source: str = ""
    temporary: bool = False


# What a caller offers when this machine has no base: (the base, or None and why) for a plan's lineage.
Offer = Callable[[], "tuple[Base | None, str]"]


@dataclasses.dataclass(frozen=True)
class Derivation:
    """The base and the members to replace (path -> the new tree's bytes), or `reason` why not; across VERSIONs also
    `dist_info_as` (the new dist-info), `version` (the new wheel version), the members whose version was `rewritten`."""

    base: Base | None
    replaced: dict[str, bytes | None]
    reason: str = ""
    dist_info_as: str | None = None
    version: str = ""
    old_version: str = ""
    rewritten: tuple[str, ...] = ()

    @property
    def possible(self) -> bool:
        return self.base is not None and not self.reason

    def line(self) -> str:
        if self.base is None or not self.possible:
            return f"not derived: {self.reason}; the upstream's build runs"
        tree = {n: d for n, d in self.replaced.items() if n not in self.rewritten and ".dist-info/" not in n}
        names = ", ".join(sorted(tree)[:4]) + (", …" if len(tree) > 4 else "")
        origin = self.base.source or "the PEP 517 build"
        version = (
            f"; version {self.old_version} -> {self.version} (dist-info renamed, METADATA and "
            f"{len(self.rewritten)} written file(s) rewritten)"
            if self.dist_info_as
            else ""
        )
        return (
            f"from {origin} of tree {self.base.tree[:12]} ({self.base.key[:12]}): "
            f"{len(tree)} member(s) replaced ({names or 'none'}){version}, every other member as built"
        )


def remember(cache: Cache, family: str, tree: str, key: str, commit: str, lineage: str = "") -> None:
    """Record a PEP 517 build as the base of `family`'s next Python-only change (and of `lineage`'s: VERSION's)."""
    record = {"tree": tree, "key": key, "commit": commit}
    (cache.root / PART).mkdir(parents=True, exist_ok=True)
    atomic_write_text(cache.root / PART / f"{family}.json", json.dumps(record) + "\n")
    if lineage:
        atomic_write_text(cache.root / PART / f"lineage-{lineage}.json", json.dumps(record) + "\n")


def find(cache: Cache, family: str, lineage: str = "") -> Base | None:
    """This machine's base for `family`, else for `lineage` (another VERSION)."""
    for name in filter(None, (family, f"lineage-{lineage}" if lineage else "")):
        try:
            record = json.loads((cache.root / PART / f"{name}.json").read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not {"tree", "key", "commit"} <= set(record):
            continue
        directory = cache.artifacts / str(record.get("key"))
        wheels = sorted(directory.glob("*.whl")) if directory.is_dir() else []
        if len(wheels) == 1:
            return Base(record["tree"], record["key"], record["commit"], wheels[0])
    return None


def plan(
    cache: Cache,
    mirror: Path,
    family: str,
    tree: str,
    generated: tuple[str, ...],
    target: tuple[str, str] | None = None,
    offered: Offer | None = None,
) -> Derivation:
    """Whether the wheel of `tree` can be derived from a base, and what to replace. `target`: (lineage, VERSION) of
    the plan, for a base of another VERSION; `offered`: a base the caller can make when this machine has none."""
    lineage, version = target or ("", "")
    base = find(cache, family, lineage)
    why = "no earlier build of this precompiled wheel, environment and version"
    if base is None and offered is not None:
        base, why = offered()
    if base is None:
        return Derivation(None, {}, why)
    if not git.object_exists(mirror, base.tree):
        return Derivation(None, {}, f"the base's tree {base.tree[:12]} is not in the mirror")
    corrupt = None if base.temporary else artifacts.check(base.wheel)  # a made base was checked as it was made
    if corrupt is not None:
        artifacts.discard(cache, base.key)
        return Derivation(None, {}, f"the earlier build's wheel {corrupt.line('removed')}")
    status, out, err = git.run_status(mirror, "diff-tree", "-r", "-z", "--no-renames", base.tree, tree, strip=False)
    if status != 0:
        return Derivation(None, {}, f"git diff-tree {base.tree[:12]} {tree[:12]} failed: {err.strip()[:200]}")
    versioned: Derivation | None = None
    try:
        with zipfile.ZipFile(base.wheel) as archive:
            info = wheelzip.dist_info(archive)
            record = archive.read(f"{info}/RECORD").decode()
            stamped = json.loads(archive.read(f"{info}/{BUILDINFO}"))
            checked = stamped.get("tree_check") or {}
            written = (*checked.get("built", ()), *checked.get("generated", ()), *checked.get("ignored", ()))
            for name in written:
                data = archive.read(name) if name in archive.NameToInfo else b""
                if base.commit[:7].encode() in data or base.tree[:7].encode() in data:
                    return Derivation(base, {}, f"{name}, which the build writes, names the commit it was built from")
            if version and stamped.get("version") != version:
                versioned = _reversion(archive, info, stamped, version, written)
                if versioned.reason:
                    return dataclasses.replace(versioned, base=base)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        return Derivation(None, {}, f"the earlier build's wheel {base.wheel.name} cannot be read ({exc})")
    hashes = {row[0]: row[1] for row in csv.reader(record.splitlines()) if len(row) >= 2}
    replaced, why = _replacements(mirror, base.tree, tree, out, hashes, (*generated, *written))
    if why:
        return Derivation(base, {}, why)
    if versioned is not None:
        return dataclasses.replace(versioned, base=base, replaced={**versioned.replaced, **replaced})
    return Derivation(base, replaced)


def _reversion(
    archive: zipfile.ZipFile, info: str, stamped: dict, version: str, written: tuple[str, ...]
) -> Derivation:
    """The changes that make a base of another VERSION this VERSION's: the dist-info renamed, METADATA's Version
    line, and the old wheel version (and its local label) replaced by the new one in each file the build writes."""
    old_version, old = str(stamped.get("version")), str(stamped.get("wheel_version"))
    if old_version not in old:
        return Derivation(None, {}, f"the base's wheel version {old} does not name its VERSION {old_version}")
    new = old.replace(old_version, version)
    if old not in info:
        return Derivation(None, {}, f"the base's dist-info {info} does not name its version {old}")
    dist_info_as = info.replace(old, new)
    pairs = [(old, new)]
    if "+" in old:
        pairs.append((old.split("+", 1)[1], new.split("+", 1)[1]))
    leftover = re.compile(r"(?<!\d)" + r"\D{1,6}".join(map(re.escape, re.split(r"\D+", old_version))) + r"(?!\d)")
    changes: dict[str, bytes | None] = {}
    rewritten = []
    for name in written:
        data = archive.read(name) if name in archive.NameToInfo else b""
        updated = data
        for before, after in pairs:
            updated = updated.replace(before.encode(), after.encode())
        if leftover.search(updated.decode("utf-8", "replace")):
            return Derivation(
                None, {}, f"{name}, which the build writes, names VERSION {old_version} in a form carry cannot rewrite"
            )
        if updated != data:
            changes[name] = updated
            rewritten.append(name)
    for member in archive.namelist():
        if not member.startswith(info + "/") or member.endswith(("/RECORD", "/" + BUILDINFO)):
            continue
        data = archive.read(member)
        target = f"{dist_info_as}/{member[len(info) + 1 :]}"
        if member.endswith("/METADATA"):
            lines = data.decode().split("\n")
            at = [i for i, line in enumerate(lines) if line == f"Version: {old}"]
            if len(at) != 1:
                return Derivation(None, {}, f"{member} has no single `Version: {old}` line")
            lines[at[0]] = f"Version: {new}"
            changes[target] = "\n".join(lines).encode()
        elif old.encode() in data:
            return Derivation(None, {}, f"{member} names the version {old}")
    changes[f"{dist_info_as}/{BUILDINFO}"] = None
    return Derivation(None, changes, "", dist_info_as, new, old, tuple(rewritten))


def _replacements(
    mirror: Path, base_tree: str, tree: str, diff: str, hashes: dict[str, str], generated: tuple[str, ...]
) -> tuple[dict[str, bytes | None], str]:
    """The members to replace, add (bytes) or remove (None) for `diff` (git diff-tree -z of the base tree and `tree`),
    or why the upstream's build must run. `generated`: build.generated's globs and the base build's written paths."""
    replaced: dict[str, bytes | None] = {}
    packages: set[str] = set()  # the packages a module was added to or removed from
    fields = diff.split("\0")
    for meta, path in zip(fields[0::2], fields[1::2]):
        old_mode, new_mode, old_blob, new_blob, change = meta.lstrip(":").split()
        what = {"A": "added", "D": "removed"}.get(change)
        if what and any(fnmatch.fnmatchcase(path, glob) for glob in generated):
            return {}, f"{path} {what}, and the build writes it (build.generated)"
        if what:
            why = _module_change(mirror, base_tree, path, change, new_mode if change == "A" else old_mode, hashes)
            if why:
                return {}, why
            replaced[path] = _blob(mirror, new_blob) if change == "A" else None
            packages.add(posixpath.dirname(path))
            continue
        if why := _not_in_place(path, change, old_mode, new_mode, generated):
            return {}, why
        if hashes.get(path) != wheelzip.record_hash(_blob(mirror, old_blob)):
            return {}, f"{path} changed, and the wheel does not carry it as it is in the tree"
        replaced[path] = _blob(mirror, new_blob)
    members = {*hashes, *replaced} - {path for path, data in replaced.items() if data is None}
    if missing := _not_shipped(mirror, tree, packages, members):
        return {}, f"{missing} is in a package the wheel ships, but not in the wheel"
    return replaced, ""


def _module_change(mirror: Path, tree: str, path: str, change: str, mode: str, hashes: dict[str, str]) -> str:
    """Why a file added to or removed from the tree (`change` A or D) is not a module the wheel takes the same way, or
    '': a .py file (mode 644) in a base tree directory whose modules the wheel carries byte for byte (its __init__.py,
    else its first: the build ships that package's modules); a removed one the wheel carries as it was."""
    what = "added" if change == "A" else "removed"
    if not path.endswith(".py") or mode != "100644":
        return f"{path} {what} (only a Python module added or removed is derived)"
    directory = posixpath.dirname(path)
    status, listed, _ = git.run_status(mirror, "ls-tree", "-z", f"{tree}:{directory}", strip=False)
    if status != 0:
        return f"{path} {what}, in a directory the base tree does not have (a new package)"
    modules = {}
    for entry in filter(None, listed.split("\0")):
        meta, _, name = entry.partition("\t")
        if name.endswith(".py") and meta.split()[:2] == ["100644", "blob"]:
            modules[f"{directory}/{name}" if directory else name] = meta.split()[2]
    shown = sorted(modules, key=lambda m: (not m.endswith("/__init__.py"), m))
    carried = [m for m in shown[:1] if m != path and hashes.get(m) == wheelzip.record_hash(_blob(mirror, modules[m]))]
    if not carried:
        return f"{path} {what}, in a directory whose modules the wheel does not carry as they are in the tree"
    if change == "D" and hashes.get(path) != wheelzip.record_hash(_blob(mirror, modules.get(path, ""))):
        return f"{path} removed, and the wheel does not carry it as it was in the tree"
    return ""


def _not_shipped(mirror: Path, tree: str, packages: set[str], members: set[str]) -> str:
    """The first module of `packages` in `tree` that `members` (the derived wheel's) lacks, or ''."""
    for directory in sorted(packages):
        status, listed, _ = git.run_status(mirror, "ls-tree", "-z", "--name-only", f"{tree}:{directory}", strip=False)
        for name in sorted(filter(None, listed.split("\0"))) if status == 0 else ():
            module = f"{directory}/{name}" if directory else name
            if name.endswith(".py") and module not in members:
                return module
    return ""


def _not_in_place(path: str, change: str, old_mode: str, new_mode: str, generated: tuple[str, ...]) -> str:
    if change != "M":
        return f"{path} {'added' if change == 'A' else 'removed' if change == 'D' else 'changed in kind'}"
    if old_mode != new_mode or new_mode not in MODES:
        return f"{path} changed mode ({old_mode} -> {new_mode})"
    if any(fnmatch.fnmatchcase(path, glob) for glob in generated):
        return f"{path} changed, and the build writes it (build.generated)"
    return ""


def _blob(mirror: Path, sha: str) -> bytes:
    return git.run(mirror, "cat-file", "blob", sha, strip=False).encode("utf-8", errors="surrogateescape")


def write(derivation: Derivation, dest: Path) -> Path:
    """The base wheel with the members replaced and its buildinfo dropped (the finish stamps a new one), at
    `dest` (a directory) under the base wheel's name (with the new version, across VERSIONs)."""
    assert derivation.base is not None
    name = derivation.base.wheel.name
    if derivation.dist_info_as:
        name = name.replace(derivation.old_version, derivation.version, 1)
    wheel = dest / name
    with zipfile.ZipFile(derivation.base.wheel) as archive:
        buildinfo = f"{wheelzip.dist_info(archive)}/{BUILDINFO}"
    wheelzip.rewrite(derivation.base.wheel, wheel, {buildinfo: None, **derivation.replaced}, derivation.dist_info_as)
    return wheel
