"""examples/vllm/make_upstream.py makes the history vLLM's own git holds: every file of each sdist but what
packaging adds (PKG-INFO, *.egg-info/, setuptools-scm's vllm/_version.py), tracked files that match a .gitignore
pattern included."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

import realvllm

pytestmark = pytest.mark.slow

VERSION_FILE = "vllm/_version.py"


@pytest.fixture(scope="module")
def history(vllm_history) -> dict:
    return vllm_history  # the run's history (tests/conftest.py)


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def test_the_pinned_shas(history):
    assert history["refs"] == {
        "refs/tags/v0.32.0": realvllm.V0_32_0,
        "refs/tags/v0.33.0": realvllm.V0_33_0,
        "refs/heads/main": realvllm.V0_33_0,
        f"refs/pull/{realvllm.PR_NUMBER}/head": realvllm.PR_HEAD,
    }


def test_the_version_file_is_in_no_commit(history):
    repo = history["path"]
    commits = git(repo, "rev-list", "--all").split()
    assert set(history["refs"].values()) <= set(commits) and len(commits) == 3
    for commit in commits:
        assert VERSION_FILE not in git(repo, "ls-tree", "-r", "--name-only", commit).splitlines(), commit
    assert git(repo, "log", "--all", "--format=%H", "--", VERSION_FILE) == ""
    assert f"\n/{VERSION_FILE}\n" in "\n" + git(repo, "show", f"{realvllm.V0_33_0}:.gitignore")


@pytest.mark.parametrize(
    ("version", "sdist", "commit"),
    [("0.32.0", realvllm.SDIST_032, realvllm.V0_32_0), ("0.33.0", realvllm.SDIST_033, realvllm.V0_33_0)],
)
def test_nothing_else_from_the_sdist_is_missing(history, tmp_path, version, sdist, commit):
    with tarfile.open(realvllm.path(sdist)) as archive:
        files = {m.name.split("/", 1)[1] for m in archive if m.isfile() and "/" in m.name}
    added = {
        name
        for name in files
        if name == "PKG-INFO" or name == VERSION_FILE or any(part.endswith(".egg-info") for part in Path(name).parts)
    }
    assert VERSION_FILE in added and "PKG-INFO" in added and any(".egg-info/" in name for name in added)
    tracked = set(git(history["path"], "ls-tree", "-r", "--name-only", commit).splitlines())
    assert tracked == files - added
    if version == "0.33.0":
        # tracked although a .gitignore pattern matches it: a history made by `git add -A` would lose it
        assert "benchmarks/multi_turn/generate_multi_turn.json" in tracked and len(tracked) == 8514
        ignored = subprocess.run(
            ["git", "check-ignore", "--no-index", "-q", "benchmarks/multi_turn/generate_multi_turn.json"],
            cwd=_checkout(history["path"], commit, tmp_path),
        )
        assert ignored.returncode == 0


def _checkout(repo: str, commit: str, scratch: Path) -> Path:
    """The .gitignore files of `commit` in a scratch work tree (what check-ignore reads)."""
    subprocess.run(["git", "init", "-q", str(scratch)], check=True)
    for name in git(repo, "ls-tree", "-r", "--name-only", commit).splitlines():
        if name.endswith(".gitignore"):
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            (scratch / name).write_text(git(repo, "show", f"{commit}:{name}"))
    return scratch
