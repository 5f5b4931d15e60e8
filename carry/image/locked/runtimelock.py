"""The runtime lock: per platform, the fixed wheel's Requires-Dist resolved with uv into pinned, sha256-hashed wheels
for the Python and glibc of that platform's runtime base image, written beside build.yaml as
`<image.lock>/<os>-<arch>.txt` and committed.

The body is `uv pip compile --generate-hashes --only-binary :all:` output (each pin's hashes narrowed to the target's
wheels), so pip and uv both install it with --require-hashes; carry's header above it records what it was resolved from,
by content digest, never a local image ID, so a lock made on one machine is fresh on another. `check_fresh` refuses a
lock whose inputs drifted.

The index is the user's: uv's own configuration, else pip's http(s) index-url / extra-index-url (a file:// index is this
machine's own disk), else uv's default. Index URLs reach uv through its environment, never argv, and are printed without
credentials."""

from __future__ import annotations

import dataclasses
import email.parser
import hashlib
import re
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from carry.binaries import wheelzip
from carry.config import Config
from carry.config.reader import public_url, strip_credentials
from carry.image.locked import cudatoolkit
from carry.platforms import Platform
from carry.util import reporter
from carry.util.cache import Cache
from carry.util.errors import BadInput, CarryError, Failed, read_input
from carry.util.fsutil import atomic_write_text, temp_dir
from carry.util.run import NETWORK_S, execute

if TYPE_CHECKING:
    from carry.image.locked.runtimebase import RuntimeBase

FORMAT = 2
TITLE = "# carry runtime lock: written by `build.py lock`; do not edit (relock: build.py lock)"
HEADER_KEYS: tuple[str, ...] = ("format", "platform", "python", "target", "base", "base-content", "base-python")
HEADER_KEYS += ("requires-dist", "requires")
# Format 1 named the base by its local image ID (`base: REF@sha256:ID`): read, so that it is stale, not garbled.
HEADER_KEYS_1 = ("format", "platform", "python", "target", "base", "requires-dist", "requires")
UV_INDEX_ENV = ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")
UV_INDEX_KEYS = ("index-url", "extra-index-url", "index", "find-links")
PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")
HASH_RE = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


@dataclasses.dataclass(frozen=True)
class Locked:
    """One pinned distribution of the lock: its canonical name, version and every sha256 the index lists for it."""

    name: str
    version: str
    hashes: tuple[str, ...]  # "sha256:<hex>"


@dataclasses.dataclass(frozen=True)
class Lock:
    """A lock file as read: where it is, what it was resolved from (its header), and its pins."""

    path: Path
    platform: Platform
    python: str
    target: str
    base: str  # the runtime image's reference, as configured
    base_content: str  # its content digest ("sha256:<hex>", runtimebase.content_digest)
    requires_digest: str  # "sha256:<hex>" of the Requires-Dist (requires_digest)
    requires: str  # the locked wheel's name==version (informational)
    packages: tuple[Locked, ...]
    config: Path | None = None  # the build.yaml it belongs to (for the relock command)
    base_python: str = "own"  # where the base's python3 comes from: "own", or "<method> sha256:<recipe hash>"


@dataclasses.dataclass(frozen=True)
class BaseFacts:
    """What the runtime base of a platform says about itself, and what names it in the lock."""

    python: str  # "3.11.2"
    glibc: str  # "2.36"
    content: str  # the runtime image's content digest, "sha256:<hex>" (runtimebase.content_digest)
    ref: str  # the reference configured (image.platforms.<p>.runtime_image, else image.runtime_image)
    base_python: str = "own"  # "own", or "<method> sha256:<recipe hash>" when carry derived the base
    base: RuntimeBase | None = dataclasses.field(default=None, compare=False)  # as resolved (lock, image)

    def target(self, platform: Platform) -> str:
        """uv's --python-platform for this base: `aarch64-manylinux_2_36`."""
        major, minor = self.glibc.split(".")[:2]
        return f"{platform.machine}-manylinux_{major}_{minor}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One platform's lock after `lock`: what it holds and whether the file changed."""

    lock: Lock
    written: bool

    def line(self, root: Path) -> str:
        done = f"wrote {_shown(self.lock.path, root)}" if self.written else "up to date"
        return (
            f"{self.lock.platform}: {len(self.lock.packages)} packages, python {self.lock.python}, target "
            f"{self.lock.target}, base {self.lock.base} ({_short(self.lock.base_content)}, python "
            f"{short_python(self.lock.base_python)}): {done}"
        )


# --- the file ------------------------------------------------------------------------------------------------


def requires_digest(requires_dist: Iterable[str]) -> str:
    """sha256 of the sorted, de-duplicated Requires-Dist lines joined by newlines: `sha256:<hex>`."""
    lines = sorted({" ".join(str(line).split()) for line in requires_dist if str(line).strip()})
    return "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()


def lock_dir(config: Config) -> Path:
    if config.image.lock is None:
        raise BadInput(
            f"{config.path}: image.lock is not set; add `lock: runtime-lock` under image (the directory "
            f"beside build.yaml the runtime lock is written to)"
        )
    return config.image.lock


def lock_path(config: Config, platform: Platform) -> Path:
    """`<config dir>/<image.lock>/<os>-<arch>.txt`, e.g. runtime-lock/linux-arm64.txt."""
    return lock_dir(config) / f"{platform.os}-{platform.tag}.txt"


def relock_command(config_path: Path | None) -> str:
    """`carry lock` (or `build.py lock`, as the user ran it), with --config when the config is not ./build.yaml."""
    from carry.util import prog

    if config_path is None or Path(config_path).absolute() == Path("build.yaml").absolute():
        return prog.command("lock")
    return prog.command("--config", str(_shown(Path(config_path), Path.cwd())), "lock")


def render(platform: Platform, facts: BaseFacts, digest: str, requires: str, body: str) -> str:
    values: tuple[str, ...] = (str(FORMAT), str(platform), facts.python, facts.target(platform), facts.ref)
    values += (facts.content, facts.base_python, digest, requires)  # in the order of HEADER_KEYS
    lines = [TITLE, *(f"# {key}: {value}" for key, value in zip(HEADER_KEYS, values))]
    return "\n".join(lines) + "\n" + body.rstrip("\n") + "\n"


def read(config: Config, platform: Platform) -> Lock:
    """The lock of `platform`; bad input naming the file and the relock command when it is missing or garbled."""
    path = lock_path(config, platform)
    relock = relock_command(config.path)
    text = read_input(path, lambda exc: f"{path}: cannot be read ({exc}); run `{relock}`")
    if text is None:
        raise BadInput(f"{_shown(path, Path.cwd())}: no runtime lock for {platform}; run `{relock}`")
    return parse(text, path, platform, relock, config.path)


def parse(
    text: str, path: Path, platform: Platform, relock: str = "build.py lock", config_path: Path | None = None
) -> Lock:
    def garbled(why: str) -> BadInput:
        return BadInput(f"{path}: not a carry runtime lock ({why}); do not edit it, run `{relock}`")

    lines = text.splitlines()
    if not lines or lines[0] != TITLE:
        raise garbled("its first line is not carry's")
    fmt = lines[1].removeprefix("# format: ").strip() if len(lines) > 1 else ""
    keys = HEADER_KEYS_1 if fmt == "1" else HEADER_KEYS
    header: dict[str, str] = {}
    for line in lines[1 : 1 + len(keys)]:
        key, sep, value = line.removeprefix("# ").partition(": ")
        if not line.startswith("# ") or not sep:
            raise garbled(f"header line {line!r}")
        header[key] = value.strip()
    missing = [key for key in keys if key not in header]
    if missing:
        raise garbled(f"no {missing[0]} in its header")
    if header["format"] not in ("1", str(FORMAT)):
        raise garbled(f"format {header['format']}, this carry reads {FORMAT}")
    if header["platform"] != str(platform):
        raise garbled(f"it is for {header['platform']}, not {platform}")
    if fmt == "1":  # the base by its local image ID: never equal to a content digest, so the lock is stale
        base, _, image_id = header["base"].rpartition("@")
        header.update({"base": base or header["base"], "base-content": f"image ID {image_id}", "base-python": "own"})
    elif not re.fullmatch(r"sha256:[0-9a-f]{64}", header["base-content"]):
        raise garbled(f"base-content {header['base-content']!r} is not sha256:<hex>")
    packages = _packages(lines[1 + len(keys) :], garbled)
    toolkit = cudatoolkit.mismatch({p.name: p.version for p in packages})
    if toolkit is not None:
        raise BadInput(f"{_shown(path, Path.cwd())}: {toolkit.line()}; relock: `{relock}`")
    return Lock(
        path,
        platform,
        header["python"],
        header["target"],
        header["base"],
        header["base-content"],
        header["requires-dist"],
        header["requires"],
        packages,
        config_path,
        header["base-python"],
    )


def _packages(lines: Sequence[str], garbled: Callable[[str], BadInput]) -> tuple[Locked, ...]:
    found: list[Locked] = []
    name: str | None = None
    version = ""  # the version of `name`'s pin line, once one is read
    hashes: list[str] = []
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        pin = PIN_RE.match(text)
        if pin:
            if name is not None:
                found.append(Locked(name, version, tuple(hashes)))
            name, version, hashes = canonicalize_name(pin.group(1)), pin.group(3), []
            hashes += HASH_RE.findall(text)
        elif text.startswith("--hash=") and name is not None:
            if not HASH_RE.match(text):
                raise garbled(f"hash line {text!r}")
            hashes += HASH_RE.findall(text)
        else:
            raise garbled(f"line {text!r}")
    if name is not None:
        found.append(Locked(name, version, tuple(hashes)))
    unhashed = next((p.name for p in found if not p.hashes), None)
    if unhashed:
        raise garbled(f"{unhashed} has no --hash")
    return tuple(found)


# --- freshness -----------------------------------------------------------------------------------------------


def drift(lock: Lock, *, requires_dist: Iterable[str], base: BaseFacts) -> tuple[str, ...]:
    """What changed since the lock was made, each as `what old -> new`; empty when it is fresh."""
    changes = list(_requires_drift(lock, requires_dist))
    if base.content != lock.base_content:
        changes.append(f"base {lock.base} {_short(lock.base_content)} -> {_short(base.content)}")
    if base.base_python != lock.base_python:
        changes.append(f"base-python {short_python(lock.base_python)} -> {short_python(base.base_python)}")
    if base.python != lock.python:
        changes.append(f"python {lock.python} -> {base.python}")
    return tuple(changes)


def check_requires(lock: Lock, requires_dist: Iterable[str]) -> None:
    """Bad input (stale_line) when `lock` was not made from these Requires-Dist lines; before any base is read."""
    changes = _requires_drift(lock, requires_dist)
    if changes:
        raise BadInput(stale_line(lock, changes))


def _requires_drift(lock: Lock, requires_dist: Iterable[str]) -> tuple[str, ...]:
    """`requires-dist old -> new` when the Requires-Dist lines are not the ones `lock` was made from; else empty."""
    digest = requires_digest(requires_dist)
    if digest == lock.requires_digest:
        return ()
    return (f"requires-dist {_short(lock.requires_digest)} -> {_short(digest)}",)


def check_fresh(lock: Lock, *, requires_dist: Iterable[str], base: BaseFacts) -> None:
    """Bad input (one line: the file, what drifted old -> new, the relock command) unless `lock` was made from
    these Requires-Dist lines and this base (its content digest, where its Python comes from, its Python)."""
    changes = drift(lock, requires_dist=requires_dist, base=base)
    if changes:
        raise BadInput(stale_line(lock, changes))


def require_fresh(config: Config, platform: Platform, wheel: Path, cache: Cache | None = None) -> Lock:
    """The lock of `platform`, read and checked (check_fresh) against `wheel` and the runtime base as it is now."""
    current = read(config, platform)
    with reporter.silenced():  # the base's own lines are the lock's and the image's, not a check's
        base = base_facts(config, platform, cache)
    check_fresh(current, requires_dist=wheel_metadata(wheel)[1], base=base)
    return current


def stale_line(lock: Lock, changes: Sequence[str]) -> str:
    return (
        f"{_shown(lock.path, Path.cwd())} is stale ({lock.platform}): {'; '.join(changes)}; relock: "
        f"`{relock_command(lock.config)}`"
    )


def _short(digest: str) -> str:
    return digest[:19] + "…" if len(digest) > 19 else digest


def short_python(value: str) -> str:
    """`apt sha256:1234567890ab…` for a derived base's recipe, `own` as it is."""
    method, _, digest = value.partition(" ")
    return f"{method} {_short(digest)}" if digest else value


def _shown(path: Path, root: Path) -> str:
    try:
        return str(Path(path).absolute().relative_to(Path(root).absolute()))
    except ValueError:
        return str(path)


# --- the wheel -------------------------------------------------------------------------------------------------


def wheel_metadata(wheel: Path) -> tuple[str, tuple[str, ...]]:
    """The wheel's `name==version` and its Requires-Dist lines (METADATA), read without inflating anything else."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = wheelzip.dist_info(archive)
            metadata = email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    except (OSError, KeyError, Failed, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise Failed(f"{wheel}: its METADATA cannot be read ({exc})") from None
    name = canonicalize_name(metadata.get("Name") or "")
    return f"{name}=={metadata.get('Version')}", tuple(metadata.get_all("Requires-Dist") or ())


# --- the base image ----------------------------------------------------------------------------------------------


def base_facts(config: Config, platform: Platform, cache: Cache | None = None, known: dict | None = None) -> BaseFacts:
    """The runtime base's Python version and glibc, read by running its own python3 (runtimebase.resolve: pulled,
    derived or as `known` records it), and what names it: its content digest and where its Python comes from."""
    from carry.image.locked import runtimebase

    base = runtimebase.resolve(config, platform, cache or Cache.from_env(), known)
    return BaseFacts(base.python_version, base.glibc, base.content, base.ref, base.python, base)


def bases(
    config: Config, platforms: Sequence[Platform], cache: Cache, known: dict | None = None
) -> dict[Platform, BaseFacts]:
    """base_facts of every platform, at the same time (a derivation under QEMU beside a native one), then each
    base's line. The first failure is raised once every platform has finished, before any of those lines.
    `known`: per platform, the base a previous image in the registry records (runtimebase.resolve)."""
    known, each = known or {}, reporter.carried(base_facts)
    with ThreadPoolExecutor(max_workers=max(1, len(platforms))) as pool:
        futures = [pool.submit(each, config, platform, cache, known.get(platform)) for platform in platforms]
    found = {platform: future.result() for platform, future in zip(platforms, futures)}
    for facts in found.values():
        assert facts.base is not None  # base_facts records the base it resolved
        reporter.phase("base", facts.base.note)
    return found


# --- the index ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Index:
    """Where uv resolves from: the environment it gets (the index variables added) and a line saying which."""

    environ: dict[str, str]
    source: str


def choose_index(
    environ: Mapping[str, str], cwd: Path, pip_config: Callable[[], dict[str, str]] | None = None
) -> Index:
    """uv's own index settings when it has any; else pip's http(s) index-url / extra-index-url; else uv's default."""
    env = dict(environ)
    if _uv_has_index(env, cwd):
        return Index(env, "uv's own index settings")
    if pip_config is None:
        from carry.util.index import pip_indexes

        settings = pip_indexes("install")  # pip's own precedence: PIP_* over [install] over [global]
    else:
        settings = pip_config()
    skipped = []
    index = settings.get("index-url")
    if index and not _remote(index):
        skipped.append(index)
        index = None
    extra: list[str] = []
    for url in settings.get("extra-index-url", "").split():
        (extra if _remote(url) else skipped).append(url)
    shown = []
    if index:
        env["UV_INDEX_URL"] = index
        shown.append(f"pip's index-url {public_url(index)}")
    if extra:
        env["UV_EXTRA_INDEX_URL"] = " ".join(extra)
        shown.append(f"pip's extra-index-url {' '.join(public_url(u) for u in extra)}")
    source = ", ".join(shown) or "uv's default index (neither uv nor pip names one)"
    if skipped:
        source += (
            f"; skipped pip's local {' '.join(public_url(u) for u in skipped)} (a lock names files any "
            f"machine can fetch)"
        )
    return Index(env, source)


def _remote(url: str) -> bool:
    return url.lower().startswith(("https://", "http://"))


def _uv_has_index(env: Mapping[str, str], cwd: Path) -> bool:
    if any(env.get(name, "").strip() for name in UV_INDEX_ENV):
        return True
    if env.get("UV_NO_CONFIG"):
        return False
    return any(_toml_names_index(path) for path in _uv_config_files(env, cwd))


def _uv_config_files(env: Mapping[str, str], cwd: Path) -> list[Path]:
    """uv's configuration files as uv finds them: $UV_CONFIG_FILE, else the project's, the user's and the system's."""
    if env.get("UV_CONFIG_FILE"):
        return [Path(env["UV_CONFIG_FILE"])]
    found: list[Path] = []
    for directory in [cwd, *cwd.parents]:
        if (directory / "uv.toml").is_file() or (directory / "pyproject.toml").is_file():
            found += [directory / "uv.toml", directory / "pyproject.toml"]
            break
    home = Path(env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config"))
    found.append(home / "uv" / "uv.toml")
    found += [Path(system) / "uv" / "uv.toml" for system in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")]
    found.append(Path("/etc/uv/uv.toml"))
    return found


def _toml_names_index(path: Path) -> bool:
    import tomllib

    try:
        data = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("uv", {})
    tables = [data, data.get("pip", {})] if isinstance(data, dict) else []
    return any(isinstance(t, dict) and any(key in t for key in UV_INDEX_KEYS) for t in tables)


# --- resolving ---------------------------------------------------------------------------------------------------


def resolve(
    requires: Sequence[str],
    platform: Platform,
    facts: BaseFacts,
    index: Index,
    scratch: Path,
    previous: str | None = None,
    upgrade: bool = False,
    cwd: Path | None = None,
) -> str:
    """The lock body: uv pip compile of `requires` for the base's Python and glibc, wheels only, hashed, the previous
    pins preferred unless `upgrade`; a CUDA toolkit of several releases is resolved again held to the runtime's."""
    from carry.wheelbuild.buildenv import find_uv

    uv = find_uv()
    with temp_dir(scratch, "lock-") as work:
        wanted = work / "requirements.in"
        wanted.write_text("".join(f"{line}\n" for line in requires))
        out = work / "lock.txt"
        if previous and not upgrade:
            out.write_text(previous)
        target = ["--python-platform", facts.target(platform), "--python-version", facts.python]
        args = ["pip", "compile", str(wanted), "--output-file", str(out), *target, "--generate-hashes"]
        args += ["--only-binary", ":all:", "--no-header", "--no-annotate", "--quiet", "--color", "never"]
        if upgrade:
            args.append("--upgrade")
        body = _compile(uv.path, args, cwd or work, platform, facts, index, out)
        pins = _pins(body)
        toolkit = cudatoolkit.mismatch(pins)
        if toolkit is not None:
            held = work / "cuda-toolkit.txt"
            held.write_text("".join(f"{line}\n" for line in cudatoolkit.constraints(pins, toolkit)))
            try:
                body = _compile(uv.path, [*args, "--constraint", str(held)], cwd or work, platform, facts, index, out)
            except BadInput as exc:
                raise BadInput(f"{exc}; {toolkit.line()}") from None
            moved = _pins(body)
            reporter.note(
                f"{platform}: CUDA toolkit held to {toolkit.release} ({toolkit.anchor[0]} {toolkit.anchor[1]}, "
                f"torch's): " + ", ".join(f"{n} {v} -> {moved.get(n, 'gone')}" for n, v in toolkit.others)
            )
        return narrow(body, _installable(uv.path, out, work, cwd or work, platform, facts, index))


def _compile(uv: str, args: list[str], cwd: Path, platform: Platform, facts: BaseFacts, index: Index, out: Path) -> str:
    """One `uv pip compile` (args as resolve makes them): the body it wrote, or its failure in one line."""
    try:
        done = execute([uv, *args], cwd=cwd, env=index.environ, text=True, timeout=NETWORK_S)
    except OSError as exc:
        raise BadInput(f"uv at {uv} cannot run ({exc.strerror}); reinstall it: pip install uv") from None
    if done.returncode != 0:
        raise _failure(platform, facts, done.stderr, index)
    return out.read_text()


def _pins(body: str) -> dict[str, str]:
    """canonical name -> version of uv's requirements output (read as a lock's pins are)."""
    return {p.name: p.version for p in _packages(body.splitlines(), lambda why: BadInput(f"uv wrote {why}"))}


def _installable(
    uv: str, locked: Path, work: Path, cwd: Path, platform: Platform, facts: BaseFacts, index: Index
) -> dict[str, set[str]]:
    """Per package of the resolved lock, the sha256 of each of its wheels that installs on the target: uv's
    pylock.toml of exactly those pins (`--no-deps`), which lists only the wheels for the target."""
    import tomllib

    out = work / "pylock.toml"
    target = ["--python-platform", facts.target(platform), "--python-version", facts.python]
    args = ["pip", "compile", str(locked), "--no-deps", "--output-file", str(out), "--format", "pylock.toml", *target]
    args += ["--only-binary", ":all:", "--quiet", "--color", "never"]
    # uv's cache has just been refreshed for exactly these pins: read it offline, online only if that fails
    for mode in (["--offline"], []):
        done = execute([uv, *args, *mode], cwd=cwd, env=index.environ, text=True, timeout=NETWORK_S)
        if done.returncode == 0:
            break
    if done.returncode != 0:
        raise _failure(platform, facts, done.stderr, index)
    found: dict[str, set[str]] = {}
    for package in tomllib.loads(out.read_text()).get("packages", []):
        wheels = package.get("wheels", [])
        found[canonicalize_name(package["name"])] = {
            f"sha256:{w['hashes']['sha256']}" for w in wheels if "sha256" in w.get("hashes", {})
        }
    return found


def narrow(body: str, installable: Mapping[str, set[str]]) -> str:
    """uv's requirements output with each pin's hashes narrowed to those of its wheels for the target (uv lists
    every file of the version, for every platform); a pin with none of them known keeps all."""
    blocks: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        text = line.strip().removesuffix("\\").strip()
        if not text:
            continue
        if text.startswith("--hash="):
            blocks[-1][1].append(text.removeprefix("--hash="))
        else:
            blocks.append((text, []))
    lines = []
    for pin, hashes in blocks:
        match = PIN_RE.match(pin)
        wanted = installable.get(canonicalize_name(match.group(1)), set()) if match else set()
        kept = [h for h in hashes if h in wanted] or hashes
        lines.append(" \\\n".join([pin, *(f"    --hash={h}" for h in kept)]))
    return "\n".join(lines) + "\n"


def _failure(platform: Platform, facts: BaseFacts, stderr: str, index: Index) -> CarryError:
    """uv's error in one line: an unsatisfiable requirement is bad input naming it; the network is a failure."""
    text = strip_credentials(stderr)
    error = next((line.split("error:", 1)[1].strip() for line in text.splitlines() if "error:" in line), "")
    causes = [line.split("cause:", 1)[1].strip() for line in text.splitlines() if "cause:" in line]
    reason = " ".join(" ".join([error, *causes]).split()) or " ".join(text.split())[-300:]
    where = f"{platform} (target {facts.target(platform)}, python {facts.python}; {index.source.split(';')[0]})"
    if error.startswith("No solution found"):
        named = re.findall(r"\b([A-Za-z0-9][A-Za-z0-9._-]*)==[^\s,]+ has no (?:usable|matching|compatible)", reason)
        culprit = f"{named[0]}: " if named else ""
        cause = (" ".join(causes) or error).rstrip(".")
        return BadInput(
            f"runtime lock for {where}: {culprit}{cause}; pin a version with wheels for this target "
            f"with a patch, or change the runtime image"
        )
    return Failed(f"runtime lock for {where}: uv pip compile failed: {reason}")


# --- lock ---------------------------------------------------------------------------------------------------------


def platforms_to_lock(config: Config, given: Sequence[Platform] = ()) -> tuple[Platform, ...]:
    lock_dir(config)
    chosen = tuple(dict.fromkeys(given)) or tuple(t.platform for t in config.image.platforms)
    if not chosen:
        raise BadInput(
            f"{config.path}: image.platforms lists no platform to lock; list them (e.g. [linux/amd64, "
            f"linux/arm64]) or pass --platform"
        )
    return chosen


def lock(
    config: Config,
    cache: Cache,
    facts: Mapping[Platform, BaseFacts],
    wheels: Mapping[Platform, Path],
    index: Index,
    upgrade: bool = False,
) -> tuple[Outcome, ...]:
    """Resolve every platform at once, then write the files that changed (none unless all resolved)."""

    def one(platform: Platform) -> tuple[Platform, Path, str]:
        found = facts[platform]
        requires, dist = wheel_metadata(wheels[platform])
        path = lock_path(config, platform)
        body = resolve(dist, platform, found, index, cache.scratch, _previous_body(path), upgrade, config.root)
        reporter.phase(
            "resolve",
            f"{platform}: resolved {len(dist)} Requires-Dist line(s) of {requires} for {found.target(platform)}",
        )
        return platform, path, render(platform, found, requires_digest(dist), requires, body)

    with ThreadPoolExecutor(max_workers=max(1, len(facts))) as pool:
        made = list(pool.map(reporter.carried(one), facts))  # in order; the first failure is raised
    outcomes = []
    for platform, path, text in made:
        written = not path.is_file() or path.read_text() != text
        if written:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, text)
        outcomes.append(Outcome(parse(text, path, platform, relock_command(config.path), config.path), written))
    return tuple(outcomes)


def _previous_body(path: Path) -> str | None:
    """The pins of the lock there now (uv's preferences), without carry's header; None when there is none."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip("\n") != TITLE:
        return None
    while lines and lines[0].startswith("#"):  # carry's header, of any format
        lines.pop(0)
    return "".join(lines)


def check(
    config: Config, facts: Mapping[Platform, BaseFacts], wheels: Mapping[Platform, Path]
) -> tuple[tuple[Platform, str | None], ...]:
    """Per platform, None when its lock is fresh, else the one line saying what drifted (or that it is missing)."""
    found: list[tuple[Platform, str | None]] = []
    for platform, base in facts.items():
        dist = wheel_metadata(wheels[platform])[1]
        try:
            current = read(config, platform)
        except BadInput as exc:
            if lock_path(config, platform).exists():
                raise
            found.append((platform, str(exc)))
            continue
        changes = drift(current, requires_dist=dist, base=base)
        found.append((platform, stale_line(current, changes) if changes else None))
    return tuple(found)
