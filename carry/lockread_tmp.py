"""THROWAWAY: reads a runtime lock as LOCK-INTERFACE.md describes it, until issue-24-lock's carry/runtimelock.py
lands (then this file is deleted and carry.lockedimage imports that module)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from carry.errors import BadInput
from carry.platforms import Platform


@dataclasses.dataclass(frozen=True)
class Locked:
    name: str
    version: str
    hashes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Lock:
    path: Path
    platform: Platform
    python: str
    target: str
    base: str
    base_id: str
    requires_digest: str
    requires: str
    packages: tuple[Locked, ...]


def lock_path(config, platform: Platform) -> Path:
    return config.root / config.image.lock / f"{platform.os}-{platform.architecture}.txt"


def read(config, platform: Platform) -> Lock:
    path = lock_path(config, platform)
    if not path.is_file():
        raise BadInput(f"{path}: no runtime lock for {platform}; run `build.py lock`")
    header, packages, current = {}, [], None
    for line in path.read_text().splitlines():
        if line.startswith("# ") and ": " in line and current is None:
            key, value = line[2:].split(": ", 1)
            header[key.strip()] = value.split("  ")[0].strip()
        elif re.match(r"^[A-Za-z0-9]", line):
            name, version = line.split(" ")[0].split("==")
            current = [name.lower().replace("_", "-").replace(".", "-"), version, []]
            packages.append(current)
        elif "--hash=" in line and current is not None:
            current[2].append(line.split("--hash=", 1)[1].split()[0].rstrip("\\").strip())
    base = header.get("base", "")
    return Lock(path, platform, header.get("python", ""), header.get("target", ""), base,
                base.rsplit("@", 1)[-1] if "@" in base else "", header.get("requires-dist", ""),
                header.get("requires", ""), tuple(Locked(n, v, tuple(h)) for n, v, h in packages))


def check_fresh(lock: Lock, *, requires_dist, base_id: str, python: str) -> None:
    return None
