"""Runtime locks for the locked-image tests: `build.py lock` where carry has it (carry/runtimelock.py), else the
exact `uv pip compile` command of notes/LOCK-INTERFACE.md with carry's header (a stand-in until the lock command
lands; the body is the same either way)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import zipfile
import email.parser
from pathlib import Path

from helpers import carry

TARGETS = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def have_lock_command() -> bool:
    return importlib.util.find_spec("carry.runtimelock") is not None


def requires_dist(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return list(email.parser.BytesParser().parsebytes(archive.read(name)).get_all("Requires-Dist") or [])


def base_facts(image: str, platform: str) -> tuple[str, str, str]:
    """(python X.Y.Z, glibc X.Y, image id) read from the base image itself."""
    import docker

    client = docker.from_env()
    found = client.images.get(image)
    out = client.containers.run(image, ["python3", "-c", "import platform, sys; print(platform.python_version(), "
                                        "platform.libc_ver()[1])"], remove=True, platform=platform).decode().split()
    return out[0], out[1], found.id


def write(config: Path, lock_dir: str, platform: str, base_image: str, wheel: Path, env: dict) -> Path:
    """The platform's lock beside `config` (made with `build.py lock` when carry has it)."""
    if have_lock_command():
        result = carry("--config", str(config), "lock", "--platform", platform, env=env)
        assert result.code == 0, result.err
        return config.parent / lock_dir / f"{platform.replace('/', '-')}.txt"
    python, glibc, image_id = base_facts(base_image, platform)
    requires = requires_dist(wheel)
    target = f"{TARGETS[platform]}-manylinux_{glibc.replace('.', '_')}"
    source = config.parent / f".requires-{platform.replace('/', '-')}.txt"
    source.write_text("\n".join(requires) + "\n")
    body = subprocess.run([sys.executable, "-m", "uv", "pip", "compile", "--generate-hashes", "--only-binary",
                           ":all:", "--no-header", "--no-annotate", "--python-platform", target, "--python-version",
                           ".".join(python.split(".")[:2]), str(source)], capture_output=True, text=True,
                          env=os.environ, timeout=600)
    source.unlink()
    assert body.returncode == 0, body.stderr
    digest = hashlib.sha256("\n".join(sorted(set(requires))).encode()).hexdigest()
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        message = email.parser.BytesParser().parsebytes(archive.read(meta))
    header = (f"# carry runtime lock: written by `build.py lock`; do not edit (relock: build.py lock)\n"
              f"# format: 1\n# platform: {platform}\n# python: {python}\n# target: {target}\n"
              f"# base: {base_image}@{image_id}\n# requires-dist: sha256:{digest}\n"
              f"# requires: {message['Name']}=={message['Version']}\n")
    path = config.parent / lock_dir / f"{platform.replace('/', '-')}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + body.stdout)
    return path
