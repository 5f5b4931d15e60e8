"""A precompiled build after a Python-only change, without running the upstream's build again.

In precompiled mode the upstream's build does not compile: it copies the package files of the tree and the
compiled members of the precompiled wheel into a wheel (vLLM: about 70 s a platform here, most of it deflating
840 MB). When the plan differs from an earlier PEP 517 build only in its tree (same precompiled wheel, build
environment, version, arches, toolchain: the plan's `family`), and every file that differs between the two trees
is a file that wheel carries byte for byte from its tree (same path, same mode, changed in place), the new wheel
is that wheel with those members replaced: every other member keeps its compressed bytes. Anything else (a file
added, removed or renamed, a build file, a file the wheel does not carry as it is in the tree, a file the build
writes) and the upstream's build runs; the line says why.

The finish is the same for both: the tree check proves every file of the wheel against the new tree and the
precompiled wheel, and the gate runs. Only PEP 517 builds become bases, so a derived wheel is always one real
build plus the files a series changed.

Limit: a file the upstream's build writes (not in the tree) is carried over from the base. That is right for what
vLLM's build writes (vllm/_version.py, from VERSION, which is in the family), and a written file naming the base's
commit stops the derivation; a build that writes files from the content of its Python sources would need the
upstream's build every time.
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import json
import zipfile
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
    """An earlier PEP 517 build of the same family: its tree, cache key and stored wheel."""

    tree: str
    key: str
    commit: str  # the commit of `tree` the build checked out (a generated file may name it)
    wheel: Path


@dataclasses.dataclass(frozen=True)
class Derivation:
    """The base and the members to replace (path -> the new tree's bytes); `reason` says why not, when empty."""

    base: Base | None
    replaced: dict[str, bytes]
    reason: str = ""

    @property
    def possible(self) -> bool:
        return self.base is not None and not self.reason

    def line(self) -> str:
        if self.base is None or not self.possible:
            return f"not derived: {self.reason}; the upstream's build runs"
        names = ", ".join(sorted(self.replaced)[:4]) + (", …" if len(self.replaced) > 4 else "")
        return (
            f"from the PEP 517 build of tree {self.base.tree[:12]} ({self.base.key[:12]}): "
            f"{len(self.replaced)} member(s) replaced ({names or 'none'}), every other member as built"
        )


def remember(cache: Cache, family: str, tree: str, key: str, commit: str) -> None:
    """Record a PEP 517 build of `family` as the base of the next Python-only change."""
    record = {"tree": tree, "key": key, "commit": commit}
    (cache.root / PART).mkdir(parents=True, exist_ok=True)
    atomic_write_text(cache.root / PART / f"{family}.json", json.dumps(record) + "\n")


def find(cache: Cache, family: str) -> Base | None:
    try:
        record = json.loads((cache.root / PART / f"{family}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not {"tree", "key", "commit"} <= set(record):
        return None
    directory = cache.artifacts / str(record.get("key"))
    wheels = sorted(directory.glob("*.whl")) if directory.is_dir() else []
    return Base(record["tree"], record["key"], record["commit"], wheels[0]) if len(wheels) == 1 else None


def plan(cache: Cache, mirror: Path, family: str, tree: str, generated: tuple[str, ...]) -> Derivation:
    """Whether the wheel of `tree` can be derived from the family's base, and what to replace."""
    base = find(cache, family)
    if base is None:
        return Derivation(None, {}, "no earlier build of this precompiled wheel, environment and version")
    corrupt = artifacts.check(base.wheel)
    if corrupt is not None:
        artifacts.discard(cache, base.key)
        return Derivation(None, {}, f"the earlier build's wheel {corrupt.line('removed')}")
    status, out, err = git.run_status(mirror, "diff-tree", "-r", "-z", "--no-renames", base.tree, tree, strip=False)
    if status != 0:
        return Derivation(None, {}, f"git diff-tree {base.tree[:12]} {tree[:12]} failed: {err.strip()[:200]}")
    try:
        with zipfile.ZipFile(base.wheel) as archive:
            info = wheelzip.dist_info(archive)
            record = archive.read(f"{info}/RECORD").decode()
            checked = json.loads(archive.read(f"{info}/{BUILDINFO}")).get("tree_check") or {}
            for name in (*checked.get("built", ()), *checked.get("generated", ()), *checked.get("ignored", ())):
                data = archive.read(name) if name in archive.NameToInfo else b""
                if base.commit[:7].encode() in data or base.tree[:7].encode() in data:
                    return Derivation(base, {}, f"{name}, which the build writes, names the commit it was built from")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        return Derivation(None, {}, f"the earlier build's wheel {base.wheel.name} cannot be read ({exc})")
    hashes = {row[0]: row[1] for row in csv.reader(record.splitlines()) if len(row) >= 2}
    replaced: dict[str, bytes] = {}
    fields = out.split("\0")
    for meta, path in zip(fields[0::2], fields[1::2]):
        old_mode, new_mode, old_blob, new_blob, change = meta.lstrip(":").split()
        why = _not_in_place(path, change, old_mode, new_mode, generated)
        if why:
            return Derivation(base, {}, why)
        old = _blob(mirror, old_blob)
        if hashes.get(path) != wheelzip.record_hash(old):
            return Derivation(base, {}, f"{path} changed, and the wheel does not carry it as it is in the tree")
        replaced[path] = _blob(mirror, new_blob)
    return Derivation(base, replaced)


def _not_in_place(path: str, change: str, old_mode: str, new_mode: str, generated: tuple[str, ...]) -> str:
    if change != "M":
        return f"{path} {'added' if change == 'A' else 'removed' if change == 'D' else 'changed in kind'}"
    if old_mode != new_mode or new_mode not in MODES:
        return f"{path} changed mode ({old_mode} -> {new_mode})"
    if any(fnmatch.fnmatchcase(path, glob) for glob in generated):
        return f"{path} changed, and the build writes it (build.generated)"
    return ""


def _blob(mirror: Path, sha: str) -> bytes:
    text = git.run(mirror, "cat-file", "blob", sha, strip=False)
    return text.encode("utf-8", errors="surrogateescape")


def write(derivation: Derivation, dest: Path) -> Path:
    """The base wheel with the members replaced and its buildinfo dropped (the finish stamps a new one), at
    `dest` (a directory) under the base wheel's name."""
    assert derivation.base is not None
    wheel = dest / derivation.base.wheel.name
    with zipfile.ZipFile(derivation.base.wheel) as archive:
        buildinfo = f"{wheelzip.dist_info(archive)}/{BUILDINFO}"
    wheelzip.rewrite(derivation.base.wheel, wheel, {buildinfo: None, **derivation.replaced})
    return wheel
