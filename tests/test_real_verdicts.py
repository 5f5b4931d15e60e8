"""Drop verdicts on the real vLLM history: examples/vllm/make_upstream.py builds 0.32.0 -> 0.33.0 from the pinned PyPI
sdists (and a PR stand-in off 0.32.0), and the patches of tests/data/vllm-cases/ each hit a real case of that
difference: a file 0.33.0 deleted, a file it renamed, a file only the PR has, a bug 0.33.0 fixed in its own words,
and one it did not fix."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from github_api import pull, serving
from helpers import ROOT, assert_bad_input
from realvllm import (
    DELETED,
    FIXED,
    NEEDED,
    PR_HEAD,
    PR_NUMBER,
    PR_ONLY,
    RENAMED,
    V0_32_0,
    V0_33_0,
    Project,
    by_name,
    make_upstream,
)


@pytest.fixture(scope="module")
def history(vllm_history):
    """(the CARRY_CACHE make_upstream.py wrote into, its JSON): the run's history (tests/conftest.py)."""
    return Path(vllm_history["cache"]), {key: vllm_history[key] for key in ("path", "refs")}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One carry cache for the read-only tests: the mirror is fetched once."""
    return tmp_path_factory.mktemp("carry-cache")


@pytest.fixture
def project(tmp_path, history, shared_cache):
    return Project(tmp_path / "project", history[1]["path"], shared_cache)


def evidence(entry: dict) -> str:
    return "\n".join(entry["evidence"])


def test_the_history_is_the_same_on_every_machine_and_built_once(history, tmp_path):
    cache, built = history
    assert built["refs"] == {
        "refs/tags/v0.32.0": V0_32_0,
        "refs/tags/v0.33.0": V0_33_0,
        "refs/heads/main": V0_33_0,
        f"refs/pull/{PR_NUMBER}/head": PR_HEAD,
    }
    repo = built["path"]

    def git(*args):
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout.strip()

    assert git("rev-parse", "v0.33.0^") == V0_32_0 and git("rev-parse", f"{PR_HEAD}^") == V0_32_0
    assert git("cat-file", "-t", "v0.33.0") == "tag"  # annotated, as releases are
    files = git("ls-tree", "-r", "--name-only", "v0.33.0").splitlines()
    assert len(files) == 8514 and "vllm/entrypoints/common/cli_args.py" in files
    assert "PKG-INFO" not in files and not any(".egg-info/" in f for f in files) and "vllm/_version.py" not in files
    modes = {line.split()[0] for line in git("ls-tree", "-r", "v0.33.0").splitlines()}
    assert modes == {"100644", "100755"}  # the tarball's executables stay executable
    assert git("log", "-1", "--format=%an <%ae> %ad", "--date=iso-strict", "v0.32.0").startswith(
        "vLLM releases (from PyPI) <releases@vllm-sdist.invalid> 2026-10-18T"
    )
    # A second run finds it up to date and only prints it.
    start = time.monotonic()
    again = make_upstream(cache)
    assert again.returncode == 0, again.stderr
    assert time.monotonic() - start < 5 and "built" not in again.stderr
    assert V0_33_0 in again.stdout and repo in again.stdout
    # --check: a build.yaml pinned at one of these commits passes, a stale pin fails naming what it should be.
    good = tmp_path / "good.yaml"
    good.write_text(f"upstream:\n  url: x\n  commit: {V0_33_0}\n")
    checked = make_upstream(cache, "--check", str(good))
    assert checked.returncode == 0 and "refs/tags/v0.33.0" in checked.stdout
    stale = tmp_path / "stale.yaml"
    stale.write_text(f"upstream:\n  url: x\n  commit: {'1' * 40}\n")
    failed = make_upstream(cache, "--check", str(stale))
    assert failed.returncode == 1 and "is stale" in failed.stderr and V0_33_0[:12] in failed.stderr


def test_every_verdict_on_the_real_history(project):
    result = project.status("--against", "v0.33.0")
    (ref,) = result["refs"]
    assert (ref["ref"], ref["commit"]) == ("v0.33.0", V0_33_0)
    verdicts = by_name(ref)

    deleted = verdicts[DELETED]
    assert (deleted["verdict"], deleted["test"], deleted["commit"]) == ("DELETED-UPSTREAM", "history", V0_33_0)
    assert (
        f"vllm/transformers_utils/configs/medusa.py was deleted upstream by {V0_33_0[:12]} 'vLLM 0.33.0' "
        f"(it is in the merge base {V0_32_0[:12]} 'vLLM 0.32.0', not in REF)"
    ) in evidence(deleted)
    assert deleted["droppable"] is True and deleted["hunks"][0]["commit"] == V0_33_0
    assert deleted["upstream_status"] == "Inappropriate [local tweak]"

    renamed = verdicts[RENAMED]
    assert (renamed["verdict"], renamed["test"]) == ("NEEDED", "forward-apply")
    assert (
        f"vllm/entrypoints/launchers/cli_args.py is vllm/entrypoints/common/cli_args.py in REF (renamed upstream "
        f"by {V0_33_0[:12]} 'vLLM 0.33.0'); refresh follows the rename"
    ) in evidence(renamed)
    assert renamed["hunks"][0]["target"] == "vllm/entrypoints/common/cli_args.py"

    pr_only = verdicts[PR_ONLY]
    assert (pr_only["verdict"], pr_only["test"], pr_only["commit"]) == ("PR-ONLY", "history", None)
    text = evidence(pr_only)
    assert "vllm/v1/ple_offload/connector.py is not in REF: only the PR's side of history has it" in text
    assert f"added by {PR_HEAD[:12]} '[PR stand-in] Add per-layer-embedding offload'" in text
    assert "the PR that adds this file is not in REF" in text
    assert pr_only["advice"] == "Upstream-Status says Submitted, but REF needs it no more (PR-ONLY): drop it"

    # By their text alone: upstream rewrote find_last_user_index around the hunk; round_up is still as it was.
    assert verdicts[FIXED]["verdict"] == "CONFLICT" and verdicts[FIXED]["behaviour"] is None
    assert verdicts[NEEDED]["verdict"] == "NEEDED"

    assert result["pr"] == {
        "number": PR_NUMBER,
        "state": "not merged",
        "merged": False,
        "merge_commit": None,
        "source": "git",
        "where": f"refs/pull/{PR_NUMBER}/head against main",
        "detail": f"its head {PR_HEAD[:12]} is not in main and no commit there has its change; "
        f"git cannot tell an open PR from a closed one",
    }
    text = project.run("status", "--against", "v0.33.0").out
    assert f"PR #{PR_NUMBER}: not merged (from git: refs/pull/{PR_NUMBER}/head against main)" in text.splitlines()[1]
    assert f"way out: build.py drop {DELETED} --against v0.33.0" in text
    assert f"way out: build.py drop {RENAMED}" not in text


def test_by_behaviour_fixed_upstream_and_still_needed(project):
    verdicts = by_name(project.status("--against", "v0.33.0", "--test")["refs"][0])
    fixed = verdicts[FIXED]
    assert (fixed["verdict"], fixed["test"], fixed["droppable"]) == ("FIXED-UPSTREAM", "test", True)
    assert fixed["behaviour"]["outcome"] == "pass" and fixed["behaviour"]["mode"] == "tree"
    assert fixed["behaviour"]["source"] == "its Carry-Test trailer"
    text = evidence(fixed)
    assert (
        "its test `python {project}/checks/last_user_turn.py` (from its Carry-Test trailer) passes on REF without "
        "the patch: upstream fixed it its own way"
    ) in text
    assert "find_last_user_index -> 0 (want 0: the question, not the tool results)" in text
    assert "the text alone says CONFLICT (decided by apply):" in text
    needed = verdicts[NEEDED]
    assert (needed["verdict"], needed["test"], needed["behaviour"]["outcome"]) == ("NEEDED", "test", "fail")
    assert "fails on REF without the patch: still needed" in evidence(needed)
    assert "round_up(5, 0) -> ZeroDivisionError" in evidence(needed)
    # Patches without a test keep their text verdicts.
    assert verdicts[DELETED]["verdict"] == "DELETED-UPSTREAM" and verdicts[DELETED]["behaviour"] is None
    # On the PR's own base the fixed test fails: the bug is there, so the patch is needed there.
    older = by_name(project.status("--against", "v0.32.0", "--test")["refs"][0])
    assert older[FIXED]["verdict"] == "NEEDED" and older[FIXED]["behaviour"]["outcome"] == "fail"


def test_refs_as_users_name_them_older_and_newer_than_the_pin(tmp_path, history, project):
    # A tag older than the pin, into a shallow mirror (the pin fetched alone): the PR's own base. Only the PR has the
    # PLE file there either.
    fresh = Project(tmp_path / "fresh", history[1]["path"], tmp_path / "cache")
    assert fresh.run("fetch").code == 0
    (mirror,) = (fresh.cache / "mirrors").iterdir()
    assert (mirror / "shallow").read_text().split() == [PR_HEAD]
    older = fresh.status("--against", "v0.32.0")
    assert older["refs"][0]["commit"] == V0_32_0
    verdicts = by_name(older["refs"][0])
    assert verdicts[PR_ONLY]["verdict"] == "PR-ONLY"
    assert {verdicts[name]["verdict"] for name in (DELETED, RENAMED, FIXED, NEEDED)} == {"NEEDED"}
    for name, commit in (
        ("v0.33.0", V0_33_0),
        ("refs/tags/v0.32.0", V0_32_0),
        ("main", V0_33_0),
        (V0_32_0, V0_32_0),
        (f"refs/pull/{PR_NUMBER}/head", PR_HEAD),
    ):
        found = project.status("--against", name)["refs"][0]
        assert (found["ref"], found["commit"]) == (name, commit)
    checked = project.run("check", "--against", "v0.32.0")
    assert checked.code == 1 and f"base   {V0_32_0}" in checked.out  # 0003's file is not on the release
    assert_bad_input(
        project.run("status", "--against", "v9.9.9"), "unknown ref 'v9.9.9'", "refs/tags/v9.9.9 or refs/heads/v9.9.9"
    )


def test_fail_on_the_new_verdicts(project):
    assert project.run("status", "--against", "v0.33.0", "--fail-on", "DELETED-UPSTREAM").code == 1
    assert project.run("status", "--against", "v0.33.0", "--fail-on", "pr-only").code == 1
    assert project.run("status", "--against", "v0.33.0", "--fail-on", "FIXED-UPSTREAM").code == 0
    assert project.run("status", "--against", "v0.33.0", "--test", "--fail-on", "FIXED-UPSTREAM").code == 1


def test_refresh_names_drop_then_follows_the_rename(tmp_path, history):
    p = Project(tmp_path / "project", history[1]["path"], tmp_path / "cache")
    failed = p.run("refresh", "--onto", "v0.33.0", "--test")
    assert failed.code == 1, (failed.out, failed.err)
    line = failed.err.strip()
    assert line.startswith(f"carry: error: {DELETED} conflicts with v0.33.0 {V0_33_0[:12]}") and "\n" not in line
    assert "nothing was changed" in line and "rebase" not in line
    for name, verdict in ((DELETED, "DELETED-UPSTREAM"), (PR_ONLY, "PR-ONLY"), (FIXED, "FIXED-UPSTREAM")):
        assert f"{name} is {verdict} (" in line and f"`build.py drop {name} --against v0.33.0`" in line
    assert RENAMED not in line and NEEDED not in line
    assert (p.patches / DELETED).exists()
    # drop takes each of them without --force (FIXED-UPSTREAM through its test), then refresh moves onto the release.
    for name, extra in ((DELETED, ()), (PR_ONLY, ()), (FIXED, ("--test",))):
        dropped = p.run("drop", name, "--against", "v0.33.0", *extra)
        assert dropped.code == 0, dropped.err
    log = (p.patches / "DROPPED.md").read_text()
    assert f"{DELETED}: DELETED-UPSTREAM against v0.33.0; upstream commit {V0_33_0}" in log
    # Not merged: the pin stays, and DROPPED.md names the commit it must hold (wheel refuses it until refresh).
    assert f"{PR_ONLY}: PR-ONLY against v0.33.0; upstream commit {V0_33_0}" in log
    assert "refresh --onto v0.33.0` moves the pin" in dropped.err
    assert f"{FIXED}: FIXED-UPSTREAM against v0.33.0" in log
    assert_bad_input(
        p.run("drop", NEEDED, "--against", "v0.33.0"),
        f"{NEEDED} is NEEDED against v0.33.0",
        "FIXED-UPSTREAM",
        "--force",
    )
    refreshed = p.run("refresh", "--onto", "v0.33.0")
    assert refreshed.code == 0, refreshed.err
    assert f"pin {PR_HEAD[:12]} -> {V0_33_0}" in refreshed.out
    moved = (p.patches / RENAMED).read_text()
    assert "diff --git a/vllm/entrypoints/common/cli_args.py b/vllm/entrypoints/common/cli_args.py" in moved
    assert f"commit: {V0_33_0}" in p.config.read_text()
    assert p.run("check").code == 0


def test_the_weekly_report_leads_with_a_pr_closed_without_merging(project, tmp_path):
    repo = history_key(project)
    with serving({f"{repo}/{PR_NUMBER}": pull("closed")}) as api:
        env = {"CARRY_GITHUB_API": api.url, "GITHUB_TOKEN": "ghs_weeklysecret"}
        result = run_weekly(project, env)
        assert result.returncode == 0, result.stderr
        assert api.requests and api.requests[0][1]["Authorization"] == "Bearer ghs_weeklysecret"
    report = result.stdout
    assert "ghs_weeklysecret" not in report + result.stderr
    lines = [line for line in report.splitlines() if line.strip()]
    assert lines[1].startswith(f"**PR #{PR_NUMBER} was closed without being merged** (from the GitHub API: ")
    assert lines[2].startswith("2 carried patch(es) can be dropped")
    for name in (DELETED, PR_ONLY):
        assert f"### `{name}`:" in report
    assert f"`python build.py drop {DELETED} --against main`" in report


def history_key(project: Project) -> str:
    """owner/repo as carry derives it from a local upstream path when $CARRY_GITHUB_API is set."""
    url = next(line.split(": ", 1)[1] for line in project.config.read_text().splitlines() if "url:" in line)
    parts = url.rstrip("/").split("/")
    return f"{parts[-2]}/{parts[-1].removesuffix('.git')}"


def run_weekly(project: Project, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_", "CARRY_", "GH_"))}
    base["PATH"] = f"{os.path.dirname(sys.executable)}:{base['PATH']}"
    env = {**base, **project.env, "CARRY_CONFIG": str(project.config), "CARRY_REPORT_ONLY": "1", **env}
    return subprocess.run(
        ["bash", str(ROOT / "ci" / "weekly.sh")],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
