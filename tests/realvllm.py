"""vLLM's real released files (examples/vllm/releases.yaml), downloaded once into carry's download store and
sha256-checked before a test reads them. A missing file is downloaded, never skipped."""

from __future__ import annotations

from pathlib import Path

from carry import releases
from helpers import ROOT

RELEASES = ROOT / "examples" / "vllm" / "releases.yaml"
SDIST_033 = "vllm-0.33.0.tar.gz"
SDIST_032 = "vllm-0.32.0.tar.gz"
WHEEL_X86 = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
WHEEL_ARM = "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl"


def path(name: str) -> Path:
    """The checked local copy of one pinned release file (downloaded first when the store lacks it)."""
    (found,) = releases.fetch(RELEASES, [name])
    return found


def pinned(name: str) -> releases.Release:
    return next(release for release in releases.load(RELEASES) if release.name == name)
