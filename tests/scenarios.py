"""Upstream scenarios for `status`, `drop` and `refresh`: a small engine module and two patches carried on it."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import subprocess
from pathlib import Path

from helpers import GIT_ENV, Result, Upstream, carry, write_config

# Upstream's first commit is dated 2026-01-01 (tests/helpers.py); the pin a month later and every later commit
# a day after the one before, so the cache mirror (pin fetched with --depth=1, refs --shallow-since the pin)
# really is shallow, as it is for vLLM.
PIN_DATE = datetime.datetime(2026, 2, 1, tzinfo=datetime.timezone.utc)

ENGINE = '''"""Engine."""

import threading


class Engine:
    def __init__(self, size):
        self.size = size
        self.sem = threading.Semaphore(size)
        self.calls = 0

    def prepare_forward(self, batch):
        self.calls += 1
        if not batch:
            return None
        result = []
        for item in batch:
            result.append(item * 2)
        return result

    def shutdown(self):
        self.sem = None
        self.calls = 0


def dispatch(kind):
    if kind == "fp8":
        return "fp8-kernel"
    if kind == "int8":
        return "int8-kernel"
    return "default-kernel"
'''

CALLS = "        self.calls += 1\n"
RESET_LINES = (
    "        # reset the semaphore so a previous step cannot leak permits\n"
    "        permits = self.size\n"
    "        self.sem = threading.Semaphore(permits)\n"
    "        self.resets = getattr(self, 'resets', 0) + 1\n"
)
INT8 = '    if kind == "int8":\n'
FP8_LINES = '    if kind == "fp8_per_channel":\n        return "fp8-channel-kernel"\n'


def with_reset(text: str) -> str:
    """0001's change: reset the semaphore at the start of prepare_forward."""
    return text.replace(CALLS, CALLS + RESET_LINES)


def with_fp8(text: str) -> str:
    """0002's change: dispatch the per-channel FP8 kind."""
    return text.replace(INT8, FP8_LINES + INT8)


def replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


@dataclasses.dataclass
class Project:
    """A carry project (build.yaml, VERSION, patches/) on a real upstream repo, with its own cache."""

    root: Path
    upstream: Upstream
    config: Path
    pin: str
    days: int = 0

    @property
    def patches(self) -> Path:
        return self.config.parent / "patches"

    @property
    def env(self) -> dict[str, str]:
        return {"CARRY_CACHE": str(self.root / "cache")}

    def add_patch(self, name: str, message: str, text: str, trailers: str = "") -> Path:
        return self.upstream.make_patch(self.patches / name, message, {"pkg/engine.py": text}, trailers)

    def git(self, *args: str) -> str:
        """git in the upstream repo, dated one day after the previous call."""
        when = (PIN_DATE + datetime.timedelta(days=self.days)).isoformat()
        self.days += 1
        env = {**os.environ, **GIT_ENV, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
        return subprocess.run(
            ["git", *args], cwd=self.upstream.path, env=env, capture_output=True, text=True, check=True
        ).stdout.strip()

    def commit(self, message: str, files: dict[str, str | None]) -> str:
        """An upstream commit on its current branch."""
        self.upstream.write(files)
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.upstream.head()

    def land(self, name: str) -> str:
        """Upstream applies the carried patch file unchanged (a cherry-pick), on its current branch."""
        self.git("am", "-q", str(self.patches / name))
        return self.upstream.head()

    def mirror(self) -> Path:
        (mirror,) = (self.root / "cache" / "mirrors").iterdir()
        return mirror

    def run(self, *args: str) -> Result:
        return carry("--config", str(self.config), *args, env=self.env)

    def status(self, *args: str) -> dict[str, dict]:
        """`status --json` for one ref: patch name -> verdict entry."""
        result = self.run("status", "--json", *args)
        assert result.code == 0, (result.code, result.out, result.err)
        refs = json.loads(result.out)["refs"]
        assert len(refs) == 1, refs
        return {entry["name"]: entry for entry in refs[0]["patches"]}

    def digest(self) -> str:
        """A hash of every file in the project directory (names and bytes)."""
        digest = hashlib.sha256()
        for path in sorted(self.config.parent.rglob("*")):
            if path.is_file():
                digest.update(f"{path.relative_to(self.config.parent)}\0".encode() + path.read_bytes() + b"\0")
        return digest.hexdigest()


def project(tmp_path: Path, pr: int | None = None) -> Project:
    """Upstream with the engine at its pin, and a project carrying 0001 (reset) and 0002 (fp8 dispatch)."""
    upstream = Upstream.create(tmp_path / "upstream", {"pkg/engine.py": ENGINE, "README": "engine\n"})
    result = Project(tmp_path, upstream, tmp_path / "project" / "build.yaml", "")
    result.pin = result.commit("Release 1", {"CHANGELOG": "1: first release\n"})
    write_config(result.config.parent, str(upstream.path), result.pin, pr=pr)
    (result.config.parent / "VERSION").write_text("20260101.1\n")
    result.add_patch(
        "0001-reset-semaphore.patch",
        "Reset the semaphore in prepare_forward",
        with_reset(ENGINE),
        "Upstream-Status: Submitted [https://example.invalid/pr/1]",
    )
    result.add_patch("0002-fp8-dispatch.patch", "Dispatch FP8 per-channel", with_fp8(ENGINE))
    return result
