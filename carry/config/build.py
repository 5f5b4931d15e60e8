"""build.yaml's `build:` section, resolved once into frozen records: arches, variables, version, compiler cache,
tests, what the build generates and keeps, its environment, precompiled wheels (and where `carry pin` finds them)
and the upstream's own test suite. build.gate is kept as written (carry/binaries/gatepolicy.py reads it)."""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from carry.arch import ArchList
from carry.config.reader import ENV_NAME_RE, Section, env_names, strip_credentials, test_argv, without_secrets
from carry.util.errors import BadInput
from carry.util.record import field as record_field
from carry.util.record import record

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from carry.platforms import Platform
    from carry.util.pinned import Pinned


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


REMOTE_FORMS = "redis://HOST[:PORT][/DB], rediss://…, http(s)://HOST[:PORT][/PATH], s3://BUCKET[/PREFIX] or gha"


@record
class RemoteCache:
    """`build.remote_cache`: where compiled objects are shared; the password comes from $CARRY_REMOTE_CACHE_PASSWORD."""

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

        shown = without_secrets(text)
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


class _NeedsLauncher(Protocol):
    def check_launcher(self, launcher: CompilerCache, where: str) -> None: ...


T = TypeVar("T", bound=_NeedsLauncher)


def overridden(
    environ: Mapping[str, str], name: str, configured: T | None, parse: Callable[[str, str], T], launcher: CompilerCache
) -> T | None:
    """The setting as build.yaml has it, or as the variable `name` says when set (`none` turns it off), as in CI;
    `parse(text, where)` reads it and the compiler cache `launcher` must suit it (bad input names $NAME)."""
    override = environ.get(name, "").strip()
    if not override:
        return configured
    if override == "none":
        return None
    found = parse(override, f"${name}")
    found.check_launcher(launcher, f"${name}")
    return found


@record
class Distributed:
    """`build.distributed`: the sccache-dist scheduler a source build's compiles go to. Never holds a credential:
    the client token comes from $CARRY_DIST_TOKEN (or the file $CARRY_DIST_TOKEN_FILE names) when the build runs."""

    scheduler_url: str  # http(s)://HOST[:PORT][/PATH], without a trailing '/'

    @classmethod
    def parse(cls, text: str, where: str) -> Distributed:
        import urllib.parse

        shown = without_secrets(text)
        form = "http(s)://HOST[:PORT], e.g. http://10.0.0.5:10600"
        try:
            parts = urllib.parse.urlsplit(text.strip())
            parts.port  # noqa: B018 (a bad port raises here)
        except ValueError as exc:
            raise BadInput(f"{where} {shown!r} is not a valid URL ({exc}); use {form}") from None
        if "@" in parts.netloc:
            raise BadInput(f"{where} {shown!r} must not hold credentials; put the token in $CARRY_DIST_TOKEN")
        if (
            parts.scheme.lower() not in ("http", "https")
            or not parts.hostname
            or parts.query
            or parts.fragment
            or re.search(r"\s", text.strip())
        ):
            raise BadInput(f"{where} {shown!r} is not an http(s) URL; use {form}")
        return cls(text.strip().rstrip("/"))

    def check_launcher(self, launcher: CompilerCache, where: str) -> None:
        """Only sccache is an sccache-dist client: an explicit other compiler cache is bad input."""
        if launcher in (CompilerCache.AUTO, CompilerCache.SCCACHE):
            return
        raise BadInput(
            f"{where} {self.scheduler_url} needs sccache as the compiler launcher; set build.compiler_cache to "
            f"sccache (or auto), or remove build.distributed"
        )

    def __str__(self) -> str:
        return self.scheduler_url


@record
class TestCommand:
    """One entry of build.tests: the argv (never through a shell) and the command as written; whether it needs a GPU,
    and whether it runs against the built wheel (a fresh venv) or in the patched source tree (nothing built)."""

    __test__ = False  # not a pytest class
    argv: tuple[str, ...]
    text: str
    gpu: bool = True
    tree: bool = False


DEFAULT_KEEP = ("build/temp.*",)


@record
class Generated:
    """A glob of wheel paths the upstream's build writes, with why: not needed in the patched tree, or may differ."""

    glob: str
    why: str


@record
class BuildEnvironment:
    """`build.environment`: what carry adds to the upstream's `[build-system] requires` in the environment it builds
    in (build_isolation: false; carry/wheelbuild/buildenv.py). The index URLs may hold `user:password@`: they reach uv
    through its environment only and are never printed."""

    requires: tuple[str, ...] = ()  # PEP 508 requirements, installed with the upstream's own
    index_url: str | None = None  # replaces PyPI
    extra_index_urls: tuple[str, ...] = ()  # searched before index_url, in order (e.g. a torch index)


@record
class PrecompiledWheel:
    """One platform's upstream wheel to take the compiled code from, pinned by sha256, and the upstream ref or commit
    it was built from (None: read from its version)."""

    platform: Platform
    pinned: Pinned
    ref: str | None


@record
class Nightly:
    """build.precompiled.nightly: where `carry pin` finds the precompiled wheels. `index`: the root of a per-commit
    wheel index in vLLM's layout (`{index}/{commit}/[{variant}/]{project}/`), maybe with `${NAME}` (indexurl.expand);
    `variant` None: the default variant; `max_walk`: how many commits of main's first-parent history may be tried."""

    index: str
    variant: str | None = None
    max_walk: int = 50


@record
class Precompiled:
    """build.precompiled: how the upstream takes compiled code from an existing wheel: the variables carry sets
    (`{wheel}` is the checked local file) and the prefixes of inherited ones it removes, the compiled inputs (each with
    why), the wheel per platform, and where `carry pin` finds them (nightly; the wheels may be missing until then)."""

    env: dict[str, str]
    clear: tuple[str, ...]
    inputs: tuple[Generated, ...]
    wheels: tuple[PrecompiledWheel, ...]
    nightly: Nightly | None = None

    def wheel_for(self, platform: Platform) -> PrecompiledWheel | None:
        return next((w for w in self.wheels if w.platform is platform), None)


@record
class Deselection:
    """One build.upstream_tests.deselect entry: a test path or id (`path::name`, a prefix of ids), and why."""

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
    """build.upstream_tests: the selection of the upstream's own test suite `suite` runs on the fixed wheel and the
    wheel it is compared with (carry/gputest/upstreamsuite.py): paths, marker, deselections with reasons, test
    requirements, per-test timeout, xdist workers (0: one process), variables, and more tree paths the tests read."""

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
    distributed: Distributed | None = None  # None: every compile runs on this machine
    # build.gate as written: shared objects built for some GPUs only, by the upstream's design; read into the gate's
    # rules where the policy is made (carry.binaries.gatepolicy.for_config), every error naming the entry
    gate: Any = None
    generated: tuple[Generated, ...] = ()  # files the build makes that the patched tree does not hold
    keep: tuple[str, ...] = DEFAULT_KEEP  # build-dir paths kept between builds (objects, never outputs)
    environment: BuildEnvironment = BuildEnvironment()
    precompiled: Precompiled | None = None  # None: every build compiles from source
    distribution: str | None = None  # the wheel's NAME; None: [project] name, else the built wheel's
    upstream_tests: UpstreamTests | None = None  # None: `suite` has no selection to run


BUILD_KEYS = (
    "cuda_arches",
    "env",
    "wheel_version",
    "version_env",
    "build_isolation",
    "compiler_cache",
    "remote_cache",
    "distributed",
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
DISTRIBUTED_KEYS = ("scheduler_url",)
ENVIRONMENT_KEYS = ("requires", "index_url", "extra_index_urls")
INDEX_FORM = "an index URL: https://HOST/PATH (user:password@ allowed), http://… or file:///PATH"


def read_build(section: Section) -> Build:
    """The `build:` section, each key read into its record (a key left out: its default)."""
    arches = section.data.get("cuda_arches")
    if arches is not None and not isinstance(arches, (str, list)):
        raise section.fail("cuda_arches", "a string like '9.0,12.1', a list of arches, or [] for no CUDA code")
    version_env = env_names(section, "version_env")
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
    distributed = _distributed(section, compiler_cache)
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
        distributed=distributed,
        # A Python-only build (cuda_arches: []) has nothing for a GPU to run: its tests need none unless they say so.
        tests=_tests(section, gpu=cuda_arches is None or cuda_arches.expects_cuda),
        gate=section.data.get("gate"),
        generated=_globs_with_reasons(section, "generated", "which build step writes it"),  # wheel-path globs
        keep=_keep(section),
        environment=_environment(section, isolation),
        precompiled=_precompiled(section),
        distribution=_distribution(section),
        upstream_tests=_upstream_tests(section),
    )


def _distributed(build: Section, compiler_cache: CompilerCache) -> Distributed | None:
    """build.distributed: {scheduler_url: http(s)://…}; only sccache can be its client."""
    if not build.has("distributed"):
        return None
    section = build.section("distributed", DISTRIBUTED_KEYS)
    where = f"{section.path}: build.distributed.scheduler_url"
    distributed = Distributed.parse(section.string("scheduler_url", required=True), where)
    distributed.check_launcher(compiler_cache, f"{section.path}: build.distributed")
    return distributed


def _tree_path(where: str, value: Any, ids: bool = False) -> str:
    """A path in the upstream's tree, relative to its root (a test id `path::name` where `ids`)."""
    text = value.strip().rstrip("/") if isinstance(value, str) else ""
    path = text.split("::", 1)[0] if ids else text
    if not path or path.startswith("/") or "\\" in path or any(part in ("", ".", "..") for part in path.split("/")):
        form = "a path relative to the tree's root, e.g. tests/v1/core" + (" or a test id (path::name)" if ids else "")
        raise BadInput(f"{where} has {value!r}; use {form}")
    if not ids and "::" in text:
        raise BadInput(f"{where} has {value!r}: a test id; list paths here and test ids under deselect (with why)")
    return text


def _upstream_tests(build: Section) -> UpstreamTests | None:
    """build.upstream_tests: {paths, marker, deselect: {path or id: why}, requires, timeout, workers, env, checkout}."""
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


def _distribution(section: Section) -> str | None:
    """build.distribution: the upstream's distribution name (a wheel's NAME, PEP 508 form)."""
    name = section.string("distribution")
    if name is not None and not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
        raise section.fail("distribution", "the upstream's distribution name, as in its wheel's file name, e.g. pluggy")
    return name


def _precompiled(build: Section) -> Precompiled | None:
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
        own = Section(settings, f"build.precompiled.wheels.{name}", build.path, PRECOMPILED_WHEEL_KEYS)
        here = f"{where}.wheels.{name}"
        if sum(own.has(key) for key in ("requirement", "path", "url")) != 1:
            raise BadInput(
                f"{here} needs one of requirement (e.g. 'vllm==0.33.0', served by the package index pip is configured "
                f"with, or by index:), path or url: the upstream wheel to take the compiled code from"
            )
        if own.has("index") and not own.has("requirement"):
            raise BadInput(f"{here}: index is for a wheel pinned by requirement; give requirement: 'NAME==VERSION'")
        if own.has("requirement"):
            requirement = own.string("requirement", required=True)
            pinned = Pinned.by_name(
                requirement, own.data.get("sha256"), here, index=own.string("index"), platform=platform
            )
        else:
            source = own.string("url") or str(build.path.parent / own.string("path", required=True))
            pinned = Pinned.parse(source, own.data.get("sha256"), here)
            if not pinned.name.endswith(".whl"):
                raise BadInput(f"{here}: {pinned.name} is not a wheel (.whl)")
        wheels.append(PrecompiledWheel(platform, pinned, own.string("ref")))
    return Precompiled(env, clear, inputs, tuple(wheels), nightly)


NIGHTLY_KEYS = ("index", "variant", "max_walk")
DEFAULT_MAX_WALK = 50
VARIANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _nightly(precompiled: Section) -> Nightly | None:
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


def _globs_with_reasons(section: Section, key: str, reason: str) -> tuple[Generated, ...]:
    """A mapping of path glob to why, e.g. build.generated or build.precompiled.inputs."""
    value = section.data.get(key)
    if value is None:
        return ()
    where = f"{section.path}: {section.key(key)}"
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


def _keep(section: Section) -> tuple[str, ...]:
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


def _environment(build: Section, isolation: bool) -> BuildEnvironment:
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


def _index_url(section: Section, key: str, url: str) -> str:
    import urllib.parse

    shown = without_secrets(url)
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
        or not (parts.path if scheme == "file" else parts.hostname)
    ):
        raise BadInput(f"{section.path}: build.environment.{key} has {shown!r}; use {INDEX_FORM}")
    return url


def _tests(section: Section, gpu: bool = True) -> tuple[TestCommand, ...]:
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


def _check_wheel_version(section: Section, template: str) -> None:
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
    """Whether `version` is a public version and a local label in their canonical forms (`0.33.0+carry.20260101.1`):
    then it is a PEP 440 version with a local label, told without importing packaging (which would cost every command
    that loads build.yaml more than the rest of the file); other forms are for packaging to judge."""
    public, plus, local = version.partition("+")
    return (
        bool(plus)
        and _canonical_public(public)
        and _dotted(local, lambda part: part.isalnum() and part.islower() or part.isdigit())
    )


def _canonical_public(version: str) -> bool:
    """Whether `version` is `N(.N)*[{a|b|rc}N][.postN][.devN]` (N ASCII digits): PEP 440's canonical public form."""
    parts = version.split(".")
    for segment in ("dev", "post"):  # from the end: .postN.devN
        if len(parts) > 1 and parts[-1].startswith(segment) and _dotted(parts[-1][len(segment) :], str.isdigit):
            parts.pop()
    for label in ("rc", "a", "b"):  # a pre-release is written onto the release's last number: 1.0rc1
        number, found, pre = parts[-1].partition(label)
        if found and _dotted(number, str.isdigit) and _dotted(pre, str.isdigit):
            parts[-1] = number
            break
    return all(_dotted(part, str.isdigit) for part in parts)


def _dotted(text: str, each: Callable[[str], bool]) -> bool:
    return all(part.isascii() and part and each(part) for part in text.split("."))
