"""`drop` and `refresh` on real upstream scenarios, run through build.py as users do."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys

import helpers
from helpers import ROOT, assert_bad_input
from scenarios import ENGINE, project, replace, with_fp8, with_reset

STATS = "    def stats(self):\n        return {'calls': self.calls}\n\n"
SHUTDOWN = "    def shutdown(self):\n"


def today() -> datetime.date:
    return datetime.datetime.now(datetime.timezone.utc).date()


def test_drop_a_merged_patch_removes_it_bumps_version_and_logs_it(tmp_path):
    p = project(tmp_path)
    picked = p.land("0001-reset-semaphore.patch")
    result = p.run("drop", "0001")
    assert result.code == 0, result.err
    assert not (p.patches / "0001-reset-semaphore.patch").exists()
    assert (p.patches / "0002-fp8-dispatch.patch").exists()
    version = f"{today():%Y%m%d}.1"
    assert (p.config.parent / "VERSION").read_text() == f"{version}\n"
    log = (p.patches / "DROPPED.md").read_text().splitlines()
    assert log == [
        f"- {today():%Y-%m-%d} 0001-reset-semaphore.patch: MERGED-EXACT against main; "
        f"upstream commit {picked}; pin {picked}; VERSION {version}"
    ]
    assert result.out.splitlines()[:2] == [log[0], f"pin {p.pin[:12]} -> {picked}"]
    # The pin moved to the commit that merged 0001, so the next build has upstream's fix; 0002 carried over there.
    assert f"commit: {picked}  # the pin" in p.config.read_text()
    check = p.run("check")
    assert check.code == 0 and picked in check.out and "0002-fp8-dispatch.patch  clean" in check.out


def test_drop_a_patch_merged_with_edits_appends_to_the_log(tmp_path):
    p = project(tmp_path)
    (p.patches / "DROPPED.md").write_text("# Dropped patches\n")
    p.commit(
        "Dispatch FP8 per-channel, reviewed",
        {
            "pkg/engine.py": replace(
                with_fp8(ENGINE), '"fp8-channel-kernel"', '"fp8-channel-kernel"  # per output channel'
            )
        },
    )
    result = p.run("drop", "0002-fp8-dispatch.patch")
    assert result.code == 0, result.err
    log = (p.patches / "DROPPED.md").read_text().splitlines()
    assert log[0] == "# Dropped patches" and len(log) == 2
    assert "0002-fp8-dispatch.patch: MERGED-MODIFIED against main" in log[1]
    assert not (p.patches / "0002-fp8-dispatch.patch").exists()


def test_drop_refuses_a_needed_patch_and_changes_nothing(tmp_path):
    p = project(tmp_path)
    p.commit("unrelated", {"README": "engine v2\n"})
    before = p.digest()
    result = p.run("drop", "0002-fp8-dispatch")
    assert_bad_input(result, "0002-fp8-dispatch.patch is NEEDED against main", "--force")
    assert p.digest() == before
    assert_bad_input(p.run("drop", "0009"), "no patch named '0009'")
    assert p.digest() == before


def test_drop_force_says_so_in_the_log(tmp_path):
    p = project(tmp_path)
    result = p.run("drop", "0002", "--force")
    assert result.code == 0, result.err
    log = (p.patches / "DROPPED.md").read_text()
    assert "0002-fp8-dispatch.patch: NEEDED against main; forced with --force, not merged upstream" in log
    assert not (p.patches / "0002-fp8-dispatch.patch").exists()


def git_project(p) -> None:
    """Track the project directory in git so tests can ask `git diff` what changed, as a user would."""
    directory = str(p.config.parent)
    subprocess.run(["git", "init", "-q", directory], check=True)
    subprocess.run(["git", "-C", directory, "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", directory, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], check=True
    )


def changed(p) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(p.config.parent), "status", "--porcelain"], capture_output=True, text=True, check=True
    ).stdout
    return sorted(line[3:] for line in out.splitlines())


def test_refresh_rewrites_only_what_moved_and_twice_changes_nothing(tmp_path):
    p = project(tmp_path)
    git_project(p)
    reset_before = (p.patches / "0001-reset-semaphore.patch").read_bytes()
    new_base = p.commit(
        "Add stats",
        {
            "pkg/engine.py": replace(ENGINE, SHUTDOWN, STATS + SHUTDOWN),
            "README": "engine with stats\n",
        },
    )
    result = p.run("refresh")
    assert result.code == 0, result.err
    assert changed(p) == ["VERSION", "build.yaml", "patches/0002-fp8-dispatch.patch"]
    assert (p.config.parent / "VERSION").read_text() == f"{today():%Y%m%d}.1\n"  # a new pin: a new VERSION
    assert (p.patches / "0001-reset-semaphore.patch").read_bytes() == reset_before
    assert f"commit: {new_base}  # the pin" in p.config.read_text()
    fp8 = (p.patches / "0002-fp8-dispatch.patch").read_text()
    assert fp8.startswith("From 0000000000000000000000000000000000000000 ")
    assert "From: Upstream Dev <dev@upstream.example>" in fp8 and "Subject: [PATCH] Dispatch FP8 per-channel" in fp8
    assert "@@ -33,6 +33,8 @@" in fp8  # after 0001's four lines and the three new ones upstream
    assert re.search(r"\nindex [0-9a-f]{40}\.\.[0-9a-f]{40} 100644\n", fp8)  # --full-index
    assert "rewritten  0002-fp8-dispatch.patch" in result.out and "unchanged  0001-reset-semaphore.patch" in result.out
    check = p.run("check")
    assert check.code == 0 and new_base in check.out

    before = p.digest()
    again = p.run("refresh")
    assert again.code == 0, again.err
    assert p.digest() == before
    assert "pin unchanged" in again.out


def test_refresh_keeps_description_and_trailers_and_follows_a_rename(tmp_path):
    p = project(tmp_path)
    p.git("mv", "pkg/engine.py", "pkg/runtime.py")
    p.commit("Rename engine to runtime", {})
    assert p.run("refresh").code == 0
    reset = (p.patches / "0001-reset-semaphore.patch").read_text()
    assert "diff --git a/pkg/runtime.py b/pkg/runtime.py" in reset
    trailer = "Upstream-Status: Submitted [https://example.invalid/pr/1]"
    assert f"Subject: [PATCH] Reset the semaphore in prepare_forward\n\n{trailer}\n---\n" in reset
    once = p.digest()
    assert p.run("refresh").code == 0
    assert p.digest() == once
    assert p.run("check").code == 0


def test_refresh_conflict_changes_nothing_and_names_patch_and_file(tmp_path):
    p = project(tmp_path)
    p.commit(
        "Rewrite prepare_forward",
        {
            "pkg/engine.py": replace(
                ENGINE, "        self.calls += 1\n", "        self.calls += 2\n        self.sem = None\n"
            )
        },
    )
    before = p.digest()
    result = p.run("refresh")
    assert result.code == 1, (result.out, result.err)
    assert result.err.startswith("carry: error: 0001-reset-semaphore.patch conflicts with main ")
    assert "in pkg/engine.py; nothing was changed" in result.err
    assert p.digest() == before
    assert not list((tmp_path / "cache" / "tmp").glob("refresh-*"))  # the temporary worktree is gone


def test_refresh_reports_a_patch_that_became_empty(tmp_path):
    p = project(tmp_path)
    p.commit("Reset semaphore upstream", {"pkg/engine.py": with_reset(ENGINE)})
    result = p.run("refresh")
    assert result.code == 0, result.err
    assert "emptied    0001-reset-semaphore.patch: already upstream" in result.out
    assert not (p.patches / "0001-reset-semaphore.patch").exists()
    log = (p.patches / "DROPPED.md").read_text()
    assert "0001-reset-semaphore.patch: empty after refresh onto main" in log
    assert p.run("check").code == 0


def test_drop_refuses_when_the_rest_does_not_carry_over_to_the_merge(tmp_path):
    p = project(tmp_path)
    # Upstream merges 0001 squashed with a rewrite of dispatch(), where 0002 has its context.
    merged = p.commit(
        "Reset the semaphore; dispatch by table",
        {"pkg/engine.py": replace(with_reset(ENGINE), '    if kind == "int8":\n', '    if kind in ("int8",):\n')},
    )
    before = p.digest()
    result = p.run("drop", "0001")
    assert result.code == 1, (result.out, result.err)
    assert result.err == (
        f"carry: error: 0002-fp8-dispatch.patch conflicts with {merged[:12]} in pkg/engine.py: the pin cannot move "
        f"there, where main has 0001-reset-semaphore.patch; nothing was changed; rebase 0002-fp8-dispatch.patch onto "
        f"{merged[:12]} by hand, then drop again\n"
    )
    assert p.digest() == before


def test_drop_with_a_pr_moves_the_pin_only_to_a_pr_head_that_holds_the_merge(tmp_path):
    p = project(tmp_path, pr=7)
    p.upstream.publish_pr(7, p.pin)
    picked = p.land("0001-reset-semaphore.patch")
    before = p.digest()
    refused = p.run("drop", "0001")
    assert refused.code == 1, (refused.out, refused.err)
    assert f"main has 0001-reset-semaphore.patch at {picked[:12]}, which the head of PR #7 ({p.pin[:12]}) " in (
        refused.err
    )
    assert "`build.py fetch --update-pin` moves the pin there" in refused.err
    assert "`build.py refresh --onto main`" in refused.err and "nothing was changed" in refused.err
    assert p.digest() == before
    # The PR is rebased onto main: its head holds the merge, and the pin moves there, staying on the PR.
    head = p.commit("PR: more work", {"pkg/extra.py": "x = 1\n"})
    p.upstream.publish_pr(7, head)
    dropped = p.run("drop", "0001")
    assert dropped.code == 0, dropped.err
    assert f"commit: {head}  # the pin" in p.config.read_text()
    assert f"; upstream commit {picked}; pin {head}; " in (p.patches / "DROPPED.md").read_text()


def test_drop_onto_a_ref_without_the_merge_is_refused(tmp_path):
    p = project(tmp_path)
    p.land("0001-reset-semaphore.patch")
    before = p.digest()
    result = p.run("drop", "0001", "--onto", p.pin)
    assert result.code == 1
    assert f"{p.pin} ({p.pin[:12]}) does not contain " in result.err and "nothing was changed" in result.err
    assert p.digest() == before


def test_a_dropped_patch_never_builds_from_a_pin_without_its_merge(tmp_path):
    p = project(tmp_path)
    picked = p.land("0001-reset-semaphore.patch")
    assert p.run("drop", "0001").code == 0
    # Someone puts the old pin back by hand: the build would ship 0001's bug again.
    p.config.write_text(p.config.read_text().replace(picked, p.pin))
    result = p.run("wheel", "--arch", "none", "--out", str(tmp_path / "dist"))
    assert_bad_input(
        result,
        f"patches/DROPPED.md records 0001-reset-semaphore.patch as MERGED-EXACT at upstream commit {picked[:12]}, "
        f"which the pin {p.pin[:12]} does not contain: this build would ship its bug again; move the pin there "
        f"with `build.py refresh --onto {picked}`",
    )
    assert not (tmp_path / "dist").exists()


def test_the_way_out_names_the_command_the_user_ran(tmp_path):
    p = project(tmp_path)
    p.land("0001-reset-semaphore.patch")
    as_build_py = p.run("status")
    assert "way out: build.py drop 0001-reset-semaphore.patch --against main" in as_build_py.out
    as_carry = subprocess.run(
        [sys.executable, "-m", "carry", "--config", str(p.config), "status"],
        env={**os.environ, **p.env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "way out: carry drop 0001-reset-semaphore.patch --against main" in as_carry.stdout
    assert "build.py" not in as_carry.stdout + as_carry.stderr


def test_the_tree_a_3_way_move_made_is_read_from_the_mirror_after_the_workspace_is_gone(tmp_path):
    """`pin` finds the precompiled wheels by the patched tree that `refresh`, `drop` or `follow` made on the new base
    (carry/wheelbuild/pins.py reads its pyproject.toml and diffs its compiled inputs in the mirror); when the series
    needed a 3-way move, that tree was made in a workspace that borrows the mirror's objects and is then removed."""
    from carry.source import git, series
    from carry.verdicts import rebase

    sh = helpers.git
    work = tmp_path / "work"
    sh(tmp_path, "init", "-q", "work")
    lines = [f"line {n}\n" for n in range(20)]
    (work / "pyproject.toml").write_text('[project]\nname = "pkg"\n')
    (work / "mod.py").write_text("".join(lines))
    sh(work, "add", "-A")
    sh(work, "commit", "-qm", "pin")
    pin = sh(work, "rev-parse", "HEAD")
    (work / "mod.py").write_text("".join(lines).replace("line 5\n", "line 5 (patched)\n"))
    patches = tmp_path / "patches"
    patches.mkdir()
    sh(work, "commit", "-qam", "the fix")
    (patches / "0001-the-fix.patch").write_text(sh(work, "format-patch", "--stdout", "-1", "HEAD") + "\n")
    sh(work, "reset", "-q", "--hard", pin)
    (work / "mod.py").write_text(
        "# upstream moved the lines\n" * 3 + "".join(lines).replace("line 15\n", "line fifteen\n")
    )
    sh(work, "commit", "-qam", "upstream moves")
    base = sh(work, "rev-parse", "HEAD")
    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirror)], check=True)

    loaded = series.load(patches)
    space = rebase.Workspace.open(mirror, pin, base, loaded, tmp_path / "ws")
    space.advance(loaded)
    texts, tree = space.texts()
    assert texts["0001-the-fix.patch"] and "line 5 (patched)" in texts["0001-the-fix.patch"]
    subprocess.run(["rm", "-rf", str(tmp_path / "ws")], check=True)
    assert git.object_exists(mirror, tree)
    assert "line 5 (patched)" in (git.show_blob(mirror, f"{tree}:mod.py") or "")
    assert "name" in (git.show_blob(mirror, f"{tree}:pyproject.toml") or "")
