"""`status`: one verdict per patch against a newer upstream, each with its evidence, on real git scenarios."""

from __future__ import annotations

import json

from helpers import assert_bad_input, git
from scenarios import ENGINE, project, replace, with_fp8, with_reset


def evidence(entry: dict) -> str:
    return "\n".join(entry["evidence"])


def test_merged_exactly_by_cherry_pick(tmp_path):
    p = project(tmp_path)
    p.commit("unrelated", {"README": "engine, faster\n"})
    picked = p.land("0001-reset-semaphore.patch")
    verdicts = p.status()
    assert (p.mirror() / "shallow").exists()  # found in a shallow mirror, as for vLLM
    merged, needed = verdicts["0001-reset-semaphore.patch"], verdicts["0002-fp8-dispatch.patch"]
    assert (merged["verdict"], merged["test"], merged["commit"]) == ("MERGED-EXACT", "patch-id", picked)
    assert "same patch-id" in evidence(merged) and "nothing else" in evidence(merged)
    assert merged["advice"] == "Upstream-Status says Submitted, but it is merged upstream: drop it"
    assert (needed["verdict"], needed["test"], needed["commit"]) == ("NEEDED", "forward-apply", None)
    assert "applies cleanly on REF and none of its hunks is there" in evidence(needed)


def test_squash_merged_together_with_unrelated_changes(tmp_path):
    p = project(tmp_path)
    shutdown = "        self.calls = 0\n"
    engine = replace(with_reset(ENGINE), shutdown, shutdown + "        self.closed = True\n")
    squash_reset = p.commit("Big squash", {"pkg/engine.py": engine, "README": "engine v2\n"})
    squash_fp8 = p.commit("Another squash", {"pkg/engine.py": with_fp8(engine), "docs/NOTES": "fp8\n"})
    verdicts = p.status()
    reset, fp8 = verdicts["0001-reset-semaphore.patch"], verdicts["0002-fp8-dispatch.patch"]
    # Same file changed elsewhere: the patch-id differs, but the patch reverse-applies on REF.
    assert (reset["verdict"], reset["test"], reset["commit"]) == ("MERGED-EXACT", "reverse-apply", squash_reset)
    assert "reverse-applies cleanly" in evidence(reset)
    # Only other files changed alongside: same patch-id over the patch's files, the squash is named.
    assert (fp8["verdict"], fp8["test"], fp8["commit"]) == ("MERGED-EXACT", "patch-id", squash_fp8)
    assert "together with 1 other file(s) (squash)" in evidence(fp8)


def test_merged_with_a_reviewers_edit(tmp_path):
    p = project(tmp_path)
    reviewed = (
        "        # A previous step may have leaked permits: start from a fresh semaphore.\n"
        "        permits = max(self.size, 1)\n"
        "        self.sem = threading.Semaphore(permits)\n"
        "        self.resets = getattr(self, 'resets', 0) + 1\n"
        "        self.last_reset = self.calls\n"
    )
    merged = p.commit(
        "Reset semaphore (reviewed)",
        {"pkg/engine.py": replace(ENGINE, "        self.calls += 1\n", "        self.calls += 1\n" + reviewed)},
    )
    entry = p.status()["0001-reset-semaphore.patch"]
    assert (entry["verdict"], entry["test"], entry["commit"]) == ("MERGED-MODIFIED", "intent", merged)
    assert "2/3 added line(s) found in main:pkg/engine.py" in evidence(entry)
    assert "edited upstream: 'permits = self.size' -> 'permits = max(self.size, 1)' (67% alike)" in evidence(entry)
    assert "-        permits = self.size" in entry["difference"]
    assert "+        permits = max(self.size, 1)" in entry["difference"]
    assert "+        self.last_reset = self.calls" in entry["difference"]


def test_merged_with_its_own_comment_shows_only_the_comment(tmp_path):
    p = project(tmp_path)
    comment = "        # reset the semaphore so a previous step cannot leak permits\n"
    theirs = (
        "        # Start every step from a fresh semaphore: permits left over from the\n"
        "        # previous step must not satisfy this one.\n"
    )
    warmup = (
        "    def warmup(self, batch):\n        self.calls += 1\n        if not batch:\n            return None\n"
        "        return batch\n\n"
    )
    dummy = (
        "\n    def prepare_dummy(self, batch):\n        if not batch:\n            return None\n"
        "        result = []\n        return result\n"
    )
    engine = replace(with_reset(ENGINE), comment, theirs)
    engine = replace(engine, "    def prepare_forward", warmup + "    def prepare_forward")
    engine = replace(engine, "        return result\n", "        return result\n" + dummy)
    merged = p.commit("Reset the semaphore before each step; add warmup and dummy steps", {"pkg/engine.py": engine})
    entry = p.status()["0001-reset-semaphore.patch"]
    assert (entry["verdict"], entry["commit"]) == ("MERGED-MODIFIED", merged), evidence(entry)
    changed = [line for line in entry["difference"].splitlines()[2:] if line[:1] in "+-"]
    assert changed == ["-" + comment.rstrip("\n"), *("+" + line for line in theirs.splitlines())], entry["difference"]
    text = p.run("status").out
    assert "remaining difference in pkg/engine.py" in text and "+        return batch" not in text


def test_half_merged(tmp_path):
    p = project(tmp_path)
    (p.patches / "0002-fp8-dispatch.patch").unlink()
    (p.patches / "0001-reset-semaphore.patch").unlink()
    p.add_patch("0001-reset-and-fp8.patch", "Reset and dispatch", with_fp8(with_reset(ENGINE)))
    half = p.commit("Dispatch FP8 per-channel", {"pkg/engine.py": with_fp8(ENGINE)})
    entry = p.status()["0001-reset-and-fp8.patch"]
    assert (entry["verdict"], entry["test"], entry["commit"]) == ("PARTIAL", "intent", half)
    states = {h["header"].split(" @@")[0]: (h["state"], h["detail"]) for h in entry["hunks"]}
    assert states == {
        "@@ -11,6 +11,10": ("needed", "applies cleanly"),
        "@@ -26,6 +30,8": ("in REF", "reverse-applies cleanly"),
    }


def test_conflicting_rewrite(tmp_path):
    p = project(tmp_path)
    rewritten = replace(
        ENGINE,
        "        self.calls += 1\n        if not batch:\n            return None\n",
        "        self.calls = self.calls + 1\n        if batch is None or len(batch) == 0:\n            return None\n",
    )
    p.commit("Rewrite prepare_forward", {"pkg/engine.py": rewritten})
    verdicts = p.status()
    conflict = verdicts["0001-reset-semaphore.patch"]
    assert (conflict["verdict"], conflict["test"]) == ("CONFLICT", "apply")
    text = evidence(conflict)
    assert "does not apply to pkg/engine.py" in text
    assert "missing: 'permits = self.size'" in text
    assert "+        self.sem = threading.Semaphore(permits)" in text  # the failing hunk itself
    assert " self.calls += 1" in text
    # The series goes on: the next patch is still judged, and it is still needed.
    assert verdicts["0002-fp8-dispatch.patch"]["verdict"] == "NEEDED"


def test_touched_file_renamed_upstream(tmp_path):
    p = project(tmp_path)
    shutdown = "        self.calls = 0\n"
    merged = p.commit(
        "Reset semaphore, close on shutdown",
        {"pkg/engine.py": replace(with_reset(ENGINE), shutdown, shutdown + "        self.closed = True\n")},
    )
    p.git("mv", "pkg/engine.py", "pkg/runtime.py")
    renamed = p.commit("Rename engine to runtime", {})
    verdicts = p.status()
    reset, fp8 = verdicts["0001-reset-semaphore.patch"], verdicts["0002-fp8-dispatch.patch"]
    assert (reset["verdict"], reset["test"], reset["commit"]) == ("MERGED-EXACT", "reverse-apply", merged)
    moved = (
        f"pkg/engine.py is pkg/runtime.py in REF (renamed upstream by {renamed[:12]} 'Rename engine to "
        f"runtime'); refresh follows the rename"
    )
    assert moved in evidence(reset)
    assert (fp8["verdict"], fp8["test"]) == ("NEEDED", "forward-apply")
    assert moved in evidence(fp8)
    assert fp8["hunks"][0]["target"] == "pkg/runtime.py"


def test_whitespace_only_reformatting_upstream(tmp_path):
    p = project(tmp_path)
    reformatted = (
        with_reset(ENGINE)
        .replace('    if kind == "', '\tif kind == "')
        .replace('        return "', '\t\treturn "')
        .replace('    return "default', '\treturn "default')
        .replace("permits = self.size", "permits=self.size")
        .replace(
            "self.resets = getattr(self, 'resets', 0) + 1",
            'self.resets = getattr(\n            self, "resets", 0,\n        ) + 1',
        )
    )
    merged = p.commit("Reset semaphore; reformat", {"pkg/engine.py": reformatted})
    verdicts = p.status()
    reset, fp8 = verdicts["0001-reset-semaphore.patch"], verdicts["0002-fp8-dispatch.patch"]
    assert (reset["verdict"], reset["test"], reset["commit"]) == ("MERGED-MODIFIED", "intent", merged)
    assert "3/3 added line(s) found" in evidence(reset)
    assert "+        permits=self.size" in reset["difference"]
    # Not merged, and its context was reformatted: it no longer applies as it is.
    assert fp8["verdict"] == "CONFLICT"
    assert "applies only when ignoring whitespace" in evidence(fp8)


def test_patch_already_in_the_base(tmp_path):
    p = project(tmp_path)
    p.land("0001-reset-semaphore.patch")
    p.days += 7
    release = p.commit("Release 2", {"CHANGELOG": "2: semaphore reset\n"})
    p.config.write_text(p.config.read_text().replace(p.pin, release))
    p.commit("unrelated", {"README": "engine v3\n"})
    verdicts = p.status()
    entry = verdicts["0001-reset-semaphore.patch"]
    assert (entry["verdict"], entry["test"], entry["commit"]) == ("MERGED-EXACT", "reverse-apply", None)
    assert f"already in the base {release[:12]}" in evidence(entry)
    # The mirror is shallow: the commit that brought the change, a week before the base, was never fetched.
    assert (p.mirror() / "shallow").exists()
    assert verdicts["0002-fp8-dispatch.patch"]["verdict"] == "NEEDED"


def test_accepted_but_needed_is_a_contradiction(tmp_path):
    p = project(tmp_path)
    before = "        self.calls = 0\n\n    def prepare"
    after = "        self.calls = 0\n        self.resets = 0\n\n    def prepare"
    p.add_patch(
        "0003-accepted.patch",
        "Count resets",
        replace(ENGINE, before, after),
        "Upstream-Status: Accepted [https://example.invalid/pr/3]",
    )
    entry = p.status()["0003-accepted.patch"]
    assert entry["verdict"] == "NEEDED"
    assert entry["advice"] == "contradiction: Upstream-Status says Accepted, but REF does not contain it"


def test_default_refs_include_the_pr_head_and_text_output(tmp_path):
    p = project(tmp_path, pr=7)
    p.git("checkout", "-q", "-b", "pr")
    pr_head = p.commit("PR: reset semaphore", {"pkg/engine.py": with_reset(ENGINE)})
    p.git("checkout", "-q", "main")
    p.upstream.publish_pr(7, pr_head)
    result = p.run("status", "--json")
    assert result.code == 0, result.err
    refs = json.loads(result.out)["refs"]
    assert [(r["ref"], r["patches"][0]["verdict"]) for r in refs] == [
        ("main", "NEEDED"),
        ("refs/pull/7/head", "MERGED-EXACT"),
    ]
    text = p.run("status")
    assert text.code == 0
    assert f"against refs/pull/7/head ({pr_head[:12]})" in text.out
    assert "0001-reset-semaphore.patch  MERGED-EXACT" in text.out
    assert "note: Upstream-Status says Submitted, but it is merged upstream: drop it" in text.out


def test_fail_on_and_bad_input(tmp_path):
    p = project(tmp_path)
    p.land("0001-reset-semaphore.patch")
    assert p.run("status", "--fail-on", "CONFLICT,PARTIAL").code == 0
    failing = p.run("status", "--fail-on", "merged-exact")
    assert failing.code == 1 and "MERGED-EXACT" in failing.out
    assert_bad_input(p.run("status", "--fail-on", "MERGED"), "unknown verdict 'MERGED'", "NEEDED")
    assert_bad_input(p.run("status", "--against", "no-such-branch"), "unknown ref 'no-such-branch'")


def test_refs_as_users_name_them_tags_branches_and_shas(tmp_path):
    p = project(tmp_path)
    first = git(p.upstream.path, "rev-list", "--max-parents=0", "HEAD")  # a month older than the pin
    light = p.commit("Release 2", {"CHANGELOG": "2\n"})
    p.git("tag", "v2")  # lightweight
    annotated = p.land("0001-reset-semaphore.patch")
    p.git("tag", "-a", "v3", "-m", "Release 3")
    p.git("checkout", "-q", "-b", "v2-maint", light)  # a branch
    p.git("checkout", "-q", "main")
    assert p.status("--against", "v2")["0001-reset-semaphore.patch"]["verdict"] == "NEEDED"
    assert (p.mirror() / "shallow").exists()
    for ref, commit in (
        ("v3", annotated),
        ("refs/tags/v3", annotated),
        ("v2", light),
        ("v2-maint", light),
        ("refs/heads/main", annotated),
        (first, first),
    ):
        result = p.run("status", "--json", "--against", ref)
        assert result.code == 0, (ref, result.err)
        found = json.loads(result.out)["refs"][0]
        assert (found["ref"], found["commit"]) == (ref, commit)
    merged = p.status("--against", "v3")["0001-reset-semaphore.patch"]
    assert merged["verdict"] == "MERGED-EXACT"
    older = p.run("check", "--against", first)  # before the pin in a shallow mirror: fetched alone, not refused
    assert older.code == 0 and f"base   {first}" in older.out
    assert_bad_input(p.run("status", "--against", "f" * 40), f"unknown ref '{'f' * 40}'")


def test_patched_file_deleted_upstream(tmp_path):
    p = project(tmp_path)
    p.commit("unrelated", {"README": "engine, faster\n"})
    gone = p.commit("Remove the engine: superseded", {"pkg/engine.py": None})
    verdicts = p.status()
    for name in ("0001-reset-semaphore.patch", "0002-fp8-dispatch.patch"):
        entry = verdicts[name]
        assert (entry["verdict"], entry["test"], entry["commit"]) == ("DELETED-UPSTREAM", "history", gone)
        assert f"pkg/engine.py was deleted upstream by {gone[:12]} 'Remove the engine: superseded'" in evidence(
            entry
        ), evidence(entry)
        assert entry["hunks"][0]["state"] == "file deleted upstream"
    assert verdicts["0001-reset-semaphore.patch"]["advice"] == (
        "Upstream-Status says Submitted, but REF needs it no more (DELETED-UPSTREAM): drop it"
    )
    failing = p.run("status", "--fail-on", "DELETED-UPSTREAM")
    assert failing.code == 1 and "way out: build.py drop 0001-reset-semaphore.patch --against main" in failing.out
    refreshed = p.run("refresh")
    assert refreshed.code == 1 and "rebase" not in refreshed.err
    assert "`build.py drop 0001-reset-semaphore.patch --against main`" in refreshed.err
    dropped = p.run("drop", "0001")
    assert dropped.code == 0, dropped.err
    assert f"0001-reset-semaphore.patch: DELETED-UPSTREAM against main; upstream commit {gone}" in dropped.out


def test_upstream_status_keeps_its_brackets_as_written(tmp_path):
    from carry.source import series

    p = project(tmp_path)
    p.add_patch(
        "0003-tweak.patch",
        "Local tweak",
        with_fp8(ENGINE).replace("default-kernel", "tuned-kernel"),
        "Upstream-Status: Inappropriate [local tweak]\nCarry-Test: python -m pkg.check --fast",
    )
    patch = series.load(p.patches).find("0003")
    assert (patch.upstream_status.state, patch.upstream_status.detail) == (
        series.UpstreamState.INAPPROPRIATE,
        "local tweak",
    )
    assert str(patch.upstream_status) == "Inappropriate [local tweak]"
    assert patch.tests == ("python -m pkg.check --fast",)
    assert series.load(p.patches).find("0001").summary()["upstream_status"] == (
        "Submitted [https://example.invalid/pr/1]"
    )
