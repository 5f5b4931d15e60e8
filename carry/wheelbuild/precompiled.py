"""Precompiled builds: the upstream's own mechanism (vLLM's VLLM_USE_PRECOMPILED) lifts the compiled code out of
an existing upstream wheel, and carry proves that right before any build work and after it (docs/builds.md).
Before: the pin's ref is the one the wheel's version names, the wheel is the pinned file with a sound RECORD, and the
compiled inputs (build.precompiled.inputs) are identical between that commit and the patched tree. After: the members
taken from it are byte-identical, and the built wheel has its Requires-Dist and its tags, not the build host's.
"""

from __future__ import annotations

import csv
import dataclasses
import email.parser
import json
import re
import zipfile
from pathlib import Path

from carry.binaries import wheelzip
from carry.binaries.sharedobjects import may_be_shared_object
from carry.config import Config
from carry.config.build import PrecompiledWheel
from carry.platforms import Platform
from carry.source import git, upstream
from carry.source.series import Series
from carry.util.cache import Cache
from carry.util.download import Store
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import atomic_write_text


class InputsDiffer(Failed):
    """The compiled inputs differ from the precompiled wheel's source: its binaries do not fit this tree."""


NIGHTLY_RE = re.compile(r"(?:^|[.+])g([0-9a-f]{7,40})(?:\.|$)")
HEX_RE = re.compile(r"^[0-9a-f]{7,40}$")


@dataclasses.dataclass(frozen=True)
class Claim:
    """What the pinned wheel's own version says it was built from, and the ref that is then resolved: a nightly's
    commit (prefix), a release's tags, or nothing (a ref given and taken at its word)."""

    version: str
    ref: str
    commit: str | None = None  # the `+g<sha>` of a nightly
    tags: tuple[str, ...] = ()  # `vX.Y.Z`, `X.Y.Z` of a release

    def describe(self) -> str:
        if self.commit:
            return f"version {self.version} names commit {self.commit}"
        if self.tags:
            return f"version {self.version} is tag {self.tags[0]}"
        return f"ref {self.ref} taken as given (version {self.version} names no commit)"


def claim(wheel: PrecompiledWheel, where: str) -> Claim:
    """The pin's ref proven against the version the pin names before any fetch (bad input naming both if not)."""
    from packaging.version import InvalidVersion, Version

    version, ref, name = wheel.pinned.version or "", wheel.ref, wheel.pinned.name or wheel.pinned.requirement
    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None
    nightly = NIGHTLY_RE.search(parsed.local or "") if parsed else None
    if nightly:
        sha = nightly.group(1)
        if ref and HEX_RE.match(ref) and not (ref.startswith(sha) or sha.startswith(ref)):
            raise BadInput(
                f"{where}: the wheel {name} is version {version}, built from commit {sha}, but ref is "
                f"{ref}; pin the wheel built from {ref}, or set ref: {sha}"
            )
        return Claim(version, ref or sha, commit=sha)
    if parsed is not None and not parsed.is_devrelease:
        tags = (f"v{parsed.public}", parsed.public)
        if ref and not HEX_RE.match(ref) and ref.removeprefix("refs/tags/") not in tags:
            raise BadInput(
                f"{where}: the wheel {name} is version {version}, built from the tag {tags[0]}, but ref "
                f"is {ref}; pin the wheel of {ref}, or set ref: {tags[0]}"
            )
        return Claim(version, ref or tags[0], tags=tags)
    if not ref:
        raise BadInput(
            f"{where}: the wheel {name} is version {version}, which does not say which commit it was built "
            f"from (no release, no +g<sha>); set ref to that commit (it is then taken as given)"
        )
    return Claim(version, ref)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A precompiled build resolved and proven: the checked wheel, the commit it was built from, what it holds."""

    wheel: PrecompiledWheel
    path: Path
    ref: str
    commit: str
    tags: tuple[str, ...]
    members: dict[str, str]  # installed path -> RECORD hash, for every member that is not metadata
    requires_dist: tuple[str, ...]
    env: dict[str, str]
    clear: tuple[str, ...]
    inputs: tuple[str, ...]
    proof: str = ""  # how the ref was proven against the wheel's own version

    @property
    def shared_objects(self) -> tuple[str, ...]:
        return tuple(sorted(path for path in self.members if may_be_shared_object(path)))

    @property
    def platform(self) -> Platform:
        return self.wheel.platform

    def line(self) -> str:
        """What was proven before the build."""
        commit = f" ({self.commit[:12]})" if self.commit != self.ref else ""
        return (
            f"{len(self.shared_objects)} shared objects from {self.path.name} "
            f"(sha256 {self.wheel.pinned.sha256[:8]}…), compiled inputs identical to {self.ref}{commit}"
            + (f"; {self.proof}" if self.proof else "")
        )

    def key(self) -> dict:
        """What the build takes from the precompiled wheel, independent of where the file lies."""
        return {
            "sha256": self.wheel.pinned.sha256,
            "platform": str(self.platform),
            "commit": self.commit,
            "env": {name: value.replace(str(self.path), "{wheel}") for name, value in self.env.items()},
            "clear": list(self.clear),
            "inputs": list(self.inputs),
        }

    def to_json(self) -> dict:
        return {
            "wheel": self.path.name,
            "sha256": self.wheel.pinned.sha256,
            "platform": str(self.platform),
            "ref": self.ref,
            "commit": self.commit,
            "ref_proof": self.proof,
            "tags": list(self.tags),
            "inputs": list(self.inputs),
            "requires_dist": list(self.requires_dist),
            "members": dict(sorted(self.members.items())),
        }


@dataclasses.dataclass(frozen=True)
class Pin:
    """A precompiled wheel checked before any work: the pinned file (sha256), for the platform, its RECORD sound."""

    wheel: PrecompiledWheel
    path: Path
    tags: tuple[str, ...]
    requires_dist: tuple[str, ...]
    members: dict[str, str]
    claim: Claim


def pin(config: Config, cache: Cache, platform: Platform) -> Pin | None:
    """The checked precompiled wheel for `platform` (None when build.precompiled has none): downloaded once into the
    store, its sha256 the pinned one and its tags this platform's (else bad input), every member as RECORD says."""
    settings = config.build.precompiled
    chosen = settings.wheel_for(platform) if settings else None
    if chosen is None and settings is not None and settings.nightly is not None:
        raise BadInput(
            f"{config.path}: build.precompiled.wheels has no pin for {platform}: run `carry pin` (it finds them "
            f"through build.precompiled.nightly), or build from source (wheel --from-source)"
        )
    if chosen is None:
        return None
    where = f"{config.path}: build.precompiled.wheels.{platform}"
    claimed = claim(chosen, where)
    path = Store.from_env(cache.root).get(chosen.pinned)
    tags, requires, members, version = _read(path)
    if Platform.from_wheel_tag(tags[0].rsplit("-", 1)[-1]) is not platform:
        raise BadInput(f"{where} is {path.name}, tagged {tags[0]}: not a wheel for {platform}")
    if not _same_version(version, claimed.version):
        raise BadInput(
            f"{where}: {path.name}'s METADATA says Version {version}, not the pinned {claimed.version}; "
            f"pin the file by its own version"
        )
    _check_record_once(cache, chosen, path)
    return Pin(chosen, path, tags, requires, members, claimed)


def _same_version(one: str, other: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(one) == Version(other)
    except InvalidVersion:
        return one == other


def prove(config: Config, cache: Cache, mirror: Path, checked: Pin, tree: str, series: Series) -> Plan:
    """The plan of a precompiled build of `tree`, once the compiled inputs are proven identical between the commit
    the wheel was built from and `tree`; else exit 1 naming the files (InputsDiffer)."""
    settings = config.build.precompiled
    assert settings is not None  # a Pin comes from build.precompiled (pin)
    ref = checked.claim.ref
    commit = _commit(config, cache, mirror, ref)
    _prove_ref(config, cache, mirror, checked, commit)
    inputs = tuple(g.glob for g in settings.inputs)
    if changed := git.changed_paths(mirror, commit, tree, inputs):
        raise InputsDiffer(_inputs_differ(changed, ref, series))
    env = {name: value.replace("{wheel}", str(checked.path)) for name, value in settings.env.items()}
    return Plan(
        checked.wheel,
        checked.path,
        ref,
        commit,
        checked.tags,
        checked.members,
        checked.requires_dist,
        env,
        settings.clear,
        inputs,
        checked.claim.describe(),
    )


def _prove_ref(config: Config, cache: Cache, mirror: Path, checked: Pin, commit: str) -> None:
    """The resolved ref is the commit the wheel's version names: a nightly's `+g<sha>`, a release's tag."""
    claimed, where = checked.claim, f"{config.path}: build.precompiled.wheels.{checked.wheel.platform}"
    if claimed.commit and not commit.startswith(claimed.commit):
        raise BadInput(
            f"{where}: the wheel {checked.path.name} is version {claimed.version}, built from commit "
            f"{claimed.commit}, but ref {claimed.ref} is {commit[:12]}; pin the wheel built from "
            f"{claimed.ref}, or set ref: {claimed.commit}"
        )
    if claimed.tags and claimed.ref not in (*claimed.tags, *(f"refs/tags/{t}" for t in claimed.tags)):
        tagged = _tag_commit(config, cache, mirror, claimed.tags)
        if tagged != commit:
            raise BadInput(
                f"{where}: the wheel {checked.path.name} is version {claimed.version}, built from the tag "
                f"{claimed.tags[0]} ({tagged[:12] if tagged else 'not in the upstream'}), but ref is "
                f"{claimed.ref}; pin the wheel of {claimed.ref}, or set ref: {claimed.tags[0]}"
            )


def _tag_commit(config: Config, cache: Cache, mirror: Path, tags: tuple[str, ...]) -> str | None:
    for tag in tags:
        if found := git.resolve(mirror, f"refs/tags/{tag}^{{commit}}"):
            return found
    for tag in tags:
        try:
            return _commit(config, cache, mirror, tag)
        except (BadInput, Failed):
            continue
    return None


def _read(wheel: Path) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str], str]:
    """The wheel's tags, Requires-Dist, RECORD hashes and Version, read without inflating its code."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = wheelzip.dist_info(archive)
            wheel_file = archive.read(f"{info}/WHEEL").decode()
            metadata = email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode())
            record = archive.read(f"{info}/RECORD").decode()
    except (OSError, KeyError, Failed, zipfile.BadZipFile) as exc:
        raise BadInput(f"{wheel}: not a readable wheel ({exc}); check build.precompiled") from None
    tags = file_name_tags(wheel.name) or wheelzip.tags_of(wheel_file)
    rows = ((row + ["", ""])[:2] for row in csv.reader(record.splitlines()))
    members = {
        name: digest for name, digest in rows if digest and not name.split("/", 1)[0].endswith((".dist-info", ".data"))
    }
    return tags, tuple(metadata.get_all("Requires-Dist") or ()), members, str(metadata.get("Version", ""))


def file_name_tags(name: str) -> tuple[str, ...]:
    """The tags a wheel's file name gives (what pip and PyPI go by; a wheel renamed to manylinux may still say
    `linux_x86_64` in its WHEEL file), compressed sets expanded: `cp38-abi3-manylinux_2_28_x86_64`."""
    parts = name.removesuffix(".whl").split("-")
    if len(parts) < 5:
        return ()
    pythons, abis, platforms = parts[-3:]
    return tuple(f"{p}-{a}-{f}" for p in pythons.split(".") for a in abis.split(".") for f in platforms.split("."))


def _check_record_once(cache: Cache, chosen: PrecompiledWheel, path: Path) -> None:
    """Every member of the precompiled wheel matches its RECORD (checked once per sha256, remembered)."""
    memo = cache.root / "precompiled" / f"{chosen.pinned.sha256}.record-ok"
    if memo.exists():
        return
    try:
        with zipfile.ZipFile(path) as archive:
            checked = wheelzip.check_record(path, archive, unhashed_ok=True)
    except (OSError, zipfile.BadZipFile, Failed) as exc:
        raise Failed(f"{path.name}: {exc}; the precompiled wheel is corrupt") from None
    memo.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(memo, json.dumps({"wheel": path.name, "members": checked}) + "\n")


def _commit(config: Config, cache: Cache, mirror: Path, ref: str) -> str:
    for candidate in (ref, f"refs/tags/{ref}"):
        if found := git.resolve(mirror, candidate):
            return found
    return upstream.resolve_ref(config, cache, ref)


def _inputs_differ(changed: list[str], ref: str, series: Series) -> str:
    by_patch = {path: patch.name for patch in series.patches for path in patch.files}
    shown = ", ".join(f"{path} ({by_patch[path]})" if path in by_patch else path for path in changed[:10])
    more = f" and {len(changed) - 10} more" if len(changed) > 10 else ""
    return (
        f"precompiled: the compiled inputs differ from {ref}, which the precompiled wheel was built from: "
        f"{shown}{more}; the wheel's binaries were not built from them: build from source "
        f"(wheel --from-source), or pin a precompiled wheel built from this code"
    )


def metadata_problems(wheel: Path, requires_dist: tuple[str, ...], source: str) -> list[str]:
    """The built wheel's Requires-Dist must be the precompiled wheel's own (its CUDA build's), never a CPU torch."""
    _, requires, _, _ = _read(wheel)
    problems = []
    if sorted(requires) != sorted(requires_dist):
        ours, theirs = set(requires), set(requires_dist)
        detail = "; ".join([*(f"+ {r}" for r in sorted(ours - theirs)), *(f"- {r}" for r in sorted(theirs - ours))])
        problems.append(f"Requires-Dist differs from {source}'s ({detail[:600]})")
    if cpu := [r for r in requires if re.match(r"^torch\b", r) and "+cpu" in r]:
        problems.append(f"Requires-Dist asks for a CPU torch: {', '.join(cpu)}")
    return problems
