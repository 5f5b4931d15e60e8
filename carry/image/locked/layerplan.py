"""What goes in a locked image's layers, per platform (carry.image.locked.lockedimage): the lock's wheels fetched
into the download store, each wheel's install planned (carry.image.locked.wheelinstall) and grouped into the layers
venv, nvidia, torch, deps, vllm-release and vllm-fixed, the fixed wheel as its difference to the release wheel."""

from __future__ import annotations

import dataclasses
import email.parser
import hashlib
import json
import re
import shlex
import time
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from carry.binaries.wheelzip import record_hash
from carry.config import Config
from carry.image import gzlayer
from carry.image.locked import cudatoolkit, ocilayer, runtimelock, wheelinstall
from carry.image.locked.ocilayer import Item
from carry.image.locked.wheelinstall import Entry, Installed, Venv
from carry.image.vocabulary import ENTRYPOINT
from carry.platforms import Platform
from carry.util import prog, reporter
from carry.util.cache import Cache
from carry.util.download import Store, sha256_in_store
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import temp_dir
from carry.util.index import manylinux_tags, pip_download_command
from carry.util.integrity import file_sha256
from carry.util.run import NETWORK_S, execute

if TYPE_CHECKING:
    import docker

    from carry.image.locked.runtimebase import RuntimeBase

PREFIX = "/opt/venv"
TORCH_KIN = frozenset({"torch", "triton", "torchvision", "torchaudio", "torchcodec", "torch-c-dlpack-ext"})


def group_of(name: str) -> str:
    """Which of L2-L4 a locked wheel goes in, by its canonical name."""
    if name.startswith(("nvidia-", "cuda-")):
        return "nvidia"
    if name in TORCH_KIN:
        return "torch"
    return "deps"


# -- what goes in ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    name: str
    items: tuple[Item, ...]
    files: int
    installed: int
    overwritten: tuple[str, ...] = ()  # paths two wheels of this layer both install (kept once: _merge)
    recipe: str = ""  # a locked wheels' layer: its key from the lock (group_key), known before any wheel is read
    wheels: tuple[tuple[str, str, str], ...] = ()  # (name, file, sha256) of the locked wheels it was planned from
    planned: bool = True  # False: only its key is known (a locked wheels' layer the registry has: no wheel read)

    @property
    def key(self) -> str:
        """sha256 over what the layer's bytes depend on: the lock's wheels for nvidia, torch and deps (group_key);
        for the others every item (path, kind, mode, size, RECORD hash, link), and the compressor."""
        if self.recipe:
            return self.recipe
        digest = hashlib.sha256(json.dumps(gzlayer.gzip_key(), sort_keys=True).encode())
        for item in self.items:
            digest.update(
                f"{item.path}\0{item.kind}\0{item.mode:o}\0{item.size}\0"
                f"{item.entry.hash if item.entry else ''}\0{item.link}\n".encode()
            )
        return digest.hexdigest()


# Bumped when what a lock's wheels put in the nvidia, torch and deps layers changes for the same lock: how a wheel
# installs (wheelinstall), which layer it goes in (group_of), which copy of a path two wheels install is kept (_merge),
# what carry adds beside them (2: CUDA_HOME's toolkit layout in the nvidia layer, cudatoolkit.layout; the code that
# makes its bytes is in the key by itself: cudatoolkit.code_digest).
RECIPE_FORMAT = 2


def group_key(lock: runtimelock.Lock, group: str, venv: Venv) -> str:
    """The key of a locked wheels' layer, from the lock alone (no wheel read): the whole lock's pins and hashes (a
    path two wheels install is kept in one layer: _merge looks across layers), the layer, the venv it installs
    into, the grouping rules and the compressor. The wheels are the lock's by sha256, so the bytes follow."""
    material = {
        **gzlayer.gzip_key(),
        "recipe": RECIPE_FORMAT,
        "layer": group,
        "venv": [venv.prefix, venv.python],
        "groups": {"nvidia": ["nvidia-", "cuda-"], "torch": sorted(TORCH_KIN)},
        # the code that makes what carry adds to the nvidia layer (the driver stub's bytes): a change rebuilds it
        **({"added": cudatoolkit.code_digest()} if group == "nvidia" else {}),
        "lock": sorted([p.name, p.version, sorted(p.hashes)] for p in lock.packages),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class PlatformPlan:
    platform: Platform
    base_ref: str
    base: dict  # the base image's inspect data
    layers: tuple[LayerPlan, ...]
    fixed: Installed
    patched: dict[str, str]  # installed path of each file L6 changes or adds outside the dist-info -> sha256 hex
    duplicates: tuple[str, ...]  # paths two layers both write (stored twice)
    compilers: tuple[str, ...] = ()  # what the runtime compiles with (run_time_compilers): "cc", "nvcc"


# Locked wheels that compile at run time, and with what: Triton builds its driver with the C compiler against Python.h
# at the first GPU use; NVIDIA's pip nvcc means a JIT (FlashInfer's) compiles CUDA with the lock's CUDA_HOME.
COMPILES = {"triton": "cc", "nvidia-cuda-nvcc": "nvcc"}


def run_time_compilers(lock: runtimelock.Lock) -> tuple[str, ...]:
    names = {p.name for p in lock.packages}
    return tuple(dict.fromkeys(tool for name, tool in COMPILES.items() if name in names))


def release_wheel(config: Config, cache: Cache, platform: Platform) -> Path | None:
    from carry.wheelbuild import precompiled

    pin = precompiled.pin(config, cache, platform)
    return pin.path if pin else None


def requires_dist(wheel: Path) -> tuple[str, ...]:
    with zipfile.ZipFile(wheel) as archive:
        dist_info = next(
            n.split("/", 1)[0] for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
        )
        message = email.parser.BytesParser().parsebytes(archive.read(f"{dist_info}/METADATA"), headersonly=True)
    return tuple(message.get_all("Requires-Dist") or ())


def runtime_base(base: RuntimeBase, client: docker.DockerClient) -> tuple[str, dict]:
    """The runtime base's image as the engine holds it (runtimebase.RuntimeBase: the runtime image, or the base
    carry derived from it): (its reference, its inspect data)."""
    if base.recorded is not None and not base.image_id:  # a previous image's base: its layers in the registry
        config = base.recorded.get("config") or {}
        return base.image, {"Id": "", "Config": config, "RootFS": {"Layers": list(base.recorded.get("diff_ids") or [])}}
    try:
        return base.image, client.api.inspect_image(base.image_id)
    except Exception:  # docker.errors.ImageNotFound and kin: removed since it was resolved
        raise Failed(f"{base.image}: no longer in the local Docker engine; run the command again") from None


def fetch_wheels(
    lock: runtimelock.Lock, store: Store, scratch: Path, added: list[Path] | None = None
) -> dict[str, Path]:
    """Every locked wheel in the download store, sha256-checked against the lock: the missing ones downloaded once with
    pip (the user's index settings), each stored by its sha256 (and listed in `added`)."""
    found: dict[str, Path] = {}
    missing = []
    for package in lock.packages:
        path = _stored(store, package, lock.platform.machine)
        if path is None:
            missing.append(package)
        else:
            found[package.name] = path
    if missing:
        started = time.monotonic()
        reporter.phase(
            "download", f"{lock.platform}: {len(missing)} of {len(lock.packages)} locked wheel(s) into {store.root}"
        )
        with temp_dir(scratch, "wheels-") as directory:
            requirements = directory / "requirements.txt"
            requirements.write_text(
                "".join(f"{p.name}=={p.version} " + " ".join(f"--hash={h}" for h in p.hashes) + "\n" for p in missing)
            )
            _pip_download(lock, requirements, directory / "files")
            for path in sorted((directory / "files").iterdir()):
                target = store.adopt(path, path.name, file_sha256(path))
                if added is not None:
                    added.append(target)
        for package in missing:
            path = _stored(store, package, lock.platform.machine)
            if path is None:
                raise Failed(
                    f"{lock.path}: {package.name}=={package.version}: pip downloaded no wheel with the "
                    f"locked sha256; relock ({prog.command('lock')})"
                )
            found[package.name] = path
        total = sum(found[p.name].stat().st_size for p in missing)
        reporter.phase(
            "download",
            f"{lock.platform}: {len(missing)} wheel(s), {total / 1e9:.2f} GB in "
            f"{time.monotonic() - started:.0f}s, sha256 as locked",
        )
    return found


def _stored(store: Store, package: runtimelock.Locked, machine: str) -> Path | None:
    """The stored wheel of a locked package for this CPU (a lock may list every file of a version: another
    CPU's wheel of the same pin is not this platform's), intact (a corrupt one is removed, said, and missing)."""
    for value in package.hashes:
        sha = value.split(":", 1)[1]
        directory = store.root / sha
        if directory.is_dir():
            wheels = [p for p in directory.iterdir() if p.suffix == ".whl" and _installs_on(p.name, machine)]
            if wheels and store.intact(wheels[0], sha):
                return wheels[0]
    return None


def _installs_on(wheel_name: str, machine: str) -> bool:
    platforms = wheel_name[: -len(".whl")].rsplit("-", 1)[-1].split(".")
    return any(tag == "any" or tag.endswith(f"_{machine}") for tag in platforms)


def pip_platforms(target: str) -> list[str]:
    """pip's --platform list for uv's target (`aarch64-manylinux_2_36`)."""
    match = re.fullmatch(r"(x86_64|aarch64|ppc64le|s390x|armv7l|i686)-manylinux_(\d+)_(\d+)", target)
    if not match:
        raise BadInput(f"runtime lock target {target!r} is not ARCH-manylinux_X_Y; relock ({prog.command('lock')})")
    return manylinux_tags(match.group(1), int(match.group(2)), int(match.group(3)))


def _pip_download(lock: runtimelock.Lock, requirements: Path, into: Path) -> None:
    python = ".".join(lock.python.split(".")[:2])
    command = pip_download_command(requirements, into, python, pip_platforms(lock.target))
    result = execute(command, text=True, timeout=NETWORK_S)
    if result.returncode != 0:
        raise Failed(_pip_failure(lock, result.stdout + result.stderr))


def _pip_failure(lock: runtimelock.Lock, output: str) -> str:
    """One line: the package whose hash did not match (pip's hash report), else pip's last line."""
    mismatch = re.search(
        r"^\s+([A-Za-z0-9_.\-]+)==(\S+) from \S+.*?\n\s+Expected sha256 (\S+)"
        r"(?:.*?\n)*?\s+Got\s+(\S+)",
        output,
        re.M,
    )
    if mismatch:
        name, version, expected, got = mismatch.groups()
        return (
            f"{lock.path}: {name}=={version}: the wheel's sha256 is {got}, the lock says {expected}; the lock "
            f"was changed by hand or the index serves another file: relock ({prog.command('lock')})"
        )
    tail = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return f"{lock.path}: pip download of the locked wheels failed: {tail[-1] if tail else 'no output'}"


GROUPS = ("nvidia", "torch", "deps")


def venv_of(lock: runtimelock.Lock) -> Venv:
    return Venv(PREFIX, ".".join(lock.python.split(".")[:2]))


def plan_platform(
    config: Config,
    platform: Platform,
    lock: runtimelock.Lock,
    wheels: dict[str, Path] | None,
    fixed_wheel: Path,
    release: Path | None,
    base_ref: str,
    base: dict,
) -> PlatformPlan:
    """Every layer planned; with `wheels` None the locked wheels' layers only by their key (group_key), for a run
    that finds them in the registry and reads no wheel."""
    venv = venv_of(lock)
    fixed = wheelinstall.plan(fixed_wheel, venv)
    layers = [_layer("venv", [], _venv_items(config, lock, venv))]
    if wheels is None:
        layers += [LayerPlan(group, (), 0, 0, recipe=group_key(lock, group, venv), planned=False) for group in GROUPS]
    else:
        groups: dict[str, list[Installed]] = {group: [] for group in GROUPS}
        files: dict[str, list[tuple[str, str, str]]] = {group: [] for group in GROUPS}
        for name in sorted(wheels):
            groups[group_of(name)].append(wheelinstall.plan(wheels[name], venv))
            files[group_of(name)].append((name, wheels[name].name, sha256_in_store(wheels[name])))
        for group, (entries, overwritten) in _merge(groups, venv).items():
            extra = cuda_home(lock, wheels, venv) if group == "nvidia" else []
            planned = _layer(group, entries, extra, overwritten=overwritten)
            layers.append(dataclasses.replace(planned, recipe=group_key(lock, group, venv), wheels=tuple(files[group])))
    changed, whiteouts = list(fixed.entries), list[Item]()
    if release is not None:
        released = wheelinstall.plan(release, venv)
        layers.append(_layer("vllm-release", list(released.entries)))
        changed, whiteouts = difference(released, fixed)
    layers.append(_layer("vllm-fixed", changed, whiteouts))
    patched = {e.path: e.sha256_hex for e in changed if not e.path.startswith(fixed.dist_info + "/")}
    return PlatformPlan(
        platform, base_ref, base, tuple(layers), fixed, patched, _duplicates(layers), run_time_compilers(lock)
    )


def cuda_home(lock: runtimelock.Lock, wheels: dict[str, Path], venv: Venv) -> list[Item]:
    """The nvidia layer's additions that make the lock's CUDA_HOME a toolkit's layout for a JIT's link
    (cudatoolkit.layout), the driver stub made from the runtime wheel's cuda.h."""
    pins = {p.name: p.version for p in lock.packages}
    home = cudatoolkit.home_of(pins)
    if home is None:
        return []
    with zipfile.ZipFile(wheels[cudatoolkit.ANCHOR]) as archive:
        cuda_h = archive.read(f"{home}/include/cuda.h")
    return [
        Item(a.path, "symlink", link=a.link) if a.link else _item(a.path, a.data)
        for a in cudatoolkit.layout(venv.site, pins, lock.platform, cuda_h)
    ]


def _item(path: str, data: bytes, mode: int = 0o644) -> Item:
    return Item(path, "file", mode, len(data), Entry(path, mode, len(data), record_hash(data), data=data))


def _layer(name: str, entries: list[Entry], extra: Iterable[Item] = (), overwritten: tuple[str, ...] = ()) -> LayerPlan:
    items = ocilayer.items_for(entries, extra)
    files = [i for i in items if i.kind == "file"]
    return LayerPlan(name, items, len(files), sum(i.size for i in files), overwritten)


def _merge(groups: dict[str, list[Installed]], venv: Venv) -> dict[str, tuple[list[Entry], tuple[str, ...]]]:
    """The locked wheels' files per layer (group), each path stored once across all of them: a path two wheels install
    (cuda-python's own cuda/bindings/, two wheels' build_backend.py) goes to the wheel named like the path's package,
    else the later by name, and is reported with the layer that keeps it."""
    chosen: dict[str, tuple[str, str, Entry]] = {}
    twice: dict[str, set[str]] = {group: set() for group in groups}
    site = venv.site.lstrip("/") + "/"
    ordered = sorted(
        (
            (installed.name.lower().replace("_", "-").replace(".", "-"), group, installed)
            for group, installs in groups.items()
            for installed in installs
        ),
        key=lambda t: t[0],
    )
    for owner, group, installed in ordered:
        for entry in installed.entries:
            before = chosen.get(entry.path)
            if before is not None:
                if _owns(before[0], entry.path, site) and not _owns(owner, entry.path, site):
                    twice[before[1]].add(entry.path)
                    continue
                twice[group].add(entry.path)
            chosen[entry.path] = (owner, group, entry)
    return {
        group: ([entry for _, kept, entry in chosen.values() if kept == group], tuple(sorted(twice[group])))
        for group in groups
    }


def _owns(name: str, path: str, site: str) -> bool:
    parts = path[len(site) :].split("/") if path.startswith(site) else []
    return bool(parts) and name in (parts[0].lower(), "-".join(parts[:2]).lower())


def difference(released: Installed, fixed: Installed) -> tuple[list[Entry], list[Item]]:
    """What turns the release's install into the fixed wheel's: files whose bytes or mode differ or that only the
    fixed wheel has, and whiteouts for the release's files and directories the fixed wheel does not have."""
    before = {e.path: e for e in released.entries}
    after = {e.path: e for e in fixed.entries}
    changed = [
        e
        for path, e in after.items()
        if path not in before or (before[path].hash, before[path].mode) != (e.hash, e.mode)
    ]
    dirs_before, dirs_after = _dirs(before), _dirs(after)
    gone_dirs = sorted(dirs_before - dirs_after, key=len)
    top: list[str] = []
    for directory in gone_dirs:
        if not any(directory.startswith(t + "/") for t in top):
            top.append(directory)
    whiteouts = [Item(d, "whiteout") for d in top]
    for path in sorted(set(before) - set(after)):
        if not any(path.startswith(t + "/") for t in top):
            whiteouts.append(Item(path, "whiteout"))
    return changed, whiteouts


def _dirs(paths: Iterable[str]) -> set[str]:
    found = set()
    for path in paths:
        while "/" in path:
            path = path.rsplit("/", 1)[0]
            found.add(path)
    return found


def _duplicates(layers: list[LayerPlan]) -> tuple[str, ...]:
    """Files written twice: by two layers (L6 replacing L5's files aside, by design) or two wheels of one layer."""
    seen: dict[str, str] = {}
    twice = []
    has_release = any(layer.name == "vllm-release" for layer in layers)
    for layer in layers:
        if layer.name == "vllm-fixed" and has_release:
            continue
        for item in layer.items:
            if item.kind == "file":
                if item.path in seen:
                    twice.append(f"{item.path} ({seen[item.path]}, {layer.name})")
                seen[item.path] = layer.name
    return tuple(twice)


def _venv_items(config: Config, lock: runtimelock.Lock, venv: Venv) -> list[Item]:
    """L1: the venv on the base's Python and carry's small files."""
    prefix = venv.prefix.lstrip("/")
    cfg = (
        f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {lock.python}\n"
        f"executable = /usr/bin/python{venv.python}\ncommand = carry (the runtime lock's venv)\n"
    ).encode()
    env = "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(config.image.env.items())).encode()
    return [
        _item(f"{prefix}/pyvenv.cfg", cfg),
        Item(f"{prefix}/bin/python", "symlink", link="/usr/bin/python3"),
        Item(f"{prefix}/bin/python3", "symlink", link="python"),
        Item(f"{prefix}/bin/python{venv.python}", "symlink", link="python"),
        Item(f"{prefix}/lib64", "symlink", link="lib"),
        Item(venv.site.lstrip("/"), "dir", 0o755),
        Item(f"{prefix}/include", "dir", 0o755),
        _item("etc/carry/runtime.env", env),
        _item("usr/local/bin/carry-entrypoint", ENTRYPOINT.read_bytes(), 0o755),
    ]
