"""The carried PR's own state in `status`: from GitHub's REST API where it answers (a local server speaking its
JSON, as GitHub cannot be reached from here), else from git on real repos (merge, fast-forward, squash, not merged)."""

from __future__ import annotations

import json

import pytest

from github_api import pull, serving
from scenarios import ENGINE, project, with_fp8, with_reset

TOKEN = "ghp_thisisnotarealtoken0123456789"


def pr_project(tmp_path, number=7):
    """A project whose PR (refs/pull/<number>/head) adds the reset on a branch off the pin, upstream at
    .../vllm-project/vllm so that $CARRY_GITHUB_API names it like GitHub would."""
    p = project(tmp_path / "vllm-project", pr=number)
    p.git("checkout", "-q", "-b", "pr")
    head = p.commit("PR: reset semaphore", {"pkg/engine.py": with_reset(ENGINE)})
    p.git("checkout", "-q", "main")
    p.upstream.publish_pr(number, head)
    return p, head


def pr_of(p, env=None) -> dict:
    result = p.run("status", "--json") if env is None else carry_status(p, env)
    assert result.code == 0, result.err
    return json.loads(result.out)["pr"]


def carry_status(p, env):
    from helpers import carry

    return carry("--config", str(p.config), "status", "--json", env={**p.env, **env})


def key(p, number=7) -> str:
    parts = str(p.upstream.path).rstrip("/").split("/")
    return f"{parts[-2]}/{parts[-1]}/{number}"


@pytest.mark.parametrize(
    "answer, state, merge_commit",
    [
        (pull("open"), "open", None),
        (pull("closed"), "closed", None),
        (pull("closed", merged=True, merge_commit="c" * 40), "merged", "c" * 40),
    ],
)
def test_from_the_github_api_with_a_token_only_in_a_header(tmp_path, answer, state, merge_commit):
    p, _ = pr_project(tmp_path)
    with serving({key(p): answer}) as api:
        env = {"CARRY_GITHUB_API": api.url, "GITHUB_TOKEN": TOKEN}
        result = carry_status(p, env)
        assert result.code == 0, result.err
        found = json.loads(result.out)["pr"]
        ((path, headers),) = api.requests
    assert path == f"/repos/{key(p).rsplit('/', 1)[0]}/pulls/7"
    assert headers["Authorization"] == f"Bearer {TOKEN}" and headers["Accept"] == "application/vnd.github+json"
    assert (found["state"], found["source"], found["merge_commit"]) == (state, "github", merge_commit)
    assert found["where"] == f"{api.url}/repos/{key(p).rsplit('/', 1)[0]}/pulls/7"
    assert TOKEN not in result.out + result.err


def test_text_output_leads_with_a_closed_pr(tmp_path):
    p, _ = pr_project(tmp_path)
    with serving({key(p): pull("closed")}) as api:
        from helpers import carry

        result = carry(
            "--config", str(p.config), "status", env={**p.env, "CARRY_GITHUB_API": api.url, "GH_TOKEN": TOKEN}
        )
    assert result.code == 0, result.err
    assert result.out.splitlines()[1] == (
        f"PR #7: closed without being merged (from the GitHub API: "
        f"{api.url}/repos/{key(p).rsplit('/', 1)[0]}/pulls/7); closed at "
        f"2026-11-20T10:00:00Z"
    )


def test_an_api_that_refuses_falls_back_to_git_and_says_so(tmp_path):
    p, head = pr_project(tmp_path)
    with serving({}) as api:  # 404 for every PR
        result = carry_status(p, {"CARRY_GITHUB_API": api.url})
    assert result.code == 0, result.err
    found = json.loads(result.out)["pr"]
    assert (found["state"], found["source"]) == ("not merged", "git")
    assert f"carry: the GitHub API answered 404 Not Found for {api.url}/repos/" in result.err
    unreachable = carry_status(p, {"CARRY_GITHUB_API": "http://127.0.0.1:9"})
    assert unreachable.code == 0 and "could not be reached" in unreachable.err
    assert json.loads(unreachable.out)["pr"]["source"] == "git"


def test_from_git_merged_by_a_merge_commit(tmp_path):
    p, head = pr_project(tmp_path)
    p.git("merge", "-q", "--no-ff", "-m", "Merge PR 7", "pr")
    merge = p.upstream.head()
    found = pr_of(p)
    assert (found["state"], found["source"], found["merge_commit"]) == ("merged", "git", merge)
    assert found["detail"] == f"its head {head[:12]} is in main"


def test_from_git_merged_by_fast_forward(tmp_path):
    p, head = pr_project(tmp_path)
    p.git("merge", "-q", "--ff-only", "pr")
    found = pr_of(p)
    assert (found["state"], found["merge_commit"]) == ("merged", head)


def test_from_git_squashed_onto_main(tmp_path):
    p, head = pr_project(tmp_path)
    p.commit("unrelated", {"README": "engine v2\n"})
    squash = p.commit("Reset the semaphore (#7)", {"pkg/engine.py": with_reset(ENGINE)})
    found = pr_of(p)
    assert (found["state"], found["merge_commit"]) == ("merged", squash)
    assert found["detail"] == f"{squash[:12]} on main has the PR's whole change (same patch-id)"


def test_from_git_not_merged_cannot_tell_open_from_closed(tmp_path):
    p, head = pr_project(tmp_path)
    p.commit("Something else", {"pkg/engine.py": with_fp8(ENGINE)})
    found = pr_of(p)
    assert (found["state"], found["merged"], found["merge_commit"]) == ("not merged", False, None)
    assert "git cannot tell an open PR from a closed one" in found["detail"]


def test_no_pr_no_state_and_no_request(tmp_path):
    p = project(tmp_path)
    with serving({}) as api:
        result = carry_status(p, {"CARRY_GITHUB_API": api.url})
        assert api.requests == []
    assert result.code == 0 and json.loads(result.out)["pr"] is None
    assert "PR #" not in p.run("status").out
