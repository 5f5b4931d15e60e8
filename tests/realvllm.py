"""The real vLLM history for tests: examples/vllm/make_upstream.py run once per test session, and carry projects on
it carrying the patches of tests/data/vllm-cases/ (each a real case of the 0.32.0 -> 0.33.0 difference)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, Result, carry

MAKE_UPSTREAM = ROOT / "examples" / "vllm" / "make_upstream.py"
CASES = ROOT / "tests" / "data" / "vllm-cases"
# The SHAs make_upstream.py gives on every machine: fixed identity and dates, files and modes from the pinned sdists.
V0_32_0 = "d534f23b4782b60c50344de42644325c474622a9"
V0_33_0 = "4573200f17f9dba6ef84c3ce59fb24d5a81e9a51"
PR_NUMBER = 53899
PR_HEAD = "32213d916cc14338523720d79031dc4b56173c5d"

DELETED = "0001-medusa-config-keep-own-key-names.patch"  # vllm/transformers_utils/configs/medusa.py: gone in 0.33.0
RENAMED = "0002-lora-modules-skip-blank-entries.patch"  # entrypoints/launchers/cli_args.py -> entrypoints/common/
PR_ONLY = "0003-ple-offload-count-dummy-steps.patch"  # vllm/v1/ple_offload/connector.py: only the PR stand-in has it
FIXED = "0004-deepseek-v41-tool-results-are-no-user-turn.patch"  # 0.33.0 fixed find_last_user_index its own way
NEEDED = "0005-math-utils-round-up-positive-multiple.patch"  # 0.33.0's round_up still divides by zero

BUILD_YAML = """\
# carry's test project on the real vLLM history (tests/realvllm.py)
upstream:
  url: {url}
  pr: {pr}
  commit: {pin}  # the PR stand-in's head
  main: main
build:
  cuda_arches: []
  tests:
    - {{run: "python {{project}}/checks/last_user_turn.py", gpu: false, against: tree}}
    - {{run: "python {{project}}/checks/round_up_zero.py", gpu: false, against: tree}}
"""


def download_store() -> str:
    """The real download store, whatever CARRY_CACHE a test uses: the sdists are downloaded once per machine."""
    return os.environ.get("CARRY_DOWNLOADS") or str(Path.home() / ".cache" / "carry" / "downloads")


def make_upstream(cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CARRY_CACHE": str(cache), "CARRY_DOWNLOADS": download_store()}
    return subprocess.run(
        [sys.executable, str(MAKE_UPSTREAM), "--no-link", *args],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=900,
    )


def build(cache: Path) -> dict:
    """The history built by make_upstream.py into `cache` (its JSON: path and refs)."""
    result = make_upstream(cache, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


class Project:
    """A carry project (build.yaml, VERSION, patches/, checks/) on the real history, with a cache of its own."""

    def __init__(self, root: Path, upstream: Path, cache: Path, patches: tuple[str, ...] | None = None):
        self.root = root
        self.cache = cache
        root.mkdir(parents=True)
        shutil.copytree(CASES / "checks", root / "checks")
        (root / "patches").mkdir()
        for patch in sorted((CASES / "patches").iterdir()):
            if patches is None or patch.name in patches:
                shutil.copy(patch, root / "patches" / patch.name)
        (root / "VERSION").write_text("20261201.1\n")
        self.config = root / "build.yaml"
        self.config.write_text(BUILD_YAML.format(url=upstream, pr=PR_NUMBER, pin=PR_HEAD))

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def env(self) -> dict[str, str]:
        return {"CARRY_CACHE": str(self.cache)}

    def run(self, *args: str, env: dict[str, str] | None = None) -> Result:
        return carry("--config", str(self.config), *args, env={**self.env, **(env or {})})

    def status(self, *args: str, env: dict[str, str] | None = None) -> dict:
        result = self.run("status", "--json", *args, env=env)
        assert result.code == 0, (result.code, result.out, result.err)
        return json.loads(result.out)


def by_name(ref: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in ref["patches"]}


# vLLM's released files (examples/vllm/releases.yaml), downloaded once into the download store and sha256-checked
# before a test reads them; a missing file is downloaded, never skipped.
RELEASES = ROOT / "examples" / "vllm" / "releases.yaml"
SDIST_033 = "vllm-0.33.0.tar.gz"
SDIST_032 = "vllm-0.32.0.tar.gz"
WHEEL_X86 = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
WHEEL_ARM = "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl"


def path(name: str) -> Path:
    """The checked local copy of one pinned release file (downloaded first when the store lacks it)."""
    from carry.source import releases

    (found,) = releases.fetch(RELEASES, [name])
    return found


def pinned(name: str):
    from carry.source import releases

    return next(release for release in releases.load(RELEASES) if release.name == name)
