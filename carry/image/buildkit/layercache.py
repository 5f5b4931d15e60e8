"""BuildKit's layer cache for `image --cache-from/--cache-to`: the grammar of a cache spec, the refs it names per
platform, and the build's flags with buildx or Docker's own BuildKit.

- `inline` (any BuildKit): the cache metadata rides in this VERSION's platform image itself. It records the final
  stage only (mode=min), but a runtime stage that hits in full never needs the build stage: nothing compiles.
- `registry` (buildx): every stage's layers (mode=max) at `<name>:<VERSION>-<arch>-buildcache`.
- `type=...` (buildx): a BuildKit cache spec as given, or a ref; both may hold `{arch}` and `{version}`.
The build stage's inputs include VERSION: the layer cache serves rebuilds of one VERSION, the compile cache
(build.remote_cache) a new one."""

from __future__ import annotations

import dataclasses
import enum
import re
import string

from carry.platforms import Platform
from carry.util.errors import BadInput

FIELDS = ("arch", "version")
BUILDCACHE_SUFFIX = "-buildcache"
INLINE_CACHE_ARG = "BUILDKIT_INLINE_CACHE"
SPEC_TYPES = ("registry", "inline", "local", "gha", "s3", "azblob")
# An image reference: [host[:port]/]path[:tag][@digest], lower-case path components.
REF_RE = re.compile(
    r"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
SPEC_ITEM_RE = re.compile(r"[a-z-]+=[^,\s]+")


class CacheMode(enum.Enum):
    """Where carry keeps the layer cache itself; the parser owns the grammar of --cache-from/--cache-to."""

    INLINE = "inline"
    REGISTRY = "registry"


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """One --cache-from or --cache-to value: a mode carry fills in, or the user's own ref / BuildKit spec."""

    mode: CacheMode | None
    text: str = ""  # the ref or `type=...` spec, when mode is None
    exporting: bool = False

    @classmethod
    def parse(cls, text: str, exporting: bool) -> CacheSpec:
        flag = "--cache-to" if exporting else "--cache-from"
        allowed = "inline, registry, type=registry,ref=REF,mode=max (any BuildKit cache spec)" + (
            "" if exporting else " or an image ref"
        )
        value = text.strip()
        if value in {mode.value for mode in CacheMode}:
            return cls(CacheMode(value), exporting=exporting)
        _check_fields(value, flag)
        sample = _fill(value, "amd64", "1")
        if value.startswith("type="):
            _check_spec(sample, flag, text)
        elif exporting or not REF_RE.fullmatch(sample):
            raise BadInput(f"{flag} {text!r} is not a cache spec; use {allowed}")
        return cls(None, value, exporting)

    @property
    def is_spec(self) -> bool:
        return self.mode is None and self.text.startswith("type=")

    @property
    def needs_buildx(self) -> bool:
        """Docker's own BuildKit imports image refs and exports only the inline cache."""
        return self.is_spec or (self.exporting and self.mode is CacheMode.REGISTRY)

    def writes_one_place(self) -> bool:
        """An export spec without `{arch}`: several platforms' builds would overwrite each other's cache."""
        return self.exporting and self.is_spec and "{arch}" not in self.text and self.text != "type=inline"

    def __str__(self) -> str:
        return self.mode.value if self.mode is not None else self.text


def _check_fields(value: str, flag: str) -> None:
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
    except ValueError as exc:
        raise BadInput(f"{flag} {value!r}: {exc}; only {{arch}} and {{version}} may be filled in") from None
    unknown = sorted(set(names) - set(FIELDS))
    if unknown:
        raise BadInput(
            f"{flag} {value!r}: unknown field {{{unknown[0]}}}; only {{arch}} and {{version}} may be filled in"
        )


def _check_spec(spec: str, flag: str, text: str) -> None:
    items = spec.split(",")
    bad = next((item for item in items if not SPEC_ITEM_RE.fullmatch(item)), None)
    if bad is not None:
        raise BadInput(f"{flag} {text!r}: {bad!r} is not KEY=VALUE; write type=TYPE,KEY=VALUE,...")
    pairs = dict(item.split("=", 1) for item in items)
    kind = pairs["type"]
    if kind not in SPEC_TYPES:
        raise BadInput(f"{flag} {text!r}: unknown cache type {kind!r}; use one of: {', '.join(SPEC_TYPES)}")
    if pairs.get("mode", "min") not in ("min", "max"):
        raise BadInput(f"{flag} {text!r}: mode must be min or max")
    if kind == "registry" and not REF_RE.fullmatch(pairs.get("ref", "")):
        raise BadInput(f"{flag} {text!r}: type=registry needs ref=REGISTRY/NAME:TAG")


def _fill(text: str, arch: str, version: str) -> str:
    return text.format(arch=arch, version=version)


def buildcache_ref(image_name: str, version: str, platform: Platform) -> str:
    """Where `registry` mode keeps one platform's cache manifest: `<name>:<VERSION>-<arch>-buildcache`."""
    return f"{image_name}:{version}-{platform.tag}{BUILDCACHE_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class CacheFlags:
    """One platform build's cache flags: `docker build` arguments and build args."""

    args: tuple[str, ...] = ()
    build_args: tuple[tuple[str, str], ...] = ()
    sources: tuple[str, ...] = ()  # the refs imported from, for the notes after the build


def flags(
    specs: tuple[CacheSpec, ...], buildx: bool, image_name: str, inline_ref: str, version: str, platform: Platform
) -> CacheFlags:
    """The flags of one platform's build; `inline_ref` is that platform's own image (where `inline` lives)."""
    args: list[str] = []
    build_args: list[tuple[str, str]] = []
    sources: list[str] = []
    for spec in specs:
        flag = "--cache-to" if spec.exporting else "--cache-from"
        if spec.mode is CacheMode.INLINE and spec.exporting:
            if buildx:
                args += [flag, "type=inline"]
            else:
                build_args.append((INLINE_CACHE_ARG, "1"))
            continue
        if spec.mode is None:
            value = _fill(spec.text, platform.tag, version)
            ref = value if not spec.is_spec else dict(i.split("=", 1) for i in value.split(",")).get("ref", "")
        else:
            ref = inline_ref if spec.mode is CacheMode.INLINE else buildcache_ref(image_name, version, platform)
            value = f"type=registry,ref={ref}" if buildx else ref
            if spec.exporting:
                value += ",mode=max"
        args += [flag, value]
        if not spec.exporting and ref:
            sources.append(ref)
    return CacheFlags(tuple(args), tuple(build_args), tuple(sources))


def check(specs: tuple[CacheSpec, ...], buildx: bool, docker: str, platforms: int) -> None:
    """Before any work: what this engine cannot do, and exports that several platforms would share."""
    for spec in specs:
        flag = "--cache-to" if spec.exporting else "--cache-from"
        if spec.needs_buildx and not buildx:
            hint = "--cache-to inline (and --cache-from inline on the next build)" if spec.exporting else "an image ref"
            raise BadInput(f"{flag} {spec} needs buildx, which {docker} lacks; use {hint}, or install docker-buildx")
        if platforms > 1 and spec.writes_one_place():
            raise BadInput(
                f"{flag} {spec} would hold {platforms} platforms' caches in one place; put {{arch}} "
                f"in it (e.g. ref=REG/NAME:buildcache-{{arch}})"
            )


def outcome(log_text: str, sources: tuple[str, ...]) -> list[str]:
    """What the layer cache did in one build, from BuildKit's plain progress: imports that failed, and whether
    the build stage's `build.py wheel` step (`python -m carry ... wheel`) ran or came from the cache."""
    notes = []
    for ref in sources:
        step = re.search(rf"^(#\d+) importing cache manifest from {re.escape(ref)}\s*$", log_text, re.M)
        failed = step and re.search(rf"^{step.group(1)} ERROR: (.*)$", log_text, re.M)
        if failed:
            notes.append(f"cache {ref} not used: {failed.group(1).strip()[:160]}")
    run = re.search(r"^(#\d+) \[(?:\S+ )?build \d+/\d+\] RUN .*(?:build\.py|-m carry)", log_text, re.M)
    if run is not None:
        cached = re.search(rf"^{run.group(1)} CACHED$", log_text, re.M)
        notes.append("build stage: cached, nothing compiled" if cached else "build stage: ran build.py wheel")
    return notes
