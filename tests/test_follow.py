"""`follow` on small real histories, run through build.py as a maintainer does: a project (its own git repository)
carrying four patches on a real upstream that merged one exactly, one with a reviewer's edit, left one alone and
changed the lines of the fourth. Each verdict's path, the conflict stopping the run with its hunk, the maintainer's
one resolution recorded and replayed on another clone with another cache, a resolution that no longer fits refused,
a second run updating the branch (and the pushed one), the build on a buildable upstream, and bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from helpers import GIT_ENV, assert_bad_input, carry
from scenarios import ENGINE, Project, project, replace

REVIEWED = (
    "        # A previous step may have leaked permits: start from a fresh semaphore.\n"
    "        permits = max(self.size, 1)\n"
    "        self.sem = threading.Semaphore(permits)\n"
    "        self.resets = getattr(self, 'resets', 0) + 1\n"
)
DESCRIBE = '\n\ndef describe(kind):\n    return f"{kind}: {dispatch(kind)}"\n'
SEM = "        self.sem = threading.Semaphore(size)\n"
OURS = "        self.sem = threading.BoundedSemaphore(size)\n"
THEIRS = "        self.sem = threading.Semaphore(max(size, 1))\n"
RESOLVED = "        self.sem = threading.BoundedSemaphore(max(size, 1))\n"
AGAIN = "        self.sem = threading.Semaphore(max(size, 2))\n"


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def four_patches(tmp_path: Path) -> tuple[Project, dict[str, str]]:
    """The project (a git repository of its own) carrying 0001 reset, 0002 fp8, 0003 describe, 0004 bound; upstream
    main then merges 0001 with a reviewer's edit, lands 0002 as written and changes 0004's line its own way."""
    p = project(tmp_path)
    p.add_patch("0003-describe.patch", "Describe a kind", ENGINE + DESCRIBE)
    p.add_patch("0004-bound.patch", "Bound the semaphore", replace(ENGINE, SEM, OURS))
    git(p.root / "project", "init", "-q", "-b", "main")
    git(p.root / "project", "add", "-A")
    git(p.root / "project", "commit", "-q", "-m", "the project")
    merged = {
        "modified": p.commit(
            "Reset semaphore (reviewed)",
            {"pkg/engine.py": replace(ENGINE, "        self.calls += 1\n", "        self.calls += 1\n" + REVIEWED)},
        ),
        "exact": p.land("0002-fp8-dispatch.patch"),
    }
    p.commit("At least one permit", {"pkg/engine.py": replace(p.upstream.read("pkg/engine.py"), SEM, THEIRS)})
    return p, merged


def follow(p: Project, *args: str, cache: Path | None = None, config: Path | None = None):
    env = {"CARRY_CACHE": str(cache or p.root / "cache")}
    return carry("--config", str(config or p.config), "follow", *args, env=env)


def branch_file(repo: Path, branch: str, path: str) -> str:
    return git(repo, "show", f"{branch}:{path}")


def test_follow_drops_carries_stops_on_the_conflict_and_continues_after_one_resolution(tmp_path):
    p, merged = four_patches(tmp_path)
    repo = p.root / "project"
    before = git(repo, "rev-parse", "HEAD")
    body = tmp_path / "body.md"
    stopped = follow(p, "main", "--no-build", "--body", str(body), "--json")
    assert stopped.code == 1, stopped.err
    report = json.loads(stopped.out)
    fates = {e["name"]: (e["verdict"], e["fate"]) for e in report["patches"]}
    assert fates == {
        "0001-reset-semaphore.patch": ("MERGED-MODIFIED", "dropped"),
        "0002-fp8-dispatch.patch": ("MERGED-EXACT", "dropped"),
        "0003-describe.patch": ("NEEDED", "pending"),
        "0004-bound.patch": ("CONFLICT", "conflict"),
    }
    conflict = report["conflict"]
    assert conflict["patch"] == "0004-bound.patch" and conflict["files"] == "pkg/engine.py"
    assert conflict["hunks"] and conflict["hunks"][0].startswith("@@ "), conflict
    workspace = Path(conflict["workspace"])
    assert "<<<<<<<" in (workspace / "pkg/engine.py").read_text()
    assert "0004-bound.patch conflicts with main in pkg/engine.py (hunk @@" in stopped.err + "\n".join(report["needs"])
    text = body.read_text()
    assert "needs a human" in text and "`0004-bound.patch` | CONFLICT" in text and len(text) < 65536
    # Nothing changed on the current branch; the follow branch holds one commit per drop, the evidence in each.
    assert git(repo, "rev-parse", "HEAD") == before and not git(repo, "status", "--porcelain")
    branch = "carry/follow/main"
    subjects = git(repo, "log", "--format=%s", f"{before}..{branch}").splitlines()
    assert subjects == [
        "carry follow: drop 0002-fp8-dispatch.patch (MERGED-EXACT against main)",
        "carry follow: drop 0001-reset-semaphore.patch (MERGED-MODIFIED against main)",
    ]
    message = git(repo, "log", "-1", "--format=%B", f"{branch}~1")
    assert "edited upstream" in message and merged["modified"] in message
    dropped = branch_file(repo, branch, "patches/DROPPED.md")
    assert f"0002-fp8-dispatch.patch: MERGED-EXACT against main; upstream commit {merged['exact']}" in dropped

    # The maintainer resolves the markers once, in the workspace, and goes on.
    engine = (workspace / "pkg/engine.py").read_text()
    start, end = engine.index("<<<<<<<"), engine.index(">>>>>>>")
    end = engine.index("\n", end) + 1
    (workspace / "pkg/engine.py").write_text(engine[:start] + RESOLVED + engine[end:])
    done = follow(p, "--continue", "--no-build", "--json")
    assert done.code == 0, done.err
    report = json.loads(done.out)
    assert {e["name"]: e["fate"] for e in report["patches"]}["0004-bound.patch"] == "rewritten"
    assert report["recorded"] and all("patches/resolutions/0004-bound.patch/" in r for r in report["recorded"])
    assert branch_file(repo, branch, "build.yaml").count(p.upstream.head()) == 1
    patch = branch_file(repo, branch, "patches/0004-bound.patch")
    assert "+" + RESOLVED.rstrip("\n") in patch
    assert git(repo, "rev-parse", "HEAD") == before
    # The branch builds: its series applies on its pin.
    checkout = tmp_path / "branch"
    git(repo, "worktree", "add", "-q", "--detach", str(checkout), branch)
    check = carry("--config", str(checkout / "build.yaml"), "check", env={"CARRY_CACHE": str(p.root / "cache")})
    assert check.code == 0, check.err
    git(repo, "worktree", "remove", "--force", str(checkout))

    # On another machine (a fresh clone of the project with the resolution committed, another cache), the same
    # conflict replays from the recorded resolution: no human step.
    git(repo, "checkout", "-q", branch, "--", "patches/resolutions")
    git(repo, "commit", "-q", "-m", "record the resolution of 0004's conflict")
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(repo), str(other))
    again = follow(p, "main", "--no-build", "--json", cache=tmp_path / "other-cache", config=other / "build.yaml")
    assert again.code == 0, again.err
    replayed = json.loads(again.out)
    assert [r["patch"] for r in replayed["replayed"]] == ["0004-bound.patch"]
    assert {e["name"]: e["fate"] for e in replayed["patches"]}["0004-bound.patch"] == "rewritten"
    assert "replayed" in again.err
    assert branch_file(other, branch, "patches/0004-bound.patch") == patch

    # Upstream changes the line again, differently: the recorded resolution does not fit, and is not applied.
    p.commit("Say more", {"pkg/engine.py": replace(p.upstream.read("pkg/engine.py"), THEIRS, AGAIN)})
    refused = follow(p, "main", "--no-build", "--json", cache=tmp_path / "other-cache", config=other / "build.yaml")
    assert refused.code == 1, refused.err
    refused_report = json.loads(refused.out)
    assert refused_report["conflict"]["unfit"] and not refused_report["replayed"]
    assert "do not fit this conflict" in refused_report["needs"][0]


def test_a_second_run_updates_the_branch_and_the_pushed_one(tmp_path):
    p, _ = four_patches(tmp_path)
    repo = p.root / "project"
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    first = follow(p, "main", "--no-build", "--push", "origin")
    assert first.code == 1  # the conflict: pushed as far as it got, for the human to start from
    assert git(remote, "rev-parse", "carry/follow/main") == git(repo, "rev-parse", "carry/follow/main")
    p.commit("Unrelated", {"README": "engine, documented\n"})
    second = follow(p, "main", "--no-build", "--push", "origin")
    assert second.code == 1
    assert git(repo, "branch", "--list", "--format=%(refname:short)", "carry/follow/*").split() == ["carry/follow/main"]
    assert git(remote, "for-each-ref", "--format=%(refname)").splitlines() == ["refs/heads/carry/follow/main"]
    assert git(remote, "rev-parse", "carry/follow/main") == git(repo, "rev-parse", "carry/follow/main")
    assert len(git(repo, "worktree", "list").splitlines()) == 2  # the project and the one follow worktree


def test_bad_input_changes_nothing(tmp_path):
    p, _ = four_patches(tmp_path)
    repo = p.root / "project"
    first = p.git("rev-list", "--max-parents=0", "HEAD")
    assert_bad_input(follow(p, "no-such-ref"), "unknown ref 'no-such-ref'")
    assert_bad_input(follow(p, first), "older than the pin")
    assert_bad_input(follow(p, "--continue"), "no follow run stopped on a conflict")
    (p.config.parent / "VERSION").write_text("20260101.9\n")
    assert_bad_input(follow(p, "main"), "uncommitted changes")
    git(repo, "checkout", "-q", "--", "VERSION")
    assert git(repo, "branch", "--list", "--format=%(refname:short)", "carry/follow/*") == ""
    assert not (p.root / "cache" / "follow").exists() or not any((p.root / "cache" / "follow").iterdir())
    nothing = follow(p, p.pin)
    assert nothing.code == 0 and "nothing to do" in nothing.err
    assert git(repo, "branch", "--list", "--format=%(refname:short)", "carry/follow/*") == ""


BUILD = """build:
  cuda_arches: []
  wheel_version: "1.0+carry.{version}"
  version_env: [PKG_VERSION]
"""
SETUP = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n',
    "setup.py": "import os\nfrom setuptools import setup\n\n"
    'setup(name="pkg", version=os.environ.get("PKG_VERSION", "1.0"), packages=["pkg"])\n',
    "pkg/__init__.py": "",
}


def test_follow_builds_the_wheel_and_says_no_gpu_answered(tmp_path):
    p = project(tmp_path)
    p.commit("Package it", SETUP)  # upstream becomes buildable after the pin: follow builds REF's tree
    (p.config).write_text(p.config.read_text() + BUILD)
    git(p.root / "project", "init", "-q", "-b", "main")
    git(p.root / "project", "add", "-A")
    git(p.root / "project", "commit", "-q", "-m", "the project")
    p.land("0001-reset-semaphore.patch")
    done = follow(p, "main", "--json")
    assert done.code == 0, done.err
    report = json.loads(done.out)
    assert [e["fate"] for e in report["patches"]] == ["dropped", "rewritten"]  # 0001 gone: 0002 moved up
    (wheel,) = report["wheels"]
    assert Path(wheel["wheel"]).name.startswith("pkg-1.0+carry.") and Path(wheel["wheel"]).exists()
    assert report["proofs"] == ["build.tests is empty: nothing to prove on a GPU"]
    assert [s["step"] for s in report["steps"]] == ["status", "drop", "rebase", "wheel"]
    shutil.rmtree(Path(report["home"]))


def test_the_workflow_script_opens_one_pull_request_per_ref_and_updates_it(tmp_path):
    """ci/follow.sh as the scheduled workflow runs it, against a local server keeping pull requests as GitHub's
    API does: the conflict opens a draft, the maintainer's --continue makes it ready, a later run updates the same
    one; the branch is on the remote each time, and the token is only ever a request header."""
    import sys

    from github_api import pull_requests
    from helpers import ROOT

    p, _ = four_patches(tmp_path)
    repo = p.root / "project"
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    token = "ghs_follow_test_token_4242"
    with pull_requests("acme/engine") as api:
        env = {
            **os.environ,
            **p.env,
            "CARRY_CONFIG": str(p.config),
            "CARRY_FOLLOW_REF": "main",
            "GITHUB_TOKEN": token,
            "GITHUB_REPOSITORY": "acme/engine",
            "GITHUB_API_URL": api.url,
        }
        first = subprocess.run(["bash", str(ROOT / "ci/follow.sh")], env=env, capture_output=True, text=True)
        assert first.returncode == 0, first.stderr
        assert "::warning::carry follow needs a human" in first.stdout and "opened #1 (draft)" in first.stdout
        (pr,) = api.pulls.values()
        assert pr["draft"] and pr["labels"] == ["carry-follow"] and pr["head"]["ref"] == "carry/follow/main"
        assert "0004-bound.patch` | CONFLICT" in pr["body"] and pr["title"].endswith("needs a human")
        assert git(remote, "rev-parse", "carry/follow/main") == git(repo, "rev-parse", "carry/follow/main")

        workspace = Path(
            json.loads((p.root / "cache/follow").glob("*/state.json").__next__().read_text())["conflict"]["workspace"]
        )
        engine = (workspace / "pkg/engine.py").read_text()
        start, end = engine.index("<<<<<<<"), engine.index("\n", engine.index(">>>>>>>")) + 1
        (workspace / "pkg/engine.py").write_text(engine[:start] + RESOLVED + engine[end:])
        report, body = tmp_path / "report.json", tmp_path / "body.md"
        done = follow(p, "--continue", "--no-build", "--push", "origin", "--body", str(body), "--json")
        assert done.code == 0, done.err
        report.write_text(done.out)
        ready = subprocess.run(
            [sys.executable, str(ROOT / "ci/follow_pr.py"), str(report), str(body)],
            env=env,
            capture_output=True,
            text=True,
        )
        assert ready.returncode == 0 and "updated #1 (ready for review)" in ready.stdout, ready.stderr
        assert not api.pulls["1"]["draft"] and api.pulls["1"]["title"].endswith(": ready")
        assert git(remote, "rev-parse", "carry/follow/main") == git(repo, "rev-parse", "carry/follow/main")

        again = subprocess.run(["bash", str(ROOT / "ci/follow.sh")], env=env, capture_output=True, text=True)
        assert again.returncode == 0 and "updated #1 (draft)" in again.stdout, again.stderr
        assert list(api.pulls) == ["1"] and api.pulls["1"]["draft"]
        for _, headers in api.requests:
            assert headers["Authorization"] == f"Bearer {token}"
        assert token not in first.stdout + first.stderr + again.stdout + again.stderr


def test_a_pr_based_project_follows_the_pr_head_by_default(tmp_path):
    """upstream.pr set, no REF: follow takes the PR head (upstream.follow's default), re-pins to it and carries the
    series; run again at the new pin, nothing to do."""
    p = project(tmp_path, pr=7)
    p.upstream.publish_pr(7, p.pin)
    git(p.root / "project", "init", "-q", "-b", "main")
    git(p.root / "project", "add", "-A")
    git(p.root / "project", "commit", "-q", "-m", "the project")
    p.git("checkout", "-q", "-b", "pr-7")
    head = p.commit("PR: document the engine", {"README": "engine, offloading PLE rows\n"})
    p.git("checkout", "-q", "main")
    p.upstream.publish_pr(7, head)
    done = follow(p, "--no-build", "--json")
    assert done.code == 0, done.err
    report = json.loads(done.out)
    assert (report["ref"], report["commit"], report["branch"]) == ("refs/pull/7/head", head, "carry/follow/pull-7-head")
    # 0002 was written on the bare pin, so carried on top of 0001 its hunk's line numbers are rewritten
    assert [e["fate"] for e in report["patches"]] == ["carried", "rewritten"]
    repo = p.root / "project"
    assert f"commit: {head}  # the pin" in branch_file(repo, "carry/follow/pull-7-head", "build.yaml")
    git(repo, "merge", "-q", "--ff-only", "carry/follow/pull-7-head")
    nothing = follow(p, "--no-build")
    assert nothing.code == 0 and "is the pin" in nothing.err


def test_drop_and_refresh_replay_a_recorded_resolution_too(tmp_path):
    """The resolution follow recorded, committed on the project: the maintainer's own drop, drop, refresh replay it
    (refresh says so) and write the same patch as follow did."""
    p, _ = four_patches(tmp_path)
    repo = p.root / "project"
    stopped = follow(p, "main", "--no-build", "--json")
    workspace = Path(json.loads(stopped.out)["conflict"]["workspace"])
    engine = (workspace / "pkg/engine.py").read_text()
    start, end = engine.index("<<<<<<<"), engine.index("\n", engine.index(">>>>>>>")) + 1
    (workspace / "pkg/engine.py").write_text(engine[:start] + RESOLVED + engine[end:])
    assert follow(p, "--continue", "--no-build").code == 0
    git(repo, "checkout", "-q", "carry/follow/main", "--", "patches/resolutions")
    git(repo, "commit", "-q", "-m", "record the resolution")
    for name in ("0001", "0002"):
        dropped = p.run("drop", name)
        assert dropped.code == 0, dropped.err
    refreshed = p.run("refresh", "--onto", "main")
    assert refreshed.code == 0, refreshed.err
    assert "replayed  0004-bound.patch: the recorded resolution" in refreshed.out
    written = (p.patches / "0004-bound.patch").read_text()
    assert written.rstrip("\n") == branch_file(repo, "carry/follow/main", "patches/0004-bound.patch")


def test_a_patch_whose_file_upstream_deleted_is_dropped_and_the_pin_moves(tmp_path):
    p = project(tmp_path)
    git(p.root / "project", "init", "-q", "-b", "main")
    git(p.root / "project", "add", "-A")
    git(p.root / "project", "commit", "-q", "-m", "the project")
    gone = p.commit("Remove the engine", {"pkg/engine.py": None})
    done = follow(p, "main", "--no-build", "--json")
    assert done.code == 0, done.err
    report = json.loads(done.out)
    assert [(e["verdict"], e["fate"]) for e in report["patches"]] == [("DELETED-UPSTREAM", "dropped")] * 2
    repo = p.root / "project"
    assert f"commit: {gone}  # the pin" in branch_file(repo, "carry/follow/main", "build.yaml")
    assert branch_file(repo, "carry/follow/main", "patches/DROPPED.md").count("DELETED-UPSTREAM against main") == 2
