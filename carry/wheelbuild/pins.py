"""`carry pin`: the precompiled wheels found, never guessed, and written into build.yaml (docs/builds.md,
"Finding the pins"). Each platform's wheel is that of C (the merge-base of the commit and upstream.main) on the
per-commit index, else of the nearest commit on main's first-parent history with the patched tree's compiled inputs;
downloaded, hashed (trust on first use: the index gives no hash), proven from its own version, and written in place.
A pinned file whose sha256 changed on the server is refused: tampering or a re-upload, never an update.
"""

from __future__ import annotations

import copy
import dataclasses
import email.parser
import itertools
import json
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import yaml

from carry.config import Config
from carry.config.build import PrecompiledWheel
from carry.platforms import Platform
from carry.source import apply, git, series, upstream, upstreamversion
from carry.util import reporter
from carry.util.cache import Cache
from carry.util.download import Store
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import atomic_write_text, temp_dir
from carry.wheelbuild import nightly

FIELDS = ("requirement", "index", "sha256", "ref")
SHOWN = 10  # refused commits named one by one in a failure (runs of the same reason are joined)


@dataclasses.dataclass(frozen=True)
class Refused:
    commit: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Found:
    """A platform's wheel on the index: the commit it was found at (C, or `len(refused)` commits before it on main's
    first-parent history), the commits refused on the way, and the pin's index as build.yaml writes it."""

    platform: Platform
    commit: str
    base: str
    refused: tuple[Refused, ...]
    entry: nightly.Entry
    index: str
    variant: str
    named: str  # what its version names: `commit 1a2b3c4d5`, or `tag v0.33.0` (a release built at a tagged commit)
    alias: bool = False  # a wheel without a variant suffix on an explicit variant's page: its alias of the default

    @property
    def requirement(self) -> str:
        return f"{self.entry.project}=={self.entry.version}"

    def walk(self) -> str:
        """Where the walk went, in words."""
        if self.commit == self.base:
            return f"at C {self.commit[:12]} (the merge-base of upstream.commit and main)"
        return (
            f"at {self.commit[:12]}, {len(self.refused)} commit(s) back from C {self.base[:12]} along main "
            f"({summary(self.refused)}); its compiled inputs are the patched tree's"
        )


@dataclasses.dataclass(frozen=True)
class Discovery:
    """What the index holds for a commit now: its merge-base C and each platform's wheel."""

    commit: str
    base: str
    found: tuple[Found, ...]


@dataclasses.dataclass(frozen=True)
class Fetched:
    """A found wheel downloaded, hashed and proven; and the pin build.yaml held for its platform before."""

    found: Found
    path: Path
    sha256: str
    proof: str
    before: PrecompiledWheel | None

    @property
    def platform(self) -> Platform:
        return self.found.platform

    def fields(self) -> dict[str, str]:
        return dict(zip(FIELDS, (self.found.requirement, self.found.index, self.sha256, self.found.commit)))

    @property
    def unchanged(self) -> bool:
        before = self.before
        pinned = (before.pinned.requirement, before.pinned.index, before.pinned.sha256, before.ref) if before else None
        return pinned == tuple(self.fields().values())

    @property
    def tampered(self) -> bool:
        """The same file (requirement: name, version naming the commit, and platform) with another sha256."""
        before = self.before
        return (
            before is not None
            and before.pinned.requirement == self.found.requirement
            and before.pinned.sha256 != self.sha256
        )

    def _state(self) -> str:
        if self.unchanged:
            return "unchanged: the sha256 build.yaml pins"
        if self.before is None:
            return "new pin: trust on first use"
        was = self.before.pinned.requirement or self.before.pinned.name
        return f"moved from {was} (ref {self.before.ref or 'from its version'}): trust on first use"

    def line(self) -> str:
        alias = f"; listed under {self.found.variant}, the default variant's alias" if self.found.alias else ""
        return (
            f"{self.platform}: {self.found.requirement} {self.found.walk()}; variant {self.found.variant}{alias}; "
            f"{self.proof}; sha256 {self.sha256[:12]} ({self._state()})"
        )

    def refusal(self) -> str:
        assert self.before is not None  # refused only when tampered: a pin of the same file is in build.yaml
        return (
            f"{self.platform}: {self.found.entry.filename} of commit {self.found.commit[:12]} is on the index with "
            f"sha256 {self.sha256}, but build.yaml pins that very file with sha256 {self.before.pinned.sha256}: it "
            f"changed on the server (tampering, or a re-upload), which is never an update; nothing was written: ask "
            f"the index's owner why, and only then remove the pin and run `carry pin` again"
        )

    def stale(self) -> str | None:
        """None when build.yaml pins exactly this; else why not (for `pin --check`)."""
        if self.unchanged:
            return None
        now = f"discovery finds {self.found.requirement} at {self.found.commit[:12]} (sha256 {self.sha256[:12]})"
        if self.before is None:  # (never tampered: that needs a pin)
            return f"{self.platform}: stale: build.yaml has no pin; {now}; run `carry pin` and commit build.yaml"
        if self.tampered:
            return (
                f"{self.platform}: stale: {self.found.entry.filename} changed on the server: sha256 {self.sha256}, "
                f"pinned {self.before.pinned.sha256}: tampering or a re-upload, never an update"
            )
        before = self.before.pinned
        return (
            f"{self.platform}: stale: build.yaml pins {before.requirement or before.name} (index {before.index}, "
            f"ref {self.before.ref}, sha256 {before.sha256[:12]}); {now}; run `carry pin` and commit build.yaml"
        )


@dataclasses.dataclass(frozen=True)
class Pinned:
    """What `pin` found, fetched and (unless checking) wrote."""

    discovery: Discovery
    fetched: tuple[Fetched, ...]
    written: bool

    @property
    def fresh(self) -> bool:
        return all(f.stale() is None for f in self.fetched)

    def lines(self, path: Path) -> list[str]:
        done = f"wrote build.precompiled.wheels in {path}" if self.written else f"{path}: pins unchanged"
        return [*(f.line() for f in self.fetched), done]

    def check_lines(self) -> list[str]:
        return [f.stale() or f"{f.platform}: fresh" for f in self.fetched]


def pin(
    config: Config, cache: Cache, mirror: Path, tree: str, check: bool = False, commit: str | None = None
) -> Pinned:
    """Discover (for `commit`, default upstream.commit, whose patched tree is `tree`), download and prove each
    platform's wheel; then, unless `check`, write the pins (refusing a file whose sha256 changed on the server)."""
    found = discover(config, cache, mirror, commit or config.upstream.commit, tree)
    fetched = fetch(config, cache, found, refuse_changed=not check)
    # The notes on what was fetched: wheels of several commits, and trust on first use of a new sha256.
    if len({f.found.commit for f in fetched}) > 1:
        where = ", ".join(f"{f.platform} at {f.found.commit[:12]}" for f in fetched)
        reporter.note(
            f"the platforms' wheels come from different commits ({where}); each is proven against the patched "
            f"tree when it is built (compiled inputs identical, then the tree check)"
        )
    if any(not f.unchanged for f in fetched):
        reporter.note(
            "trust on first use: the index gives no hashes, so each new sha256 is that of the file downloaded "
            "now; every later download is checked against it (the download store, pip's hash-checking mode)"
        )
    written = not check and write(config.path, {f.platform: f.fields() for f in fetched})
    return Pinned(found, fetched, written)


def repin(config: Config, cache: Cache, new_commit: str, tree: str | None = None) -> None:
    """What every command that moves upstream.commit runs first (given build.precompiled.nightly): `pin` for
    `new_commit` (patched tree `tree`, else the series applied), each line a note; failing, the pin must not move."""
    settings = config.build.precompiled
    if settings is None or settings.nightly is None:
        return
    mirror = upstream.mirror_for(config, cache)
    if tree is None:
        report = apply.check(mirror, new_commit, series.load(config.patches_dir), cache.scratch)
        if report.tree is None:
            raise Failed(
                f"the series does not apply on {new_commit[:12]}, so the precompiled pins cannot follow the pin "
                f"there; nothing was changed: see `check --against {new_commit}`"
            )
        tree = report.tree
    result = pin(config, cache, mirror, tree, commit=new_commit)
    for line in result.lines(config.path):
        reporter.note(line)


def follow_release(config: Config, cache: Cache, ref: str) -> list[str]:
    """build.precompiled.wheels pinned to a release (`vllm==0.32.0`) moved to the one REF names, as pip picks each
    (trusted on first use): a line per platform; nothing written when REF names no version or a wheel is missing."""
    from carry.util import index, integrity

    settings = config.build.precompiled
    found = re.fullmatch(r"v?(\d+(?:\.\d+)*(?:\.post\d+)?)", ref.removeprefix("refs/tags/"))
    wheels = [w for w in settings.wheels if w.pinned.project] if settings else []
    if found is None or not wheels:
        return [f"not moved: {ref} names no release version for build.precompiled.wheels' requirements"]
    store = Store.from_env(cache.root)
    pins, said = {}, []
    for wheel in wheels:
        requirement = f"{wheel.pinned.project}=={found.group(1)}"
        if requirement == wheel.pinned.requirement and wheel.ref == ref:
            said.append(f"{wheel.platform}: {requirement} already")
            continue
        with temp_dir(store.root, ".pip-") as scratch:  # on the store's filesystem, for adopt's rename
            got = index.download_wheel(requirement, None, wheel.platform, wheel.pinned.index, scratch, str(ref))
            sha = integrity.file_sha256(got)
            kept = store.adopt(got, got.name, sha)
        pins[wheel.platform] = {"requirement": requirement, "sha256": sha, "ref": ref}
        if wheel.pinned.index:  # the index it was pinned from stays named
            pins[wheel.platform]["index"] = wheel.pinned.index
        said.append(f"{wheel.platform}: {wheel.pinned.requirement} -> {requirement} ({kept.name}, sha256 {sha[:12]})")
    if pins:
        write(config.path, pins)
    return said


# --- discovery ---------------------------------------------------------------------------------------------------


def discover(config: Config, cache: Cache, mirror: Path, commit: str, tree: str) -> Discovery:
    """Each platform's wheel for `commit` (patched tree `tree`): C's, else the nearest on main's first-parent history
    with the tree's compiled inputs; Failed naming every platform without one, the variant and each commit refused."""
    index = nightly.Index.of(config)
    main = upstream.resolve_ref(config, cache, config.upstream.main)
    base, unknown = upstream.merge_base(config, cache, mirror, commit, main)
    if base is None:
        raise Failed(
            f"upstream.commit {commit[:12]} and {config.upstream.main} {main[:12]} have no merge base "
            f"({unknown or 'unrelated histories'}); the precompiled wheels are found at their merge-base"
        )
    history = upstream.first_parents(config, cache, mirror, base, index.max_walk)
    project = _project(mirror, tree)
    settings = config.build.precompiled
    assert settings is not None  # Index.of above refuses a config without build.precompiled.nightly
    inputs = tuple(g.glob for g in settings.inputs)
    wanted = tuple(target.platform for target in config.image.platforms) or (Platform.native(),)  # else this CPU's
    refused: dict[Platform, list[Refused]] = {platform: [] for platform in wanted}
    found: dict[Platform, Found] = {}
    tags: dict[str, tuple[str, str | None]] = {}

    def tagged(release: str) -> tuple[str, str | None]:
        """(the tag a release's version names, the commit it is upstream, None when it is not there)."""
        if release not in tags:
            tags[release] = (f"v{release}", None)
            for name in (f"v{release}", release):
                try:
                    tags[release] = (name, upstream.resolve_ref(config, cache, f"refs/tags/{name}"))
                    break
                except BadInput:
                    continue
        return tags[release]

    for candidate in history:
        pending = [platform for platform in wanted if platform not in found]
        if not pending:
            break
        if changed := git.changed_paths(mirror, candidate, tree, inputs):
            differ = f"inputs differ at {changed[0]}" + (f" and {len(changed) - 1} more" if len(changed) > 1 else "")
            for platform in pending:
                refused[platform].append(Refused(candidate, differ))
            continue
        listing = index.listing(candidate, project)
        for platform in pending:
            entry = listing.wheel_for(project, platform) if listing is not None else None
            if entry is None:
                refused[platform].append(
                    Refused(candidate, _missing(index, listing, project, platform, candidate, base))
                )
                continue
            named, reason = _names(entry, candidate, index.variant, tagged)
            if reason:
                refused[platform].append(Refused(candidate, reason))
                continue
            root = index.root(candidate, written=True)
            alias = index.variant is not None and entry.names()[1] is None
            found[platform] = Found(
                platform, candidate, base, tuple(refused[platform]), entry, root, index.variant_name, named, alias=alias
            )
    _require_every(wanted, found, refused, index, base, len(history))
    for each in found.values():
        index.check_page(each.commit, each.entry)
    return Discovery(commit, base, tuple(found[platform] for platform in wanted))


def _require_every(
    wanted: tuple[Platform, ...],
    found: dict[Platform, Found],
    refused: dict[Platform, list[Refused]],
    index: nightly.Index,
    base: str,
    walked: int,
) -> None:
    """Failed, one clause per set of reasons, unless every wanted platform has its wheel."""
    missing: dict[tuple[Refused, ...], list[Platform]] = {}  # platforms refused for the same reasons: one clause
    for platform in (p for p in wanted if p not in found):
        missing.setdefault(tuple(refused[platform]), []).append(platform)
    end = "" if walked >= index.max_walk else ", where the history ends"
    clauses = [
        f"{', '.join(map(str, platforms))} (variant {index.variant_name}): no precompiled wheel in {len(why)} "
        f"commit(s) of main's first-parent history from C {base[:12]} (max_walk {index.max_walk}{end}): "
        f"{summary(why)}; nothing was written, and no other variant's or platform's wheel is taken: pin again "
        f"once the index has one, or build from source (wheel --from-source)"
        for why, platforms in missing.items()
    ]
    if clauses:
        raise Failed("; ".join(clauses))


def _project(mirror: Path, tree: str) -> str:
    """The upstream's distribution name, from the patched tree's pyproject.toml ([project] name)."""
    name = upstreamversion.pyproject(mirror, tree).get("project", {}).get("name")
    if not name:
        raise BadInput("the upstream's pyproject.toml has no [project] name; `carry pin` looks its wheels up by it")
    return str(name)


def _missing(
    index: nightly.Index, listing: nightly.Listing | None, project: str, platform: Platform, commit: str, base: str
) -> str:
    """Why a commit has no wheel of the project for the platform."""
    if listing is None:
        has = index.has(commit) if commit == base else None  # what C has instead, named once
        instead = f"; C's index has: {', '.join(has)}" if has else ""
        return f"no {index.variant_name} wheels (404{instead})"
    others = sorted({str(e.platform or e.platform_tag) for e in listing.wheels_of(project)})
    return f"no {platform} wheel (its {index.variant_name} page lists {', '.join(others) or 'none'})"


def _names(
    entry: nightly.Entry, commit: str, variant: str | None, tagged: Callable[[str], tuple[str, str | None]]
) -> tuple[str, str | None]:
    """(what the listed wheel's version names, why it is not this commit's wheel of this variant, or None): a nightly
    names its commit (`+g<sha>`), a release (built at a tagged commit) a tag, which must be this commit."""
    named, suffix = entry.names()
    if suffix is not None and suffix != (variant or "").lower():
        return "", f"lists {entry.filename}, a wheel of variant {suffix}, on the {variant or 'default'} variant's page"
    if named is not None:
        if commit.startswith(named):
            return f"commit {named}", None
        return "", f"lists {entry.filename}, whose version names commit {named}, not this one"
    release = entry.release()
    if release is None:
        return "", f"lists {entry.filename}, whose version names no commit (+g<sha>) and no release"
    tag, tagged_commit = tagged(release)
    if tagged_commit == commit:
        return f"tag {tag}", None
    where = f"commit {tagged_commit[:12]}" if tagged_commit else "not upstream"
    return "", f"lists {entry.filename}, the release {release}, whose tag {tag} is {where}, not this commit"


def summary(refused: tuple[Refused, ...] | list[Refused]) -> str:
    """The commits refused with why, runs of the same reason joined (`a..b (3 commits): no cu130 wheels`)."""
    parts = []
    for reason, run in itertools.groupby(refused, key=lambda each: each.reason):
        commits = [each.commit[:12] for each in run]
        span = commits[0] if len(commits) == 1 else f"{commits[0]}..{commits[-1]} ({len(commits)} commits)"
        parts.append(f"{span}: {reason}")
    if len(parts) > SHOWN:
        parts = [*parts[: SHOWN - 1], f"… {len(parts) - SHOWN + 1} more run(s)"]
    return "; ".join(parts)


# --- download and proof ------------------------------------------------------------------------------------------


def fetch(config: Config, cache: Cache, discovery: Discovery, refuse_changed: bool = True) -> tuple[Fetched, ...]:
    """Each found wheel downloaded into the store at once (one failing stops the others, keeping nothing) and hashed;
    a file whose sha256 changed since it was pinned is refused first (`refuse_changed`), then its commit proven."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    store = Store.from_env(cache.root)
    settings = config.build.precompiled
    stop = threading.Event()

    def one(found: Found) -> Fetched:
        try:
            path, sha = nightly.download(found.entry, store, stop)
            before = settings.wheel_for(found.platform) if settings is not None else None
            fetched = Fetched(found, path, sha, "", before)
            if refuse_changed and fetched.tampered:
                raise Failed(fetched.refusal())
            return dataclasses.replace(fetched, proof=_prove(found, path))
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(len(discovery.found) or 1) as pool:
        futures = [pool.submit(reporter.carried(one), found) for found in discovery.found]
    failed = [exc for f in futures if (exc := f.exception()) is not None]
    if failed:
        raise next((e for e in failed if not isinstance(e, nightly.Stopped)), failed[0])
    return tuple(future.result() for future in futures)


def _prove(found: Found, path: Path) -> str:
    """The wheel names the commit it was found at: its METADATA's version is the file name's, that version's
    `+g<sha>` is the commit's, and its tags are the platform's."""
    from packaging.version import InvalidVersion, Version

    from carry.binaries import wheelzip

    try:
        with zipfile.ZipFile(path) as archive:
            info = wheelzip.dist_info(archive)
            metadata = archive.read(f"{info}/METADATA").decode()
            tags = wheelzip.tags_of(archive.read(f"{info}/WHEEL").decode())
    except (OSError, KeyError, UnicodeDecodeError, zipfile.BadZipFile, Failed) as exc:
        raise Failed(f"{found.entry.filename}: not a readable wheel ({exc}); nothing was written") from None
    version = str(email.parser.Parser().parsestr(metadata, headersonly=True).get("Version", ""))
    try:
        same = Version(version) == Version(found.entry.version)
    except InvalidVersion:
        same = False
    if not same:
        raise Failed(
            f"{found.entry.filename}: its METADATA says Version {version!r}, not the file name's "
            f"{found.entry.version}; nothing was written"
        )
    machines = {Platform.from_wheel_tag(tag.rsplit("-", 1)[-1]) for tag in tags}
    if machines != {found.platform}:
        raise Failed(f"{found.entry.filename}: its WHEEL tags {', '.join(tags)} are not {found.platform}'s")
    said = "names" if found.named.startswith("commit") else "is"
    return f"version {version} {said} {found.named} = {found.commit[:12]}"


# --- build.yaml, edited in place ---------------------------------------------------------------------------------


def write(path: Path, pins: dict[Platform, dict[str, str]]) -> bool:
    """build.precompiled.wheels.<platform> set to `pins` in `path`, every other byte kept; False when it says that
    already. The new text must read back as the old data with exactly these pins, or nothing is written."""
    text = path.read_text()
    new = render(text, pins, path)
    if new == text:
        return False
    expected = copy.deepcopy(yaml.safe_load(text))
    precompiled = expected["build"]["precompiled"]
    wheels = precompiled.get("wheels") or {}
    for platform, fields in pins.items():
        for key in [k for k in wheels if _platform(k) is platform]:
            del wheels[key]
        wheels[str(platform)] = dict(fields)
    precompiled["wheels"] = wheels
    try:
        again = yaml.safe_load(new)
    except yaml.YAMLError as exc:
        again = exc
    if again != expected:
        raise Failed(f"{path}: writing the pins in place would change more than build.precompiled.wheels; nothing "
                     f"was written: write build.precompiled as a plain block mapping")  # fmt: skip
    atomic_write_text(path, new)
    return True


def render(text: str, pins: dict[Platform, dict[str, str]], path: Path) -> str:
    """`text` with the pins written into build.precompiled.wheels (see `write`)."""
    build = _pair(yaml.compose(text), "build")
    held = _pair(build[1] if build else None, "precompiled")  # (its key, its value)
    if held is None or not isinstance(held[1], yaml.MappingNode) or held[1].flow_style or not held[1].value:
        raise BadInput(f"{path}: build.precompiled must be a block mapping for `carry pin` to write its wheels into")
    named, precompiled = held
    indent = precompiled.value[0][0].start_mark.column
    step = max(2, indent - named.start_mark.column)
    edits: list[tuple[int, int, str]] = []
    pair = _pair(precompiled, "wheels")
    if pair is None:
        lines = [" " * indent + "wheels:", *_entries(pins, indent + step, step)]
        at = _line_end(text, _end(precompiled))
        edits.append((at, at, "\n" + "\n".join(lines)))
    else:
        key, value = pair
        if _empty(value):
            at = _line_end(text, max(key.end_mark.index, value.end_mark.index))
            start = value.start_mark.index
            while start > key.end_mark.index + 1 and text[start - 1] == " ":
                start -= 1
            edits.append((start, value.end_mark.index, ""))
            edits.append((at, at, "\n" + "\n".join(_entries(pins, indent + step, step))))
        elif isinstance(value, yaml.MappingNode) and not value.flow_style:
            column = value.value[0][0].start_mark.column
            added = {}
            for platform, fields in pins.items():
                entry = next(((k, v) for k, v in value.value if _platform(k.value) is platform), None)
                if entry is None:
                    added[platform] = fields
                else:
                    edits += _edit_entry(text, entry[1], fields, column + step)
            if added:
                at = _line_end(text, _end(value))
                edits.append((at, at, "\n" + "\n".join(_entries(added, column, step))))
        else:
            raise BadInput(f"{path}: build.precompiled.wheels must be a mapping of platform to its pin")
    for start, end, replacement in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _edit_entry(text: str, node: yaml.Node, fields: dict[str, str], indent: int) -> list[tuple[int, int, str]]:
    """The edits that make one platform's entry say `fields`: its scalars replaced in place (comments kept) when it
    is a block mapping of these keys; else the whole entry rewritten."""
    if isinstance(node, yaml.MappingNode) and not node.flow_style and node.value:
        keys = {k.value for k, _ in node.value}
        if keys <= set(FIELDS) and all(isinstance(v, yaml.ScalarNode) for _, v in node.value):
            edits = []
            column = node.value[0][0].start_mark.column
            values = {name.value: value for name, value in node.value}
            for name, value in values.items():
                if value.value != fields[name]:
                    edits.append((value.start_mark.index, value.end_mark.index, _scalar(fields[name])))
            after: dict[int, str] = {}  # a missing key goes after the one before it in FIELDS, else first
            for position, name in enumerate(FIELDS):
                if name in values or name not in fields:
                    continue
                before = next((values[n] for n in reversed(FIELDS[:position]) if n in values), None)
                line = f"{' ' * column}{name}: {_scalar(fields[name])}"
                if before is None:
                    at = text.rfind("\n", 0, node.start_mark.index) + 1
                    after[at] = after.get(at, "") + line + "\n"
                else:
                    at = _line_end(text, _end(before))
                    after[at] = after.get(at, "") + "\n" + line
            return edits + [(at, at, added) for at, added in after.items()]
        lines = [f"{' ' * indent}{name}: {_scalar(fields[name])}" for name in FIELDS]
        return [(node.start_mark.index, _end(node), "\n".join(lines).lstrip(" "))]
    flow = ", ".join(f"{name}: {_scalar(fields[name])}" for name in FIELDS)
    return [(node.start_mark.index, _end(node), f"{{{flow}}}")]


def _entries(pins: dict[Platform, dict[str, str]], indent: int, step: int) -> list[str]:
    lines = []
    for platform, fields in pins.items():
        lines.append(f"{' ' * indent}{platform}:")
        lines += [f"{' ' * (indent + step)}{name}: {_scalar(fields[name])}" for name in FIELDS]
    return lines


def _scalar(value: str) -> str:
    """A YAML scalar that reads back as `value`: plain where that is safe, else double-quoted."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:+=@%-]*", value) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)


def _platform(key: object) -> Platform | None:
    try:
        return Platform.parse(str(key), "build.precompiled.wheels")
    except BadInput:
        return None


def _pair(node: yaml.Node | None, name: str) -> tuple[yaml.Node, yaml.Node] | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    return next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == name), None)


def _empty(node: yaml.Node) -> bool:
    if isinstance(node, yaml.ScalarNode):
        return node.tag.endswith(":null")
    return isinstance(node, yaml.MappingNode) and not node.value


def _end(node: yaml.Node) -> int:
    """Where a node's text ends: its last scalar's (a block's own end mark lies past the comments after it)."""
    if isinstance(node, yaml.ScalarNode) or getattr(node, "flow_style", False):
        return node.end_mark.index
    if isinstance(node, yaml.MappingNode) and node.value:
        key, value = node.value[-1]
        return max(_end(key), _end(value))
    if isinstance(node, yaml.SequenceNode) and node.value:
        return _end(node.value[-1])
    return node.end_mark.index


def _line_end(text: str, at: int) -> int:
    """The end of the line `at` is on (before its newline), past any comment there."""
    if at > 0 and text[at - 1] == "\n":
        return at - 1
    found = text.find("\n", at)
    return len(text) if found < 0 else found
