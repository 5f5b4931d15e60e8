"""The environment an upstream builds in when carry calls its PEP 517 backend itself (`build_isolation: false`;
docs/builds.md, "The build environment"): a venv uv makes from the upstream's `[build-system] requires` plus
build.environment under `$CARRY_CACHE/envs/<key>/`, keyed by a sha256 over what went in. A venv cannot be moved, so
it is made in place under a lock, its marker file written last (a directory without one is made again). Index URLs
(which may hold `user:password@`) reach uv through its environment only, and are printed and keyed without them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform as host
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TextIO

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from carry.config.build import BuildEnvironment
from carry.config.reader import public_url, strip_credentials
from carry.platforms import Platform
from carry.util import reporter
from carry.util.cache import Cache
from carry.util.errors import BadInput, CarryError, Failed
from carry.util.fsutil import atomic_write_text, no_space_line, says_no_space, tree_size
from carry.util.run import NETWORK_S, execute

try:
    import tomllib
except ImportError:  # Python 3.10: `build` depends on tomli there
    import tomli as tomllib  # type: ignore[no-redef]

ENVS_DIR = "envs"
MARKER = "carry-env.json"
MARKER_FORMAT = 1
# What pip and `build` assume for a project without a [build-system] table (PEP 518's legacy default).
LEGACY_REQUIRES = ("setuptools>=40.8.0",)
# Shown first in the build line when present; every package the upstream or build.yaml names is shown too.
KEY_PACKAGES = (
    "torch",
    "setuptools",
    "setuptools-scm",
    "setuptools-rust",
    "scikit-build-core",
    "wheel",
    "packaging",
    "cmake",
    "ninja",
)
# The caller's uv variables that change how uv works (cache location, network, TLS), not what it installs.
UV_KEPT = frozenset(
    {
        "UV_CACHE_DIR",
        "UV_HTTP_TIMEOUT",
        "UV_HTTP_RETRIES",
        "UV_CONCURRENT_DOWNLOADS",
        "UV_CONCURRENT_BUILDS",
        "UV_CONCURRENT_INSTALLS",
        "UV_NATIVE_TLS",
    }
)
DROPPED_PREFIXES = ("UV_", "PIP_", "PYTHON")
DROPPED = frozenset({"VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV"})
NETWORK_SIGNS = (
    "request failed",
    "failed to fetch",
    "failed to download",
    "error sending request",
    "dns error",
    "tcp connect error",
    "connection refused",
    "timed out",
    "network is unreachable",
)
FIX_EXTRA = "fix build.environment.requires"
FIX_UPSTREAM = "change the upstream's [build-system] requires with a patch"
# Run by the env's own interpreter: every distribution and its version. torch's metadata says 2.14.0 for every
# build of it; the build it is (2.14.0+cu130, +cpu) is in torch/version.py, read without importing torch.
VERSIONS_SCRIPT = """
import ast, importlib.metadata as metadata, json
found = []
for dist in metadata.distributions():
    name, version = dist.metadata["Name"], dist.version
    if name and name.lower() == "torch":
        try:
            tree = ast.parse(dist.locate_file("torch/version.py").read_text())
        except (OSError, SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        for node in tree.body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and any(getattr(target, "id", None) == "__version__" for target in node.targets)):
                version = str(node.value.value)
    found.append((name or "", version))
print(json.dumps(sorted(found)))
"""


# uv -----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Uv:
    path: str
    version: str


@functools.cache
def find_uv() -> Uv:
    """The uv binary of the `uv` package installed next to carry, and the package's version (uv not started)."""
    from importlib import metadata

    try:
        import uv

        path = uv.find_uv_bin()
        version = metadata.version("uv")
    except (ImportError, FileNotFoundError, metadata.PackageNotFoundError):
        raise BadInput(
            f"uv is not installed for {sys.executable}; run `{sys.executable} -m pip install uv` "
            f"(carry makes the build environment with it)"
        ) from None
    return Uv(path, version)


def uv_environ(extra: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment for uv, without the variables that would change what it installs."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name in UV_KEPT or not (name.startswith(DROPPED_PREFIXES) or name in DROPPED)
    }
    env.update(extra)
    return env


# requirements -------------------------------------------------------------------------------------------------


def normalize_requirement(text: str, where: str) -> str:
    """One requirement in a canonical form (name normalized, specifiers and extras sorted); bad input otherwise."""
    if not isinstance(text, str):
        raise BadInput(f"{where} has {text!r}, which is not a requirement string; write it like 'torch==2.14.0'")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]
        raise BadInput(
            f"{where} has {strip_credentials(text.strip())!r}, which is not a PEP 508 requirement "
            f"({reason}); write it like 'torch==2.14.0'"
        ) from None
    if requirement.url and public_url(requirement.url) != requirement.url:
        raise BadInput(
            f"{where} has {requirement.name} @ {public_url(requirement.url)} with a user:password in "
            f"its URL; give the credentials to an index URL (build.environment.index_url) instead"
        )
    requirement.name = canonicalize_name(requirement.name)
    return str(requirement)


def requires_from_pyproject(pyproject: dict, where: str = "pyproject.toml") -> tuple[str, ...]:
    """A parsed pyproject.toml's `[build-system] requires`, normalized (PEP 518's legacy default without one)."""
    system = pyproject.get("build-system")
    if system is None:
        return LEGACY_REQUIRES
    requires = system.get("requires") if isinstance(system, dict) else None
    if not isinstance(requires, list):
        raise BadInput(
            f"{where}: [build-system] requires must be a list of requirements (PEP 518), got "
            f"{requires!r}; add a patch that fixes it or build with build_isolation: true"
        )
    return tuple(normalize_requirement(text, f"{where} [build-system] requires") for text in requires)


def requires_of_tree(mirror: Path, tree: str) -> tuple[str, ...]:
    """The build requirements of a tree in the mirror (its pyproject.toml at the root)."""
    from carry.source import git

    text = git.show_blob(mirror, f"{tree}:pyproject.toml")
    if text is None:
        return LEGACY_REQUIRES
    try:
        pyproject = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(
            f"the upstream's pyproject.toml at {tree[:12]} is not TOML ({exc}); fix it with a patch"
        ) from None
    return requires_from_pyproject(pyproject, f"pyproject.toml at {tree[:12]}")


def requires_of(src: Path) -> tuple[str, ...]:
    """The build requirements of the source tree `src` (its pyproject.toml; the legacy default without one)."""
    path = Path(src) / "pyproject.toml"
    try:
        with open(path, "rb") as handle:
            pyproject = tomllib.load(handle)
    except FileNotFoundError:
        return LEGACY_REQUIRES
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"{path} cannot be read as TOML ({exc}); fix it with a patch") from None
    return requires_from_pyproject(pyproject, str(path))


# the spec -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Everything a build environment is made from, resolved once; `key` names it in the cache. `index_url` and
    `extra_index_urls` may hold `user:password@`: uv gets them through its environment; `public()` drops it."""

    requires: tuple[str, ...]  # the upstream's [build-system] requires, normalized
    extra: tuple[str, ...]  # build.environment.requires, normalized
    index_url: str | None  # replaces PyPI (uv's --index-url); None: PyPI
    extra_index_urls: tuple[str, ...]  # searched before the index, in order (uv's --extra-index-url)
    find_links: tuple[str, ...]  # local wheel directories (a hermetic build's wheelhouse)
    no_index: bool  # only find_links, no index at all
    python: str  # the interpreter the venv is made from
    python_version: str  # e.g. "CPython 3.11.7 (cpython-311)"
    platform: Platform
    libc: str  # e.g. "glibc 2.36": which manylinux wheels fit
    uv: Uv

    @classmethod
    def resolve(
        cls,
        requires: Iterable[str],
        environment: BuildEnvironment | None = None,
        *,
        python: str | None = None,
        find_links: Iterable[str | Path] = (),
        no_index: bool = False,
        where: str = "the upstream's [build-system] requires",
    ) -> EnvSpec:
        """A spec for `requires` (the upstream's) plus `environment` (build.environment), made with `python`
        (default: the interpreter carry runs in) and the uv installed with carry."""
        environment = environment or BuildEnvironment()
        uv = find_uv()
        interpreter = _interpreter(python or sys.executable)
        return cls(
            requires=tuple(normalize_requirement(text, where) for text in requires),
            extra=tuple(normalize_requirement(text, "build.environment.requires") for text in environment.requires),
            index_url=environment.index_url,
            extra_index_urls=tuple(environment.extra_index_urls),
            find_links=tuple(str(Path(p).absolute()) for p in find_links),
            no_index=no_index,
            python=interpreter["path"],
            python_version=interpreter["version"],
            platform=interpreter["platform"],
            libc=interpreter["libc"],
            uv=uv,
        )

    @property
    def requirements(self) -> tuple[str, ...]:
        """What uv is asked to install: the upstream's requires, then build.yaml's additions, each once."""
        return tuple(dict.fromkeys(self.requires + self.extra))

    def public(self) -> dict:
        """The inputs, without any credential: what the key is made of, and what the marker and JSON show."""
        return {
            "format": MARKER_FORMAT,
            "requires": sorted(set(self.requirements)),
            "index_url": public_url(self.index_url) if self.index_url else None,
            "extra_index_urls": [public_url(url) for url in self.extra_index_urls],
            "find_links": list(self.find_links),
            "no_index": self.no_index,
            "python": self.python,
            "python_version": self.python_version,
            "platform": str(self.platform),
            "libc": self.libc,
            "uv": self.uv.version,
        }

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.public(), sort_keys=True).encode()).hexdigest()

    def uv_environ(self) -> dict[str, str]:
        """The environment uv runs with: the caller's, cleaned, plus the indexes (credentials stay out of argv)."""
        indexes = {"UV_INDEX_URL": self.index_url or "", "UV_EXTRA_INDEX_URL": " ".join(self.extra_index_urls)}
        return uv_environ({name: value for name, value in indexes.items() if value})


def _interpreter(python: str) -> dict:
    """The interpreter's path, version, platform and libc (asked in-process for carry's own)."""
    if python == sys.executable:
        facts = _facts()
    else:
        import inspect

        script = f"{inspect.getsource(_facts)}\nimport json\nprint(json.dumps(_facts()))\n"
        try:
            done = execute([python, "-I", "-c", script], text=True, timeout=60)
        except OSError as exc:
            raise BadInput(f"python {python} cannot run ({exc.strerror}); give an existing interpreter") from None
        if done.returncode != 0:
            raise BadInput(f"python {python} cannot run carry's probe (exit {done.returncode}); use Python >= 3.10")
        facts = json.loads(done.stdout)
    if (found := Platform.from_machine(facts["machine"])) is None:
        raise BadInput(
            f"python {python} runs on {facts['machine']}, a CPU carry has no platform for; use "
            f"one of: {', '.join(str(p) for p in Platform)}"
        )
    return {**facts, "path": python, "platform": found}


def _facts() -> dict:
    """The running interpreter's path, version, machine and libc; another interpreter runs this function's own
    source, so it uses nothing but the standard library (that one need not have carry or its dependencies)."""
    import platform as host
    import sys

    libc, libc_version = host.libc_ver()
    return {
        "path": sys.executable,
        "version": f"{host.python_implementation()} {host.python_version()} ({sys.implementation.cache_tag})",
        "machine": host.machine(),
        "libc": f"{libc} {libc_version}".strip() or "unknown",
    }


# the environment ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BuildEnv:
    """A complete build environment: its venv, its key, what is installed in it, and how it was had."""

    root: Path
    key: str
    versions: dict[str, str]  # the key packages and every one the spec names, as installed (read from the env)
    packages: dict[str, str]  # everything installed in it
    uv_version: str
    reused: bool  # True: it existed; False: made by this call
    seconds: float  # what this call took
    downloaded: int | None = None  # packages uv fetched to make it (0: all from uv's cache); None when reused
    inputs: dict = dataclasses.field(default_factory=dict)  # EnvSpec.public(): what it was made from
    copied: bool = False  # uv could not hardlink from its cache (another filesystem): the env holds full copies

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def short(self) -> str:
        return self.key[:8]

    def describe(self) -> str:
        """`env 3f2a9c1b: torch 2.14.0+cu130, setuptools 80.9.0, … (uv 0.13.9, reused 0.01s)`."""
        shown = ", ".join(f"{name} {version}" for name, version in self.versions.items()) or "no packages"
        if self.reused:
            how = f"reused {self.seconds:.2f}s"
        elif self.downloaded:
            how = f"new {self.seconds:.1f}s, {len(self.packages)} packages, {self.downloaded} downloaded"
        else:
            how = f"new {self.seconds:.1f}s, {len(self.packages)} packages from uv's cache"
        if self.copied:
            how += ", copied from uv's cache (another filesystem)"
        return f"env {self.short}: {shown} (uv {self.uv_version}, {how})"

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "root": str(self.root),
            "python": str(self.python),
            "versions": dict(self.versions),
            "packages": dict(self.packages),
            "uv": self.uv_version,
            "reused": self.reused,
            "seconds": round(self.seconds, 6),
            "downloaded": self.downloaded,
            "inputs": dict(self.inputs),
            "copied": self.copied,
        }

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` as the upstream's build should see it in this env: its bin/ first on PATH (cmake, ninja), the
        venv active, and no PYTHONPATH/PYTHONHOME carrying another interpreter's packages in."""
        env = {name: value for name, value in base.items() if name not in ("PYTHONPATH", "PYTHONHOME")}
        env["VIRTUAL_ENV"] = str(self.root)
        env["PATH"] = os.pathsep.join(filter(None, [str(self.root / "bin"), base.get("PATH", os.defpath)]))
        return env


def env_dir(cache_root: Path, spec: EnvSpec) -> Path:
    return Path(cache_root).absolute() / ENVS_DIR / spec.key[:32]


def ensure(spec: EnvSpec, cache_root: Path) -> BuildEnv:
    """The build environment for `spec`: the one in the cache when it is complete, else made now."""
    start = time.monotonic()
    native = Platform.from_machine(host.machine())
    if spec.platform is not native:
        raise BadInput(
            f"a build environment for {spec.platform} cannot be made on this {native or host.machine()} "
            f"machine; build for it with `wheel --platform {spec.platform}`"
        )
    cache = Cache(Path(cache_root).absolute())
    root = env_dir(cache.root, spec)
    if (found := _complete(root, spec, start)) is not None:
        return found
    cache.ensure_writable()
    with cache.lock(f"env-{root.name}"):
        if (found := _complete(root, spec, start)) is not None:  # made by another run while this one waited
            return found
        reporter.phase(
            "env",
            f"making {spec.key[:8]} from {len(spec.requirements)} requirement(s) with uv {spec.uv.version} in {root}",
        )
        _remove(root)  # a run killed half-way left it, without the marker
        log = cache.logs / f"env-{root.name}.log"
        try:
            made = _make(spec, root, log, start)
        except Failed as exc:
            full = no_space_line(root, written=tree_size(root)) if says_no_space(str(exc)) else None
            _remove(root)
            if full is not None:
                raise Failed(f"build environment: {full}; log: {log}") from None
            raise
        except BaseException:
            _remove(root)
            raise
    if made.copied:
        reporter.phase(
            "env",
            "uv copied every file instead of hardlinking it: its cache is on another filesystem "
            "than $CARRY_CACHE; set UV_CACHE_DIR to a directory on the same one to save the disk",
        )
    return made


def _complete(root: Path, spec: EnvSpec, start: float) -> BuildEnv | None:
    """The env at `root` if its marker says it was finished for this key (and its interpreter still runs)."""
    try:
        marker = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("key") != spec.key or not (root / "bin" / "python").exists():
        return None
    return _recorded(root, marker, True, time.monotonic() - start)


def _recorded(root: Path, marker: dict, reused: bool, seconds: float, downloaded: int | None = None) -> BuildEnv:
    """The env at `root` as its marker records it (key, versions, packages, uv, inputs, copied)."""
    found = (marker["key"], marker["versions"], marker["packages"], marker["uv"])
    return BuildEnv(root, *found, reused, seconds, downloaded, marker["spec"], marker.get("copied", False))


def _remove(root: Path) -> None:
    if root.is_symlink() or root.is_file():
        root.unlink()
    elif root.exists():
        shutil.rmtree(root)


def _make(spec: EnvSpec, root: Path, log: Path, start: float) -> BuildEnv:
    root.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = spec.uv_environ()
    with open(log, "w") as handle:
        venv = ["venv", "--no-config", "--no-project", "--no-python-downloads", "--color", "never", "--python"]
        _uv(spec, [*venv, spec.python, str(root)], env, handle, log)
        python = root / "bin" / "python"
        sources = [arg for path in spec.find_links for arg in ("--find-links", path)]
        install = ["pip", "install", "--no-config", "--color", "never", "--python", str(python)]
        install += ["--no-index"] if spec.no_index else []
        installed = _uv(spec, [*install, *sources, "--", *spec.requirements], env, handle, log)
    packages = _installed(python, env)
    fetched = re.search(r"^Prepared (\d+) package", installed, re.MULTILINE)
    downloaded = int(fetched.group(1)) if fetched else 0
    seconds = time.monotonic() - start
    marker = {
        "key": spec.key,
        "spec": spec.public(),
        "versions": _key_versions(packages, spec),
        "packages": packages,
        "uv": spec.uv.version,
        "made_s": round(seconds, 3),
        "downloaded": downloaded,
        "copied": "falling back to full copy" in installed,
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_text(root / MARKER, json.dumps(marker, indent=2) + "\n")  # last: from here on it is complete
    return _recorded(root, marker, False, seconds, downloaded)


def _uv(spec: EnvSpec, args: list[str], env: dict[str, str], log: TextIO, log_path: Path) -> str:
    """Run uv (never through a shell), its output to the log; its stderr, or the one-line error it comes to."""
    command = [spec.uv.path, *args]
    log.write(f"$ uv {' '.join(args)}\n")
    log.flush()
    try:
        done = execute(command, env=env, text=True, cwd=log_path.parent, timeout=NETWORK_S)
    except OSError as exc:
        raise BadInput(f"uv at {spec.uv.path} cannot run ({exc.strerror}); reinstall it: pip install uv") from None
    log.write(strip_credentials(done.stdout + done.stderr))
    log.flush()
    if done.returncode != 0:
        raise _failure(spec, args[0] if args[0] == "venv" else "pip install", done.returncode, done.stderr, log_path)
    return done.stderr


def _failure(spec: EnvSpec, step: str, status: int, stderr: str, log: Path) -> CarryError:
    """uv's error distilled into one line: unsatisfiable → bad input naming the requirement; network → failed."""
    error, causes = _distill(strip_credentials(stderr))
    reason = "; ".join([error, *causes]) if error else f"exit {status}"
    if step == "pip install" and error.startswith("No solution found"):
        cause = " ".join(causes) or error
        named = [r for r in spec.requirements if re.search(rf"(?<![\w.-]){re.escape(_name(r))}(?![\w-])", cause)]
        culprits = named or list(spec.requirements)
        fixes = [FIX_EXTRA] if any(r in spec.extra for r in culprits) else []
        if any(r not in spec.extra for r in culprits):
            fixes.append(FIX_UPSTREAM)
        log.unlink(missing_ok=True)  # bad input writes nothing; this line says all the log would
        fix = " or ".join(fixes)
        return BadInput(
            f"build environment: {', '.join(culprits)} cannot be installed: {cause} "
            f"{fix[0].upper()}{fix[1:]}, or add an index that has it (build.environment.extra_index_urls)"
        )
    if any(sign in reason.lower() for sign in NETWORK_SIGNS):
        where = next((c for c in causes if c.startswith(("Failed to fetch", "Failed to download"))), error)
        last = causes[-1] if causes else error
        return Failed(
            f"build environment: uv could not reach the package index ({where}: {last}); check the "
            f"network and build.environment.index_url / extra_index_urls; log: {log}"
        )
    return Failed(f"build environment: uv {step} failed ({reason}); log: {log}")


def _distill(stderr: str) -> tuple[str, list[str]]:
    """uv's `error:` line and its `cause:` lines (continuation lines joined), whitespace collapsed."""
    error, causes = "", []
    current: list[str] | None = None
    for line in stderr.splitlines():
        text = line.strip()
        if text.startswith("error:"):
            error, current = text[len("error:") :].strip(), None
        elif text.startswith("cause:"):
            causes.append(text[len("cause:") :].strip())
            current = causes
        elif text.startswith(("hint:", "warning:", "help:")) or not text:
            current = None
        elif current is not None and causes:
            causes[-1] = f"{causes[-1]} {text}"
    return " ".join(error.split()), [" ".join(c.split()) for c in causes]


def _name(requirement: str) -> str:
    return Requirement(requirement).name


def _installed(python: Path, env: dict[str, str]) -> dict[str, str]:
    """Every distribution installed in the env, read by the env's own interpreter (isolated mode)."""
    try:
        done = execute([str(python), "-I", "-c", VERSIONS_SCRIPT], text=True, timeout=120, env=env)
        done.check_returncode()
        pairs = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise Failed(f"build environment: its python {python} cannot list what is installed ({exc})") from None
    return {canonicalize_name(name): version for name, version in pairs if name}


def _key_versions(packages: dict[str, str], spec: EnvSpec) -> dict[str, str]:
    named = [canonicalize_name(_name(r)) for r in spec.requirements]
    order = dict.fromkeys([*KEY_PACKAGES, *named])
    return {name: packages[name] for name in order if name in packages}


# the build stage's own environment ----------------------------------------------------------------------------

PROVIDED_ENV = "CARRY_BUILD_PYTHON"


def provided(python: str, spec: EnvSpec) -> BuildEnv:
    """The environment `$CARRY_BUILD_PYTHON` names (the image's build stage's venv), used as it is once every
    requirement of `spec` is satisfied there; the first that is not is bad input naming it."""
    from packaging.markers import default_environment
    from packaging.version import InvalidVersion, Version

    start = time.monotonic()
    path = Path(python)
    if not path.exists():
        raise BadInput(
            f"${PROVIDED_ENV} is {python}, which does not exist; unset it to let carry make the build environment"
        )
    packages = _installed(path, {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")})
    markers = default_environment()
    for text in spec.requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate(markers):  # type: ignore[arg-type]
            continue
        found = packages.get(canonicalize_name(requirement.name))
        try:
            ok = found is not None and requirement.specifier.contains(Version(found), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            has = f"has {found}" if found else "does not have it"
            raise BadInput(
                f"build environment {python} (${PROVIDED_ENV}) does not satisfy {text}: it {has}; "
                f"install it there or unset ${PROVIDED_ENV}"
            )
    digest = hashlib.sha256(json.dumps({"python": str(path), "packages": packages}, sort_keys=True).encode())
    return BuildEnv(
        path.parent.parent,
        digest.hexdigest(),
        _key_versions(packages, spec),
        packages,
        spec.uv.version,
        reused=True,
        seconds=time.monotonic() - start,
        inputs={**spec.public(), "provided": str(path)},
    )
