"""build.yaml, read once with YAML's safe loader into frozen records: `Config` and the `upstream:`, `patches:` and
`image:` sections here, `build:` in build.py, the `Section` reader and its shared checks in reader.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from carry.arch import ArchList
from carry.config.build import BUILD_KEYS, Build, read_build
from carry.config.reader import Section, command_argv, env_names, public_url
from carry.util.errors import BadInput, read_input
from carry.util.record import record

if TYPE_CHECKING:
    from carry.platforms import Platform

# libyaml's safe loader where PyYAML was built with it (its wheels are): the same documents, a tenth of the time
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
TOP_KEYS = ("upstream", "patches", "version_file", "build", "image")


@record
class Upstream:
    url: str
    pr: int | None
    commit: str
    main: str
    follow: str | None = None  # what `follow` moves to: pr, main, or a release-tag pattern (v*); None: pr or main

    @property
    def pr_ref(self) -> str | None:
        return f"refs/pull/{self.pr}/head" if self.pr is not None else None


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
    # the distribution's packages the runtime needs besides python3 (e.g. g++ for Triton's JIT): a derived base
    runtime_packages: tuple[str, ...] = ()


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
        """The arches a build promises: `given` (--arch), else the platform's, else build.cuda_arches ([]: no CUDA)."""
        if given is not None:
            return given
        configured = self.arches_for(platform)
        if configured is None:
            raise BadInput(
                f"{self.path}: build.cuda_arches is not set; set it (e.g. '9.0,12.1', or [] for a "
                f"Python-only wheel) or pass --arch"
            )
        return configured


def load(path: Path) -> Config:
    """Read and validate build.yaml."""
    path = Path(path).absolute()
    text = read_input(path, lambda exc: f"{path}: cannot read config ({exc}); check the file")
    if text is None:
        raise BadInput(f"{path}: config file not found; pass --config PATH to an existing build.yaml")
    try:
        data = yaml.load(text, Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise BadInput(f"{path}: YAML syntax error{where}: {problem}; fix the file") from None
    top = Section(data, "", path, TOP_KEYS)
    return Config(
        path=path,
        upstream=_upstream(top.section("upstream", ("url", "pr", "commit", "main", "follow")), path),
        patches_dir=path.parent / top.section("patches", ("dir",)).string("dir", "patches"),
        version_file=path.parent / top.string("version_file", "VERSION"),
        build=read_build(top.section("build", BUILD_KEYS)),
        image=_image(top.section("image", IMAGE_KEYS), path),
    )


# --- upstream: -----------------------------------------------------------------------------------------------------

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
SCP_LIKE_RE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^:]")
ALLOWED_SCHEMES = ("https", "ssh", "git", "file")


def _upstream(section: Section, path: Path) -> Upstream:
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
        follow=_follow(section),
    )


def _follow(section: Section) -> str | None:
    """upstream.follow: `pr`, `main`, or a tag pattern with a `*` (`v*`: the newest release tag matching it)."""
    value = section.string("follow")
    if value is not None and value not in ("pr", "main") and ("*" not in value or value.startswith("-")):
        raise section.fail("follow", "pr, main, or a release-tag pattern with a * (e.g. v*)")
    return value


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


# --- image: --------------------------------------------------------------------------------------------------------

DEFAULT_IMAGE_TAGS = ("{version}",)
TAG_FIELDS = ("version", "base_short", "cuda", "series_short")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# image.runtime_python: how a runtime image without python3 gets one (carry.image.locked.runtimebase).
RUNTIME_PYTHON_METHODS = ("apt",)
RUNTIME_PYTHON_VALUES = ("auto", *RUNTIME_PYTHON_METHODS, "off")
IMAGE_KEYS = tuple(Image.__annotations__)  # image:'s keys are Image's fields, in order
# a Debian package name (policy 5.6.1), optionally with an architecture qualifier: nothing a shell would read
PACKAGE_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+(:[a-z0-9]+)?")


def _image(section: Section, path: Path) -> Image:
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
        secret_env=env_names(section, "secret_env"),
        docker=section.string("docker", "docker"),
        lock=_lock_dir(section, path),
        entrypoint=_exec_form(section, "entrypoint"),
        cmd=_exec_form(section, "cmd", empty=True),
        runtime_python=_runtime_python(section) or "auto",
        runtime_packages=_runtime_packages(section),
    )


def check_image_name(name: str, path: Path) -> str:
    """A docker repository name: optional registry host[:port], lowercase path components."""
    # one component at a time: the same language as one whole-name pattern, whose compile alone cost 1-3 ms
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


def _runtime_python(section: Section) -> str | None:
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


def _runtime_packages(section: Section) -> tuple[str, ...]:
    """image.runtime_packages: distribution package names, installed by the derived base's own package manager."""
    names = section.strings("runtime_packages")
    if not all(PACKAGE_RE.fullmatch(name) for name in names):
        raise section.fail("runtime_packages", "a list of the distribution's package names, e.g. [g++, python3-dev]")
    return tuple(dict.fromkeys(names))


def _lock_dir(section: Section, path: Path) -> Path | None:
    """image.lock: a directory beside build.yaml (relative, inside the config's directory) for the runtime lock."""
    name = section.string("lock")
    if name is None:
        return None
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts or not parts:
        raise section.fail("lock", "a directory relative to the config's directory, e.g. runtime-lock")
    return path.parent / name


def _exec_form(section: Section, key: str, empty: bool = False) -> tuple[str, ...] | None:
    """image.entrypoint / image.cmd: a list of arguments (exec form), or a string split like a shell would."""
    value = section.data.get(key)
    if value is None:
        return None
    if isinstance(value, list) and not value and empty:
        return ()
    return tuple(command_argv(value, f"{section.path}: image.{key}"))


PLATFORM_KEYS = ("cuda_arches", "base_image", "runtime_image", "runtime_python")


def _platforms(section: Section) -> tuple[PlatformTarget, ...]:
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
        own = Section(settings, f"image.platforms.{name}", section.path, PLATFORM_KEYS)
        arches = own.data.get("cuda_arches")
        if arches is not None and not isinstance(arches, (str, list)):
            raise own.fail("cuda_arches", "a string like '12.1' or a list of arches")
        own_arches = ArchList.parse(arches) if arches is not None else None
        images = own.string("base_image"), own.string("runtime_image")
        targets.append(PlatformTarget(platform, own_arches, *images, _runtime_python(own)))
    return tuple(targets)


def _labels(section: Section) -> dict[str, str]:
    value = section.data.get("labels") or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise section.fail("labels", "a mapping of label: string")
    return dict(value)
