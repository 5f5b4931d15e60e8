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


MAKE_UPSTREAM = ROOT / "examples" / "vllm" / "make_upstream.py"
V0_33_0 = "c40d26fd17550609ac3a9479055ce88eddba444a"


def download_store() -> str:
    """The real download store, whatever CARRY_CACHE a test uses: the files are downloaded once per machine."""
    import os

    return os.environ.get("CARRY_DOWNLOADS") or str(Path.home() / ".cache" / "carry" / "downloads")


def build(cache: Path) -> dict:
    """The vLLM history made by make_upstream.py into `cache` (its JSON: path and refs)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "CARRY_CACHE": str(cache), "CARRY_DOWNLOADS": download_store()}
    result = subprocess.run([sys.executable, str(MAKE_UPSTREAM), "--no-link", "--json"], env=env,
                            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
