"""build.yaml, read once with YAML's safe loader and resolved into frozen records (carry/util/record.py)."""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import yaml

from carry.arch import ArchList
from carry.util.errors import BadInput
from carry.util.record import field as record_field
from carry.util.record import record

if TYPE_CHECKING:
    from collections.abc import Callable

    from carry.platforms import Platform
    from carry.util.pinned import Pinned

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SCP_LIKE_RE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^:]")
ALLOWED_SCHEMES = ("https", "ssh", "git", "file")
DEFAULT_IMAGE_TAGS = ("{version}",)
TAG_FIELDS = ("version", "base_short", "cuda", "series_short")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# libyaml's safe loader where PyYAML was built with it (its wheels are): the same documents, a tenth of the time
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# image.runtime_python: how a runtime image without python3 gets one (carry.image.locked.runtimebase).
RUNTIME_PYTHON_METHODS = ("apt",)
RUNTIME_PYTHON_VALUES = ("auto", *RUNTIME_PYTHON_METHODS, "off")


class CompilerCache(enum.Enum):
    """The compiler launcher wired into the upstream build; `auto` takes ccache, else sccache, else none."""

    AUTO = "auto"
    CCACHE = "ccache"
    SCCACHE = "sccache"
    NONE = "none"

    @classmethod
    def parse(cls, text: str, where: str) -> CompilerCache:
        try:
            return cls(text)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise BadInput(f"{where}: unknown compiler cache {text!r}; use one of: {allowed}") from None


class RemoteScheme(enum.Enum):
    """A shared compile-cache backend, by URL scheme; `launchers` are the compiler caches that can use it."""

    REDIS = "redis"
    REDISS = "rediss"
    HTTP = "http"
    HTTPS = "https"
    S3 = "s3"
    GHA = "gha"

    @property
    def launchers(self) -> tuple[CompilerCache, ...]:
        # ccache 4.7 speaks redis and plain http; sccache also TLS, S3 and the GitHub Actions cache.
        if self in (RemoteScheme.REDIS, RemoteScheme.HTTP):
            return (CompilerCache.CCACHE, CompilerCache.SCCACHE)
        return (CompilerCache.SCCACHE,)


def _without_secrets(url: str) -> str:
    """A URL for an error message: scheme, host and path only; no user, password, query or fragment."""
    if not url.strip().partition("://")[2]:
        return "(not a URL)" if "@" in url or "?" in url else url.strip()
    from carry.util import redact

    return redact.address(url.strip())


REMOTE_FORMS = "redis://HOST[:PORT][/DB], rediss://…, http(s)://HOST[:PORT][/PATH], s3://BUCKET[/PREFIX] or gha"


@record
class RemoteCache:
    """`build.remote_cache`: where compiled objects are shared between machines. Never holds a credential:
    the password comes from $CARRY_REMOTE_CACHE_PASSWORD when the build runs."""

    scheme: RemoteScheme
    host: str  # the bucket for s3, empty for gha
    port: int | None = None
    db: int | None = None  # redis database number
    path: str = ""  # http path or s3 key prefix, without the leading '/'

    @classmethod
    def parse(cls, text: str, where: str) -> RemoteCache:
        if text.strip() == "gha":
            return cls(RemoteScheme.GHA, "")
        import urllib.parse

        shown = _without_secrets(text)
        try:
            parts = urllib.parse.urlsplit(text.strip())
            port = parts.port
        except ValueError as exc:
            raise BadInput(f"{where} {shown!r} is not a valid URL ({exc}); use {REMOTE_FORMS}") from None
        try:
            scheme = RemoteScheme(parts.scheme.lower())
        except ValueError:
            allowed = ", ".join(f"{m.value}://" if m is not RemoteScheme.GHA else "gha" for m in RemoteScheme)
            raise BadInput(f"{where} {shown!r}: unknown scheme {parts.scheme!r}; use one of {allowed}") from None
        if "@" in parts.netloc:
            raise BadInput(
                f"{where} {shown!r} must not hold credentials; put the password in $CARRY_REMOTE_CACHE_PASSWORD "
                f"(and a user in $CARRY_REMOTE_CACHE_USER)"
            )
        if not parts.hostname or parts.query or parts.fragment or re.search(r"\s", text.strip()):
            raise BadInput(f"{where} {shown!r} is not of the form {REMOTE_FORMS}")
        path = parts.path.strip("/")
        db = None
        if scheme in (RemoteScheme.REDIS, RemoteScheme.REDISS) and path:
            if not path.isdigit():
                raise BadInput(f"{where} {shown!r}: the redis database must be a number, e.g. redis://host:6379/0")
            db, path = int(path), ""
        if scheme is RemoteScheme.S3 and port is not None:
            raise BadInput(f"{where} {shown!r}: s3:// takes a bucket, not host:port; use s3://BUCKET[/PREFIX]")
        return cls(scheme, parts.hostname, port, db, path)

    def url(self, userinfo: str = "") -> str:
        """The backend's URL; `userinfo` (`user:password@`, quoted) goes only into a launcher's private config."""
        if self.scheme is RemoteScheme.GHA:
            return "gha"
        port = f":{self.port}" if self.port is not None else ""
        tail = f"/{self.db}" if self.db is not None else (f"/{self.path}" if self.path else "")
        return f"{self.scheme.value}://{userinfo}{self.host}{port}{tail}"

    def __str__(self) -> str:
        return self.url()

    def check_launcher(self, launcher: CompilerCache, where: str) -> None:
        """An explicit compiler cache that cannot use this backend is bad input."""
        if launcher in (CompilerCache.AUTO, *self.scheme.launchers):
            return
        if launcher is CompilerCache.NONE:
            raise BadInput(
                f"{where} {self} needs a compiler cache; set build.compiler_cache to auto, ccache or "
                f"sccache, or remove build.remote_cache"
            )
        usable = " or ".join(m.value for m in self.scheme.launchers)
        raise BadInput(
            f"{where} {self}: {launcher.value} cannot use {self.scheme.value} storage; "
            f"set build.compiler_cache to {usable}"
        )


@record
class Upstream:
    url: str
    pr: int | None
    commit: str
    main: str

    @property
    def pr_ref(self) -> str | None:
        return f"refs/pull/{self.pr}/head" if self.pr is not None else None


@record
class TestCommand:
    """One entry of build.tests: the argv to run, never through a shell, and the command as written; whether it
    needs a GPU, and whether it runs against the built wheel (a fresh venv) or in the patched source tree (nothing is
    built: for a test that reads the upstream's Python sources itself)."""

    __test__ = False  # not a pytest class
    argv: tuple[str, ...]
    text: str
    gpu: bool = True
    tree: bool = False

    def same_command(self, argv: tuple[str, ...]) -> bool:
        return tuple(argv) == self.argv


DEFAULT_KEEP = ("build/temp.*",)


@record
class Generated:
    """A glob of wheel paths the upstream's build writes (a version file, code copied from a dependency), with
    why; such files need not be in the patched tree, or may differ from it."""

    glob: str
    why: str


@record
class BuildEnvironment:
    """`build.environment`: what carry adds to the upstream's `[build-system] requires` when it makes the
    environment the upstream builds in (build_isolation: false; see carry/wheelbuild/buildenv.py). The index URLs may
    hold `user:password@`: they reach uv through its environment only and are never printed with it."""

    requires: tuple[str, ...] = ()  # PEP 508 requirements, installed with the upstream's own
    index_url: str | None = None  # replaces PyPI
    extra_index_urls: tuple[str, ...] = ()  # searched before index_url, in order (e.g. a torch index)


@record
class PrecompiledWheel:
    """One platform's upstream wheel to take the compiled code from: the file (by requirement from the package
    index, a path, or a URL) pinned by sha256, and the upstream ref or commit it was built from (None: read from
    its version)."""

    platform: Platform
    pinned: Pinned
    ref: str | None


@record
class Nightly:
    """build.precompiled.nightly: where `carry pin` finds the precompiled wheels. `index` is the root of a per-commit
    wheel index in vLLM's layout (`{index}/{commit}/[{variant}/]{project}/`), as written: it may hold `${NAME}`,
    taken from the environment when it is used (util/indexurl.expand); `variant` None reads the default variant's
    pages; `max_walk` is how many commits of main's first-parent history may be tried, the merge-base included."""

    index: str
    variant: str | None = None
    max_walk: int = 50


@record
class Precompiled:
    """build.precompiled: how the upstream takes compiled code from an existing wheel (the variables carry sets,
    `{wheel}` being the checked local file, and the prefixes of inherited ones it removes), which files are
    compiled inputs (each with why), the wheel per platform, and where `carry pin` finds those wheels (nightly;
    the wheels may then be missing until it ran)."""

    env: dict[str, str]
    clear: tuple[str, ...]
    inputs: tuple[Generated, ...]
    wheels: tuple[PrecompiledWheel, ...]
    nightly: Nightly | None = None

    def wheel_for(self, platform: Platform) -> PrecompiledWheel | None:
        return next((w for w in self.wheels if w.platform is platform), None)


@record
class Deselection:
    """One entry of build.upstream_tests.deselect: a test path (a file or directory, left out of collection) or a
    test id (`path::name`, a prefix of the ids it deselects), and why it cannot run here."""

    target: str
    why: str

    @property
    def is_id(self) -> bool:
        return "::" in self.target

    @property
    def path(self) -> str:
        return self.target.split("::", 1)[0]


@record
class UpstreamTests:
    """build.upstream_tests: the selection of the upstream's own test suite `suite` runs on the fixed wheel and on
    the wheel it is compared with (carry/gputest/upstreamsuite.py): test paths (relative to the tree's root), a
    pytest marker expression, deselections each with a reason, the test requirements installed beside the wheel's
    own, a per-test timeout, pytest-xdist workers (0: one process), variables for the run, and more paths of the
    tree the tests read (the top directory of each test path and the root's pytest config files come anyway)."""

    paths: tuple[str, ...]
    marker: str | None = None
    deselect: tuple[Deselection, ...] = ()
    requires: tuple[str, ...] = ()
    timeout: int = 300
    workers: int = 0
    env: dict[str, str] = record_field(default_factory=dict)
    checkout: tuple[str, ...] = ()

    def selection(self) -> dict:
        """What the results of a run depend on, besides the wheel, the environment and the test tree."""
        return {
            "paths": list(self.paths),
            "marker": self.marker,
            "deselect": {d.target: d.why for d in self.deselect},
            "timeout": self.timeout,
            "workers": self.workers,
            "env": dict(sorted(self.env.items())),
        }


@record
class Build:
    cuda_arches: ArchList | None  # None: not set; an empty list: no CUDA code expected
    env: dict[str, str]
    wheel_version: str | None  # None: the upstream's own version + carry.{version} (carry/source/upstreamversion.py)
    version_env: tuple[str, ...]
    build_isolation: bool
    compiler_cache: CompilerCache
    remote_cache: RemoteCache | None
    tests: tuple[TestCommand, ...] = ()
    # build.gate as written: shared objects built for some GPUs only, by the upstream's design; read into the gate's
    # rules where the policy is made (carry.binaries.gatepolicy.for_config), every error naming the entry
    gate: Any = None
    generated: tuple[Generated, ...] = ()  # files the build makes that the patched tree does not hold
    keep: tuple[str, ...] = DEFAULT_KEEP  # build-dir paths kept between builds (objects, never outputs)
    environment: BuildEnvironment = BuildEnvironment()
    precompiled: Precompiled | None = None  # None: every build compiles from source
    distribution: str | None = None  # the wheel's NAME; None: [project] name, else the built wheel's
    upstream_tests: UpstreamTests | None = None  # None: `suite` has no selection to run


@record
class PlatformTarget:
    """A platform to build for, with what it sets for itself (None: the build's and image's own settings)."""

    platform: Platform
    cuda_arches: ArchList | None = None
    base_image: str | None = None
    runtime_image: str | None = None
    runtime_python: str | None = None  # auto | apt | off (RUNTIME_PYTHON_VALUES); None: image.runtime_python


@record
class Image:
    name: str
    tags: tuple[str, ...]
    platforms: tuple[PlatformTarget, ...]
    base_image: str | None
    runtime_image: str | None
    build_args: dict[str, str]
    labels: dict[str, str]
    env: dict[str, str]
    secret_env: tuple[str, ...]
    docker: str
    lock: Path | None = None  # image.lock: the runtime lock's directory (beside build.yaml); None: not locked
    entrypoint: tuple[str, ...] | None = None  # image.entrypoint, exec form; None: the base's
    cmd: tuple[str, ...] | None = None  # image.cmd, exec form (may be empty); None: the base's
    runtime_python: str = "auto"  # a runtime image without python3: auto (derive one), apt (always), off (never)


@record
class Config:
    path: Path
    upstream: Upstream
    patches_dir: Path
    version_file: Path
    build: Build
    image: Image

    @property
    def root(self) -> Path:
        return self.path.parent

    def target(self, platform: Platform) -> PlatformTarget:
        """image.platforms' entry for `platform`, or one that sets nothing of its own."""
        return next((t for t in self.image.platforms if t.platform is platform), PlatformTarget(platform))

    def runtime_python(self, platform: Platform) -> str:
        """How `platform`'s runtime image gets its python3: its own image.platforms setting, else image's."""
        return self.target(platform).runtime_python or self.image.runtime_python

    def arches_for(self, platform: Platform | None) -> ArchList | None:
        """The CUDA arches a build for `platform` asks for: its own, else build.cuda_arches (None: not set)."""
        own = self.target(platform).cuda_arches if platform is not None else None
        return own if own is not None else self.build.cuda_arches

    def build_arches(self, given: ArchList | None, platform: Platform | None = None) -> ArchList:
        """The arches a build promises: `given` (--arch), else the platform's own cuda_arches, else
        build.cuda_arches; the empty list (`none`, `[]`) builds a wheel with no CUDA code."""
        if given is not None:
            return given
        configured = self.arches_for(platform)
        if configured is None:
            raise BadInput(
                f"{self.path}: build.cuda_arches is not set; set it (e.g. '9.0,12.1', or [] for a "
                f"Python-only wheel) or pass --arch"
            )
        return configured


class _Section:
    """Typed access to one mapping of build.yaml; every error names the key, the file and the form wanted."""

    def __init__(self, data: Any, prefix: str, path: Path, allowed: tuple[str, ...]):
        self.prefix = prefix
        self.path = path
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise BadInput(f"{path}: {prefix or 'the file'} must be a mapping of keys, got {type(data).__name__}")
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise BadInput(f"{path}: unknown key {self._key(unknown[0])}; allowed keys here: {', '.join(allowed)}")
        self.data = data

    def _key(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, key: str, form: str) -> BadInput:
        return BadInput(f"{self.path}: {self._key(key)} must be {form}, got {self.data.get(key)!r}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def section(self, key: str, allowed: tuple[str, ...]) -> _Section:
        return _Section(self.data.get(key), self._key(key), self.path, allowed)

    @overload
    def string(self, key: str, default: str) -> str: ...
    @overload
    def string(self, key: str, *, required: Literal[True]) -> str: ...
    @overload
    def string(self, key: str) -> str | None: ...
    def string(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        value = self.data.get(key)
        if value is None:  # `key:` with no value is the key left out: the default (has() reads it so too)
            value = default
        if value is None:
            if required:
                raise BadInput(f"{self.path}: {self._key(key)} is required (a string)")
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "a non-empty string")
        return value

    def integer(self, key: str) -> int | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(key, "a positive integer")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false")
        return value

    def strings(self, key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.fail(key, "a list of non-empty strings")
        return tuple(value)

    def env(self, key: str) -> dict[str, str]:
        value = self.data.get(key) or {}
        if not isinstance(value, dict):
            raise self.fail(key, "a mapping of NAME: value")
        result = {}
        for name, item in value.items():
            if not isinstance(name, str) or not ENV_NAME_RE.match(name):
                raise BadInput(f"{self.path}: {self._key(key)} has an invalid name {name!r}; use NAME: value")
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise BadInput(f"{self.path}: {self._key(key)}.{name} must be a string or number, got {item!r}")
            result[name] = str(item)
        return result


def check_url(url: str, path: Path) -> str:
    """Accept only https, ssh, git and file URLs, scp-like ssh and local paths (repos or bundles)."""
    if url.startswith("-"):
        raise BadInput(f"{path}: upstream.url {public_url(url)!r} starts with '-'; give a URL or a path")
    if "::" in url.split("/", 1)[0]:
        raise BadInput(
            f"{path}: upstream.url {public_url(url)!r} uses a git remote helper transport; "
            f"use one of {', '.join(ALLOWED_SCHEMES)} or a local path"
        )
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", url)
    if scheme:
        if scheme.group(1).lower() not in ALLOWED_SCHEMES:
            raise BadInput(
                f"{path}: upstream.url scheme {scheme.group(1)!r} is not allowed; "
                f"use one of {', '.join(ALLOWED_SCHEMES)} or a local path"
            )
        return url
    if SCP_LIKE_RE.match(url):
        return url
    resolved = Path(url) if Path(url).is_absolute() else (path.parent / url)
    return str(resolved.resolve())


def public_url(url: str) -> str:
    """The URL without any user:password part, safe for logs, labels and buildinfo."""
    from carry.util import redact

    return redact.credentials(url)


def strip_credentials(text: str) -> str:
    """`text` (e.g. build.yaml) with the user:password part removed from every URL in it."""
    from carry.util import redact

    return redact.credentials(text)


def check_image_name(name: str, path: Path) -> str:
    """A docker repository name: optional registry host[:port], lowercase path components."""
    # one component at a time: the same language as the whole name's pattern
    # ^([a-z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$, whose compile alone cost
    # every command that loads build.yaml 1-3 ms
    first, *rest = name.split("/")
    component = r"[a-z0-9]+(?:[._-][a-z0-9]+)*"
    valid = all(re.fullmatch(component, part) for part in rest) and bool(
        re.fullmatch(component, first) or (rest and re.fullmatch(r"[a-z0-9.-]+(?::[0-9]+)?", first))
    )
    if not valid:
        raise BadInput(
            f"{path}: image.name {name!r} is not a valid image name; use lowercase letters, digits, "
            f"'.', '_', '-' and '/', e.g. registry.example:5000/team/vllm-gb10"
        )
    return name


def check_tag_template(template: str, path: Path) -> str:
    """A tag template may use only the known fields and must render to a valid tag."""
    if template in DEFAULT_IMAGE_TAGS:
        return template  # valid
    for field in re.findall(r"{([^{}]*)}", template):
        if field not in TAG_FIELDS:
            raise BadInput(
                f"{path}: image.tags template {template!r} uses unknown field {{{field}}}; "
                f"allowed: {', '.join('{' + f + '}' for f in TAG_FIELDS)}"
            )
    try:
        sample = template.format(version="20260101.1", base_short="0" * 12, cuda="130", series_short="0" * 12)
    except ValueError as exc:
        raise BadInput(
            f"{path}: image.tags template {template!r} is malformed ({exc}); write fields as {{version}}"
        ) from None
    if not TAG_RE.fullmatch(sample):
        raise BadInput(
            f"{path}: image.tags template {template!r} does not render to a valid tag "
            f"(letters, digits, '_', '.', '-'; at most 128; not starting with '.' or '-')"
        )
    return template


def load(path: Path) -> Config:
    """Read and validate build.yaml."""
    path = Path(path).absolute()
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BadInput(f"{path}: config file not found; pass --config PATH to an existing build.yaml") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read config ({exc}); check the file") from None
    try:
        data = yaml.load(text, Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise BadInput(f"{path}: YAML syntax error{where}: {problem}; fix the file") from None
    top = _Section(data, "", path, ("upstream", "patches", "version_file", "build", "image"))
    return Config(
        path=path,
        upstream=_upstream(top.section("upstream", ("url", "pr", "commit", "main")), path),
        patches_dir=path.parent / top.section("patches", ("dir",)).string("dir", "patches"),
        version_file=path.parent / top.string("version_file", "VERSION"),
        build=_build(top.section("build", BUILD_KEYS)),
        image=_image(top.section("image", IMAGE_KEYS), path),
    )


BUILD_KEYS = (
    "cuda_arches",
    "env",
    "wheel_version",
    "version_env",
    "build_isolation",
    "compiler_cache",
    "remote_cache",
    "tests",
    "gate",
    "generated",
    "keep",
    "environment",
    "precompiled",
    "distribution",
    "upstream_tests",
)
UPSTREAM_TESTS_KEYS = ("paths", "marker", "deselect", "requires", "timeout", "workers", "env", "checkout")
DEFAULT_TEST_TIMEOUT_S = 300
PRECOMPILED_KEYS = ("env", "clear", "inputs", "nightly", "wheels")
PRECOMPILED_WHEEL_KEYS = ("requirement", "index", "path", "url", "sha256", "ref")
ENVIRONMENT_KEYS = ("requires", "index_url", "extra_index_urls")
INDEX_FORM = "an index URL: https://HOST/PATH (user:password@ allowed), http://… or file:///PATH"
IMAGE_KEYS = (
    "name",
    "tags",
    "platforms",
    "base_image",
    "runtime_image",
    "build_args",
    "labels",
    "env",
    "secret_env",
    "docker",
    "lock",
    "entrypoint",
    "cmd",
    "runtime_python",
)


def _upstream(section: _Section, path: Path) -> Upstream:
    if not section.data:
        raise BadInput(f"{path}: the upstream section is required (url, commit, optional pr and main)")
    commit = section.data.get("commit")
    if isinstance(commit, (int, float)) and not isinstance(commit, bool):
        raise BadInput(
            f"{path}: upstream.commit was read as the number {commit!r}: YAML reads an all-digit SHA as a number; "
            f"quote it, e.g. commit: '0123456789…' (the full 40-hex SHA)"
        )
    if not isinstance(commit, str) or not SHA_RE.match(commit):
        raise section.fail("commit", "a full 40-hex commit SHA (git rev-parse <commit>)")
    return Upstream(
        url=check_url(section.string("url", required=True), path),
        pr=section.integer("pr"),
        commit=commit,
        main=section.string("main", "main"),
    )


def _build(section: _Section) -> Build:
    arches = section.data.get("cuda_arches")
    if arches is not None and not isinstance(arches, (str, list)):
        raise section.fail("cuda_arches", "a string like '9.0,12.1', a list of arches, or [] for no CUDA code")
    version_env = _env_names(section, "version_env")
    wheel_version = section.string("wheel_version")
    if wheel_version is not None:
        if "{version}" not in wheel_version:
            raise section.fail("wheel_version", "a template containing {version}, e.g. '0.11.0+carry.{version}'")
        _check_wheel_version(section, wheel_version)
    compiler_cache = CompilerCache.parse(section.string("compiler_cache", "auto"), f"{section.path}: build")
    remote_cache = None
    if section.has("remote_cache"):
        where = f"{section.path}: build.remote_cache"
        remote_cache = RemoteCache.parse(section.string("remote_cache", required=True), where)
        remote_cache.check_launcher(compiler_cache, where)
    isolation = section.boolean("build_isolation", True)
    cuda_arches = ArchList.parse(arches) if arches is not None else None
    return Build(
        cuda_arches=cuda_arches,
        env=section.env("env"),
        wheel_version=wheel_version,
        version_env=version_env,
        build_isolation=isolation,
        compiler_cache=compiler_cache,
        remote_cache=remote_cache,
        # A Python-only build (cuda_arches: []) has nothing for a GPU to run: its tests need none unless they say so.
        tests=_tests(section, gpu=cuda_arches is None or cuda_arches.expects_cuda),
        gate=section.data.get("gate"),
        generated=_generated(section),
        keep=_keep(section),
        environment=_environment(section, isolation),
        precompiled=_precompiled(section),
        distribution=_distribution(section),
        upstream_tests=_upstream_tests(section),
    )


def _tree_path(where: str, value: Any, ids: bool = False) -> str:
    """A path in the upstream's tree, relative to its root (a test id `path::name` where `ids`)."""
    text = value.strip().rstrip("/") if isinstance(value, str) else ""
    path = text.split("::", 1)[0] if ids else text
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(part in ("", ".", "..") for part in parts):
        form = "a path relative to the tree's root, e.g. tests/v1/core" + (" or a test id (path::name)" if ids else "")
        raise BadInput(f"{where} has {value!r}; use {form}")
    if not ids and "::" in text:
        raise BadInput(f"{where} has {value!r}: a test id; list paths here and test ids under deselect (with why)")
    return text


def _upstream_tests(build: _Section) -> UpstreamTests | None:
    """build.upstream_tests: {paths: [...], marker: EXPR, deselect: {path or id: why}, requires: [...], timeout: S,
    workers: N, env: {NAME: value}, checkout: [...]}."""
    if not build.has("upstream_tests"):
        return None
    section = build.section("upstream_tests", UPSTREAM_TESTS_KEYS)
    where = f"{build.path}: build.upstream_tests"
    if not section.has("paths"):
        raise BadInput(f"{where}.paths is required: the upstream's test files or directories, e.g. [tests/v1/core]")
    paths = tuple(dict.fromkeys(_tree_path(f"{where}.paths", p) for p in section.strings("paths")))
    deselect = section.data.get("deselect") or {}
    if not isinstance(deselect, dict):
        raise BadInput(f"{where}.deselect must be a mapping of test path or id to why it cannot run here")
    found = []
    for target, why in deselect.items():
        target = _tree_path(f"{where}.deselect", target, ids=True)
        if not isinstance(why, str) or not why.strip():
            raise BadInput(f"{where}.deselect.{target} needs a reason: why the test cannot run here")
        found.append(Deselection(target, " ".join(why.split())))
    workers = section.data.get("workers", 0)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise section.fail("workers", "a number of pytest-xdist workers, 0 for one process")
    marker = section.string("marker")
    return UpstreamTests(
        paths=paths,
        marker=" ".join(marker.split()) if marker else None,
        deselect=tuple(found),
        requires=section.strings("requires"),
        timeout=section.integer("timeout") or DEFAULT_TEST_TIMEOUT_S,
        workers=workers,
        env=section.env("env"),
        checkout=tuple(_tree_path(f"{where}.checkout", p) for p in section.strings("checkout")),
    )


def _distribution(section: _Section) -> str | None:
    """build.distribution: the upstream's distribution name (a wheel's NAME, PEP 508 form)."""
    name = section.string("distribution")
    if name is not None and not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
        raise section.fail("distribution", "the upstream's distribution name, as in its wheel's file name, e.g. pluggy")
    return name


def _precompiled(build: _Section) -> Precompiled | None:
    """build.precompiled: env (with {wheel}), clear (prefixes), inputs (glob: why), wheels (platform: requirement
    with an optional index, or path, or url; sha256; ref)."""
    if not build.has("precompiled"):
        return None
    from carry.platforms import Platform
    from carry.util.pinned import Pinned

    section = build.section("precompiled", PRECOMPILED_KEYS)
    where = f"{build.path}: build.precompiled"
    env = section.env("env")
    if not any("{wheel}" in value for value in env.values()):
        raise BadInput(
            f"{where}.env must hand the wheel to the upstream's build: a variable whose value holds "
            f"{{wheel}}, e.g. VLLM_PRECOMPILED_WHEEL_LOCATION: '{{wheel}}'"
        )
    clear = section.strings("clear")
    if not all(ENV_NAME_RE.match(prefix.rstrip("_") or "_") for prefix in clear):
        raise section.fail("clear", "a list of variable-name prefixes, e.g. [VLLM_PRECOMPILED_, VLLM_USE_PRECOMPILED]")
    inputs = _globs_with_reasons(section, "inputs", "which compiled code reads it")
    if not inputs:
        raise BadInput(
            f"{where}.inputs is required: the files the compiled code is built from (e.g. 'csrc/**': "
            f"'the CUDA and C++ sources'), which must be identical to the wheel's source"
        )
    nightly = _nightly(section)
    value = section.data.get("wheels")
    if nightly is not None and value in (None, {}):  # `carry pin` writes them
        return Precompiled(env, clear, inputs, (), nightly)
    if not isinstance(value, dict) or not value:
        raise section.fail(
            "wheels",
            "a mapping of platform to {requirement (or path), sha256, ref}, e.g. "
            "{linux/amd64: {requirement: 'vllm==0.33.0', sha256: …, ref: v0.33.0}}",
        )
    wheels = []
    for name, settings in value.items():
        platform = Platform.parse(str(name), f"{where}.wheels")
        own = _Section(settings, f"build.precompiled.wheels.{name}", build.path, PRECOMPILED_WHEEL_KEYS)
        here = f"{where}.wheels.{name}"
        if sum(own.has(key) for key in ("requirement", "path", "url")) != 1:
            raise BadInput(
                f"{here} needs one of requirement (e.g. 'vllm==0.33.0', served by the package index pip is "
                f"configured with, or by index:), path or url: the upstream wheel to take the compiled "
                f"code from"
            )
        if own.has("index") and not own.has("requirement"):
            raise BadInput(f"{here}: index is for a wheel pinned by requirement; give requirement: 'NAME==VERSION'")
        if own.has("requirement"):
            pinned = Pinned.by_name(
                own.string("requirement", required=True),
                own.data.get("sha256"),
                here,
                index=own.string("index"),
                platform=platform,
            )
        else:
            source = own.string("url") or str(_relative(build.path, own.string("path", required=True)))
            pinned = Pinned.parse(source, own.data.get("sha256"), here)
            if not pinned.name.endswith(".whl"):
                raise BadInput(f"{here}: {pinned.name} is not a wheel (.whl)")
        wheels.append(PrecompiledWheel(platform, pinned, own.string("ref")))
    return Precompiled(env, clear, inputs, tuple(wheels), nightly)


NIGHTLY_KEYS = ("index", "variant", "max_walk")
DEFAULT_MAX_WALK = 50
VARIANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _nightly(precompiled: _Section) -> Nightly | None:
    """build.precompiled.nightly: {index: URL or ${NAME}, variant: NAME, max_walk: N}."""
    if "nightly" not in precompiled.data:
        return None
    from carry.util import indexurl

    section = precompiled.section("nightly", NIGHTLY_KEYS)
    where = f"{section.path}: build.precompiled.nightly"
    if not section.has("index"):
        raise BadInput(
            f"{where}.index is required: the root URL of the per-commit wheel index (its wheels of commit C are "
            f"under {{index}}/C/), or ${{NAME}} to take it from the environment"
        )
    template = indexurl.check_template(section.string("index", required=True), f"{where}.index").rstrip("/")
    variant = section.string("variant")
    if variant is not None and (not VARIANT_RE.match(variant) or variant in (".", "..")):
        raise BadInput(
            f"{where}.variant {variant!r} is not a variant name (one path segment such as cu130 or cpu: letters, "
            f"digits, '.', '_', '-'); leave it out to read the default variant's pages"
        )
    return Nightly(template, variant, section.integer("max_walk") or DEFAULT_MAX_WALK)


def _relative(config_path: Path, path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else config_path.parent / path


def _globs_with_reasons(section: _Section, key: str, reason: str) -> tuple[Generated, ...]:
    """A mapping of path glob to why, e.g. build.generated or build.precompiled.inputs."""
    value = section.data.get(key)
    if value is None:
        return ()
    where = f"{section.path}: {section._key(key)}"
    if not isinstance(value, dict):
        raise BadInput(f"{where} must be a mapping of path glob to {reason}, e.g. {{'pkg/_version.py': '…'}}")
    found = []
    for glob, why in value.items():
        if not isinstance(glob, str) or not glob.strip() or glob.startswith("/") or ".." in glob.split("/"):
            raise BadInput(f"{where} has {glob!r}; use a glob relative to the root")
        if not isinstance(why, str) or not why.strip():
            raise BadInput(f"{where}.{glob} needs a reason ({reason})")
        found.append(Generated(glob.strip(), " ".join(why.split())))
    return tuple(found)


def _generated(section: _Section) -> tuple[Generated, ...]:
    """build.generated: a mapping of wheel-path glob to why the build writes it."""
    return _globs_with_reasons(section, "generated", "which build step writes it")


def _keep(section: _Section) -> tuple[str, ...]:
    """build.keep: build-dir paths (globs) that survive between builds, e.g. setuptools' object dirs."""
    keep = section.strings("keep", DEFAULT_KEEP)
    for glob in keep:
        parts = glob.strip("/").split("/")
        if glob.startswith("/") or ".." in parts or parts[0] in ("", ".", "*", "**"):
            raise BadInput(
                f"{section.path}: build.keep has {glob!r}; name directories of build objects inside "
                f"the source tree, e.g. 'build/temp.*'"
            )
    return keep


def _environment(build: _Section, isolation: bool) -> BuildEnvironment:
    """build.environment: requirements carry adds to the upstream's build requires, and the indexes uv uses."""
    if not build.has("environment"):
        return BuildEnvironment()
    if isolation:
        raise BadInput(
            f"{build.path}: build.environment is used only with build_isolation: false (carry's own build "
            f"environment); set build.build_isolation: false or remove build.environment"
        )
    from packaging.requirements import InvalidRequirement, Requirement

    section = build.section("environment", ENVIRONMENT_KEYS)
    requires = section.strings("requires")
    for text in requires:
        try:
            Requirement(text)
        except InvalidRequirement as exc:
            raise BadInput(
                f"{section.path}: build.environment.requires has {strip_credentials(text)!r}, which is "
                f"not a PEP 508 requirement ({str(exc).splitlines()[0]}); write it like 'torch==2.14.0'"
            ) from None
    index_url = section.data.get("index_url")
    extra = section.data.get("extra_index_urls") or []
    extra = [extra] if isinstance(extra, str) else extra
    # Not echoed when malformed, unlike other keys: a URL here may hold a password.
    if index_url is not None and not isinstance(index_url, str):
        raise BadInput(f"{section.path}: build.environment.index_url must be one URL; use {INDEX_FORM}")
    if not isinstance(extra, list) or not all(isinstance(url, str) for url in extra):
        raise BadInput(f"{section.path}: build.environment.extra_index_urls must be a list of URLs; use {INDEX_FORM}")
    return BuildEnvironment(
        requires=requires,
        index_url=_index_url(section, "index_url", index_url) if index_url is not None else None,
        extra_index_urls=tuple(_index_url(section, "extra_index_urls", url) for url in extra),
    )


def _index_url(section: _Section, key: str, url: str) -> str:
    import urllib.parse

    shown = _without_secrets(url)
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # a bad port raises ValueError
    except ValueError:
        parts = None
    scheme = parts.scheme.lower() if parts else ""
    if (
        parts is None
        or scheme not in ("https", "http", "file")
        or re.search(r"\s", url)
        or (scheme != "file" and not parts.hostname)
        or (scheme == "file" and not parts.path)
    ):
        raise BadInput(f"{section.path}: build.environment.{key} has {shown!r}; use {INDEX_FORM}")
    return url


def _tests(section: _Section, gpu: bool = True) -> tuple[TestCommand, ...]:
    """build.tests: a list of commands, each a string split like a shell would (no shell runs it), a list of
    arguments, or a mapping {run: <either>, gpu: true|false, against: wheel|tree}; `gpu` is the default."""
    value = section.data.get("tests")
    if value is None:
        return ()
    form = (
        "a list of commands, each a string like 'python -m pkg.check', a list like [python, -m, pkg.check], or "
        "{run: ..., gpu: false, against: tree}"
    )
    if not isinstance(value, list):
        raise section.fail("tests", form)
    return tuple(_test(entry, f"{section.path}: build.tests[{index}]", gpu) for index, entry in enumerate(value))


TEST_KEYS = ("run", "gpu", "against")
TEST_AGAINST = ("wheel", "tree")


def _test(entry: Any, where: str, gpu: bool = True) -> TestCommand:
    tree = False
    if isinstance(entry, dict):
        unknown = sorted(str(k) for k in entry if k not in TEST_KEYS)
        if unknown:
            raise BadInput(f"{where}: unknown key {unknown[0]!r}; allowed keys here: {', '.join(TEST_KEYS)}")
        gpu = entry.get("gpu", gpu)
        if not isinstance(gpu, bool):
            raise BadInput(f"{where}.gpu must be true or false, got {gpu!r}")
        against = entry.get("against", "wheel")
        if against not in TEST_AGAINST:
            raise BadInput(
                f"{where}.against must be wheel (the built wheel) or tree (the patched source tree, nothing "
                f"built), got {against!r}"
            )
        tree = against == "tree"
        if "run" not in entry:
            raise BadInput(f"{where} needs run: the command, e.g. {{run: 'python -m pkg.check', gpu: false}}")
        entry, where = entry["run"], f"{where}.run"
    argv, text = test_argv(entry, where)
    return TestCommand(tuple(argv), text, gpu, tree)


def test_argv(entry: Any, where: str) -> tuple[list[str], str]:
    """A command as a string (split like a shell would) or a list of arguments: (argv, the command as text)."""
    argv = command_argv(entry, where)
    if isinstance(entry, str):
        return argv, entry.strip()
    import shlex

    return argv, shlex.join(entry)


def command_argv(entry: Any, where: str) -> list[str]:
    """A command as a string (split like a shell would: shlex, imported only then) or a list of arguments."""
    if isinstance(entry, str):
        import shlex

        try:
            argv = shlex.split(entry)
        except ValueError as exc:
            raise BadInput(f"{where} {entry!r} does not parse ({exc}); close the quote or use a list") from None
    elif isinstance(entry, list) and all(isinstance(arg, str) for arg in entry):
        argv = list(entry)
    else:
        raise BadInput(f"{where} must be a string or a list of strings, got {entry!r}")
    if not argv or not argv[0].strip():
        raise BadInput(f"{where} is empty; give the command to run, e.g. 'python -m pkg.check'")
    return argv


def _check_wheel_version(section: _Section, template: str) -> None:
    """Whatever VERSION holds, the template must render to a PEP 440 version with a local label."""
    try:
        rendered = template.format(version="20260101.1")
    except (ValueError, KeyError, IndexError):
        rendered = None
    if rendered is not None and release_and_local(rendered):
        return  # valid; spares every command the import of `packaging` (and the compile of its version pattern)
    from packaging.version import Version as PackagingVersion

    try:
        valid = rendered is not None and bool(PackagingVersion(rendered).local)
    except ValueError:
        valid = False
    if not valid:
        raise section.fail("wheel_version", "a PEP 440 version with a local label, e.g. '0.11.0+carry.{version}'")


def release_and_local(version: str) -> bool:
    """Whether `version` is a release and a local label in their plainest form (`0.33.0+carry.20260101.1`): then it
    is a PEP 440 version with a local label, told without packaging (its import and its pattern's compile would cost
    every command that loads build.yaml more than the rest of the file); other forms are for packaging to judge."""
    release, plus, local = version.partition("+")
    return (
        bool(plus)
        and _dotted(release, str.isdigit)
        and _dotted(local, lambda part: part.isalnum() and part.islower() or part.isdigit())
    )


def _dotted(text: str, each: Callable[[str], bool]) -> bool:
    return all(part.isascii() and part and each(part) for part in text.split("."))


def _image(section: _Section, path: Path) -> Image:
    name = section.string("name", "carry")
    return Image(
        name=check_image_name(name, path),
        tags=tuple(check_tag_template(t, path) for t in section.strings("tags", DEFAULT_IMAGE_TAGS)),
        platforms=_platforms(section),
        base_image=section.string("base_image"),
        runtime_image=section.string("runtime_image"),
        build_args=section.env("build_args"),
        labels=_labels(section),
        env=section.env("env"),
        secret_env=_env_names(section, "secret_env"),
        docker=section.string("docker", "docker"),
        lock=_lock_dir(section, path),
        entrypoint=_exec_form(section, "entrypoint"),
        cmd=_exec_form(section, "cmd", empty=True),
        runtime_python=_runtime_python(section) or "auto",
    )


def _runtime_python(section: _Section) -> str | None:
    """image.runtime_python (or image.platforms.<p>.runtime_python): auto, a method (apt) or off."""
    value = section.data.get("runtime_python")
    if value is None:
        return None
    if value is False:
        value = "off"  # YAML 1.1 reads a bare `off` as false
    if value not in RUNTIME_PYTHON_VALUES:
        raise section.fail(
            "runtime_python",
            "auto (derive a base with python3 when the runtime image has none), apt (always derive it with the "
            "image's own apt) or off (never)",
        )
    return value


def _lock_dir(section: _Section, path: Path) -> Path | None:
    """image.lock: a directory beside build.yaml (relative, inside the config's directory) for the runtime lock."""
    name = section.string("lock")
    if name is None:
        return None
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts or not parts:
        raise section.fail("lock", "a directory relative to the config's directory, e.g. runtime-lock")
    return path.parent / name


def _exec_form(section: _Section, key: str, empty: bool = False) -> tuple[str, ...] | None:
    """image.entrypoint / image.cmd: a list of arguments (exec form), or a string split like a shell would."""
    value = section.data.get(key)
    if value is None:
        return None
    if isinstance(value, list) and not value and empty:
        return ()
    return tuple(command_argv(value, f"{section.path}: image.{key}"))


PLATFORM_KEYS = ("cuda_arches", "base_image", "runtime_image", "runtime_python")


def _platforms(section: _Section) -> tuple[PlatformTarget, ...]:
    """A list of platforms, or a mapping of platform to what it sets for itself (PLATFORM_KEYS)."""
    value = section.data.get("platforms")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = {v: None for v in value}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise section.fail(
            "platforms",
            "a list of platforms such as [linux/amd64, linux/arm64], or a mapping of "
            "platform to its own cuda_arches, base_image, runtime_image, runtime_python",
        )
    from carry.platforms import Platform

    targets: list[PlatformTarget] = []
    for name, settings in value.items():
        platform = Platform.parse(name, f"{section.path}: image.platforms")
        if any(t.platform is platform for t in targets):
            raise BadInput(f"{section.path}: image.platforms names {platform} twice; keep one entry")
        own = _Section(settings, f"image.platforms.{name}", section.path, PLATFORM_KEYS)
        arches = own.data.get("cuda_arches")
        if arches is not None and not isinstance(arches, (str, list)):
            raise own.fail("cuda_arches", "a string like '12.1' or a list of arches")
        targets.append(
            PlatformTarget(
                platform=platform,
                cuda_arches=ArchList.parse(arches) if arches is not None else None,
                base_image=own.string("base_image"),
                runtime_image=own.string("runtime_image"),
                runtime_python=_runtime_python(own),
            )
        )
    return tuple(targets)


def _env_names(section: _Section, key: str) -> tuple[str, ...]:
    names = section.strings(key)
    if not all(ENV_NAME_RE.match(name) for name in names):
        raise section.fail(key, "a list of environment variable names")
    return names


def _labels(section: _Section) -> dict[str, str]:
    value = section.data.get("labels") or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise section.fail("labels", "a mapping of label: string")
    return dict(value)
