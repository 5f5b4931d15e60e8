"""The real vLLM things several modules need, each made once per run (tests/conftest.py's session fixtures):

- the vLLM history (examples/vllm/make_upstream.py from the pinned sdists): `history`;
- examples/vllm's two fixed wheels (x86_64 and, from this machine, aarch64; precompiled from vLLM's released
  wheels), built by `carry wheel` into one carry cache: `fixed_wheels`. A user gets a hardlinked copy of that cache
  (`FixedWheels.cache_copy`), in which carry finds the mirror, the build environment and both wheels: a `wheel` or
  `lock` there reuses them instead of building again.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import realvllm
from helpers import ROOT, Result, carry
from lib.shared import hardlinked_copy

EXAMPLE = ROOT / "examples" / "vllm"
WHEELS = {"linux/amd64": realvllm.WHEEL_X86, "linux/arm64": realvllm.WHEEL_ARM}


def example_project(root: Path, history: Path | str, ignore: tuple[str, ...] = ()) -> Path:
    """examples/vllm copied to `root`, its upstream.url pointing at `history`; its build.yaml."""
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("upstream.git", "__pycache__", *ignore))
    config = root / "build.yaml"
    config.write_text(config.read_text().replace("  url: upstream.git", f"  url: {history}"))
    return config


def make_history(directory: Path) -> dict:
    """{"path": the bare repository, "refs": {ref: sha}, "cache": the CARRY_CACHE make_upstream.py wrote it in}."""
    return {**realvllm.build(directory), "cache": str(directory)}


@dataclasses.dataclass(frozen=True)
class FixedWheels:
    """Both platforms' fixed wheels of examples/vllm, the carry cache they were built in (not to be written: take
    a copy), and what `carry wheel` said building each."""

    cache: Path
    config: Path
    wheels: dict[str, Path]
    results: dict[str, Result]

    def cache_copy(self, dest: Path) -> Path:
        """A hardlinked copy of the cache at `dest` (CARRY_CACHE for the user's own project on the same history)."""
        return hardlinked_copy(self.cache, dest)

    @classmethod
    def from_json(cls, found: dict) -> FixedWheels:
        return cls(
            Path(found["cache"]),
            Path(found["config"]),
            {platform: Path(path) for platform, path in found["wheels"].items()},
            {platform: Result(**result) for platform, result in found["results"].items()},
        )


def make_fixed_wheels(directory: Path, history: Path | str) -> dict:
    config = example_project(directory / "vllm", history)
    env = {"CARRY_CACHE": str(directory / "cache"), "CARRY_DOWNLOADS": realvllm.download_store()}
    found: dict = {"cache": str(directory / "cache"), "config": str(config), "wheels": {}, "results": {}}
    for platform in WHEELS:
        args = ["--platform", platform] if platform == "linux/arm64" else []
        result = carry("--config", str(config), "wheel", "--out", str(directory / "dist"), *args, env=env)
        assert result.code == 0, result.err
        found["wheels"][platform] = result.out.strip()
        found["results"][platform] = dataclasses.asdict(result)
    return found
