"""git for the bench's generators: a fixed identity and dates, the machine's own git configuration shut out."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

IDENTITY = {
    "GIT_AUTHOR_NAME": "Bench Upstream",
    "GIT_AUTHOR_EMAIL": "upstream@bench.invalid",
    "GIT_COMMITTER_NAME": "Bench Upstream",
    "GIT_COMMITTER_EMAIL": "upstream@bench.invalid",
    "GIT_AUTHOR_DATE": "2026-01-05T10:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-05T10:00:00Z",
}


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": os.devnull,
        "LC_ALL": "C",
        "TZ": "UTC",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        **IDENTITY,
        **(extra or {}),
    }


def git(
    repo: Path, *args: str, input: bytes | None = None, env: dict[str, str] | None = None, strip: bool = True
) -> str:
    """Run git in `repo`; return stdout (stripped unless told); raise with git's stderr on failure."""
    result = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        env=git_env(env),
        input=input,
        capture_output=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} failed in {repo}: {result.stderr.decode().strip()}")
    out = result.stdout.decode()
    return out.strip() if strip else out


def init(path: Path, bare: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", *(["--bare"] if bare else []))
    git(path, "config", "gc.auto", "0")
    return path


def commit_files(repo: Path, parent: str | None, files: dict[str, str], message: str, index: Path) -> str:
    """A commit of `parent`'s tree with `files` written over it, made in a private index (no checkout)."""
    env = {"GIT_INDEX_FILE": str(index)}
    if parent:
        git(repo, "read-tree", parent, env=env)
    else:
        git(repo, "read-tree", "--empty", env=env)
    for name, text in files.items():
        blob = git(repo, "hash-object", "-w", "--stdin", input=text.encode())
        git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{name}", env=env)
    tree = git(repo, "write-tree", env=env)
    index.unlink(missing_ok=True)
    parents = ["-p", parent] if parent else []
    return git(repo, "commit-tree", tree, *parents, "-m", message)


def format_patch(repo: Path, commit: str) -> str:
    """`commit` as a mailbox patch, as `git format-patch` writes it for a series."""
    return git(repo, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", commit, strip=False)


def count_commits(repo: Path, *refs: str) -> int:
    return int(git(repo, "rev-list", "--count", *refs))
