"""Test helpers: real git repos in tmp dirs and a way to run build.py as users do."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_PY = ROOT / "build.py"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Upstream Dev",
    "GIT_AUTHOR_EMAIL": "dev@upstream.example",
    "GIT_COMMITTER_NAME": "Upstream Dev",
    "GIT_COMMITTER_EMAIL": "dev@upstream.example",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


def git(repo: Path, *args: str, input: str | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    out = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=repo,
        env=env,
        input=input,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


@dataclasses.dataclass
class Upstream:
    """A real upstream repo in a tmp dir with helpers to commit and make patches."""

    path: Path

    @classmethod
    def create(cls, path: Path, files: dict[str, str]) -> Upstream:
        path.mkdir(parents=True)
        git(path, "init", "-q")
        repo = cls(path)
        repo.commit("initial", files)
        return repo

    def write(self, files: dict[str, str | None]) -> None:
        for name, text in files.items():
            target = self.path / name
            if text is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)

    def commit(self, message: str, files: dict[str, str | None]) -> str:
        self.write(files)
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "-m", message)
        return self.head()

    def head(self, ref: str = "HEAD") -> str:
        return git(self.path, "rev-parse", ref)

    def read(self, name: str) -> str:
        return (self.path / name).read_text()

    def make_patch(self, dest: Path, message: str, files: dict[str, str | None], trailers: str = "") -> Path:
        """Commit `files` on a scratch branch, format-patch it to `dest`, and return to where we were."""
        start = git(self.path, "rev-parse", "--abbrev-ref", "HEAD")
        git(self.path, "checkout", "-q", "-b", f"scratch-{dest.stem}")
        body = f"{message}\n\n{textwrap.dedent(trailers).strip()}\n" if trailers else message
        self.commit(body, files)
        text = git(self.path, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "HEAD")
        git(self.path, "checkout", "-q", start)
        git(self.path, "branch", "-q", "-D", f"scratch-{dest.stem}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text + "\n")
        return dest

    def publish_pr(self, number: int, ref: str) -> None:
        git(self.path, "update-ref", f"refs/pull/{number}/head", ref)


def write_config(directory: Path, upstream: str, commit: str, pr: int | None = None, extra: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    pr_line = f"  pr: {pr}\n" if pr is not None else ""
    config = directory / "build.yaml"
    config.write_text(
        f"# test config\nupstream:\n  url: {upstream}\n{pr_line}  commit: {commit}  # the pin\n  main: main\n"
        f"patches:\n  dir: patches\n{extra}"
    )
    (directory / "patches").mkdir(exist_ok=True)
    return config


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str


def carry(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600) -> Result:
    """Run `python build.py ARGS` in a subprocess, as a user would."""
    proc = subprocess.run(
        [sys.executable, str(BUILD_PY), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_bad_input(result: Result, *needles: str) -> None:
    """Exit 2, exactly one line on stderr that names the problem, no traceback."""
    assert result.code == 2, (result.code, result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def find_in_tree(root: Path, needles: list[str]) -> list[str]:
    """Files under `root` holding a needle, looking inside zip archives (wheels) member by member."""
    hits = []
    encoded = [n.encode() for n in needles]
    for path in sorted(root.rglob("*")) if root.exists() else []:
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        chunks = [data]
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                chunks += [archive.read(name) for name in archive.namelist()]
        if any(needle in chunk for chunk in chunks for needle in encoded):
            hits.append(str(path))
    return hits
