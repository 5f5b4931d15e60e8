"""`verify IMAGE` on the real vLLM image of examples/vllm (locked, layered, both platforms), per platform.

The image is the one `examples/vllm/run.sh` pushes to the registry ci/setup.sh started (`<image.name>:<VERSION>`);
when the registry does not have it yet, run.sh runs first (wheels, lock, image; not timed here). Then, for each
platform: `build.py verify REF --platform P`, the whole process (the layers read from the registry natively, every
file hashed against its RECORD, the fixed wheel against dist/, the gate of its shared objects), against the floor
of reading that platform's blobs from the registry, inflating its layers and hashing their tar in one thread (the
least any check of every file's bytes must do), in the same run. linux/arm64 is read natively too, so it must take
about as long as linux/amd64 (no emulation).
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

import measure  # noqa: E402

CONFIG = ROOT / "examples" / "vllm" / "build.yaml"
PLATFORMS = ("linux/amd64", "linux/arm64")
FLOOR_RATIO = 1.5  # verify <= this x reading, inflating and hashing the layers alone (one thread)
ARM64_RATIO = 1.3  # arm64 (native read) <= this x amd64


def _login_env() -> dict[str, str]:
    """The caller's environment with the registry login from what .ci/services.sh recorded (password from its
    mode-600 file, handed over in the environment, never in argv)."""
    settings = {}
    env_file = Path(os.environ.get("CARRY_CI_ENV", "/tmp/carry-ci/env"))
    if env_file.is_file():
        settings = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARRY_CACHE", "VLLM_"))}
    user, password_file = settings.get("CARRY_TEST_REGISTRY_USER"), settings.get("CARRY_TEST_REGISTRY_PASSWORD_FILE")
    if user and password_file:
        env.update(CARRY_REGISTRY_USER=user, CARRY_REGISTRY_PASSWORD=Path(password_file).read_text().strip())
    return env


def _ref() -> str:
    """`<image.name>:<VERSION>` of examples/vllm: the multi-platform tag run.sh pushes."""
    from carry import config as config_module
    from carry import version

    config = config_module.load(CONFIG)
    return f"{config.image.name}:{version.read(config.version_file)}"


def _manifest(ref: str, platform: str, env: dict[str, str]):
    from carry.image.inspect import imagefs
    from carry.platforms import Platform

    auth = {"username": env.get("CARRY_REGISTRY_USER"), "password": env.get("CARRY_REGISTRY_PASSWORD")}
    repo = imagefs.repository(ref, auth, plain_http=True)
    return repo, imagefs.platform_manifest(repo, ref, Platform.parse(platform, "bench"))


def _floor_s(registry, manifest: dict) -> tuple[float, float, int]:
    """Every blob of the platform's image read from the registry and hashed (the I/O floor), and the same with
    each layer also inflated (ISA-L, as verify does) and its tar hashed: the floor of any check of every file's
    bytes. (seconds read+hash, seconds read+inflate+hash, compressed bytes)."""
    from isal import igzip

    buffer = memoryview(bytearray(1 << 20))
    start, total = time.perf_counter(), 0
    for blob in [manifest["config"], *manifest["layers"]]:
        digest = hashlib.sha256()
        with registry.open_blob(blob["digest"]) as answer:
            while size := answer.readinto(buffer):
                digest.update(buffer[:size])
                total += size
        assert "sha256:" + digest.hexdigest() == blob["digest"]
    read = time.perf_counter() - start
    start = time.perf_counter()
    for blob in manifest["layers"]:
        packed, unpacked = hashlib.sha256(), hashlib.sha256()
        with registry.open_blob(blob["digest"]) as answer, igzip.open(_Hashing(answer, packed), "rb") as tar:
            while size := tar.readinto(buffer):
                unpacked.update(buffer[:size])
        assert "sha256:" + packed.hexdigest() == blob["digest"]
    return read, time.perf_counter() - start, total


class _Hashing(io.RawIOBase):
    """A readable stream that hashes what passes through it."""

    def __init__(self, stream, digest):
        self.stream, self.digest = stream, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        size = self.stream.readinto(buffer)
        self.digest.update(memoryview(buffer)[:size])
        return size


def bench(work: Path, Row) -> list:
    env = _login_env()
    ref = _ref()
    if _manifest(ref, PLATFORMS[0], env)[1] is None:
        subprocess.run(
            ["bash", str(ROOT / "examples" / "vllm" / "run.sh")],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
    rows, times = [], {}
    for platform in PLATFORMS:
        registry, (manifest, _digest) = _manifest(ref, platform, env)
        read, floor, size = _floor_s(registry, manifest)
        run = measure.run(
            [sys.executable, str(ROOT / "build.py"), "--config", str(CONFIG), "verify", ref, "--platform", platform],
            env,
            cwd=ROOT,
        ).check()
        times[platform] = run.wall_s
        proven = next((line.strip() for line in run.out.splitlines() if line.strip().startswith("files:")), "")
        rows.append(
            Row(
                "verify",
                f"`verify IMAGE --platform {platform}` on the vLLM image ({len(manifest['layers'])} "
                f"layers, {size / 1e9:.2f} GB compressed), whole process; {proven[:90]}",
                f"{run.wall_s:.1f} s (cpu {run.cpu_s:.0f} s, others {run.others_cpu_s:.0f} s)",
            )
        )
        rows.append(
            Row(
                "verify",
                f"  against reading its blobs, inflating the layers and hashing their tar alone ({floor:.1f} s; "
                f"reading and hashing the blobs alone {read:.1f} s)",
                f"{run.wall_s / floor:.2f}x",
                f"<= {FLOOR_RATIO:.1f}x",
                run.wall_s <= FLOOR_RATIO * floor,
            )
        )
    ratio = times["linux/arm64"] / times["linux/amd64"]
    rows.append(
        Row(
            "verify",
            "linux/arm64 against linux/amd64 (both read natively, nothing emulated)",
            f"{ratio:.2f}x",
            f"<= {ARM64_RATIO:.1f}x",
            ratio <= ARM64_RATIO,
        )
    )
    return rows
