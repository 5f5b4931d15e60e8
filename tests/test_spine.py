"""The spine on real git repos made in tmp dirs: config, VERSION, series, fetch with bundle fallback, check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import BUILD_PY, ROOT, Upstream, assert_bad_input, carry, git, write_config

BODY = "".join(f"value_{i} = {i}\n" for i in range(1, 81))


@pytest.fixture
def project(tmp_path):
    """An upstream with a PR ref, a project pinned to it, and a cache, all in tmp_path."""
    upstream = Upstream.create(tmp_path / "upstream", {"pkg/core.py": BODY, "README": "demo\n"})
    base = upstream.head()
    upstream.publish_pr(7, base)
    config = write_config(tmp_path / "proj", str(upstream.path), base, pr=7)
    (config.parent / "VERSION").write_text("20260101.1\n")
    env = {"CARRY_CACHE": str(tmp_path / "cache")}
    return upstream, config, env


def run(config: Path, env: dict, *args: str):
    return carry("--config", str(config), *args, env=env)


def patch_line(upstream: Upstream, dest: Path, old: str, new: str, **kw) -> Path:
    return upstream.make_patch(
        dest, f"Change {old.strip()}", {"pkg/core.py": upstream.read("pkg/core.py").replace(old, new)}, **kw
    )


def test_check_clean_json_names_tree_and_hash(project):
    upstream, config, env = project
    patch_line(
        upstream,
        config.parent / "patches/0001-one.patch",
        "value_10 = 10\n",
        "value_10 = 100\n",
        trailers="Upstream-Status: Submitted https://example.invalid/pr/1\nForwarded: https://example.invalid/pr/1",
    )
    result = run(config, env, "check", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["base"] == upstream.head()
    assert [p["status"] for p in report["patches"]] == ["clean"]
    entry = report["patches"][0]
    assert entry["files"] == ["pkg/core.py"] and entry["added"] == 1 and entry["removed"] == 1
    assert entry["upstream_status"] == "Submitted https://example.invalid/pr/1"
    # The tree id is the real patched tree: compare with applying the patch by hand.
    git(upstream.path, "apply", str(config.parent / "patches/0001-one.patch"))
    git(upstream.path, "add", "-A")
    assert report["tree"] == git(upstream.path, "write-tree")


def test_moved_context_is_offset_and_exit_0(project):
    upstream, config, env = project
    patch_line(upstream, config.parent / "patches/0001-one.patch", "value_40 = 40\n", "value_40 = 4000\n")
    moved = "".join(f"# header line {i}\n" for i in range(20)) + BODY
    new_base = upstream.commit("prepend 20 lines", {"pkg/core.py": moved})
    result = run(config, env, "check", "--against", new_base, "--json")
    assert result.code == 0, result.err
    patch = json.loads(result.out)["patches"][0]
    assert patch["status"] == "offset"
    assert "offset 20 lines" in patch["offsets"][0]


def test_changed_context_fails_naming_file_and_hunk(project):
    upstream, config, env = project
    patch_line(upstream, config.parent / "patches/0001-one.patch", "value_40 = 40\n", "value_40 = 4000\n")
    new_base = upstream.commit("reword", {"pkg/core.py": BODY.replace("value_39 = 39\n", "value_39 = 'thirty-nine'\n")})
    result = run(config, env, "check", "--against", new_base)
    assert result.code == 1
    assert "failed" in result.out and "pkg/core.py" in result.out and "@@ -37,7 +37,7 @@" in result.out
    assert "expected 'value_39 = 39'" in result.out and "found \"value_39 = 'thirty-nine'\"" in result.out
    report = json.loads(run(config, env, "check", "--against", new_base, "--json").out)
    assert report["tree"] is None and report["patches"][0]["failure"]["file"] == "pkg/core.py"


def test_0002_needs_0001_in_order(project):
    upstream, config, env = project
    patches = config.parent / "patches"
    first = patch_line(upstream, patches / "0001-first.patch", "value_20 = 20\n", "value_20 = 20\nhelper = True\n")
    upstream.commit(
        "temporarily apply 0001",
        {"pkg/core.py": upstream.read("pkg/core.py").replace("value_20 = 20\n", "value_20 = 20\nhelper = True\n")},
    )
    patch_line(upstream, patches / "0002-second.patch", "helper = True\n", "helper = True\nuse_helper = helper\n")
    git(upstream.path, "reset", "-q", "--hard", "HEAD~1")
    result = run(config, env, "check", "--json")
    assert result.code == 0, result.out + result.err
    assert [p["status"] for p in json.loads(result.out)["patches"]] == ["clean", "clean"]
    first.unlink()
    result = run(config, env, "check", "--json")
    assert result.code == 1
    assert [p["status"] for p in json.loads(result.out)["patches"]] == ["failed"]


def test_gaps_in_numbering_are_allowed_and_ordered(project):
    upstream, config, env = project
    patches = config.parent / "patches"
    patch_line(upstream, patches / "0010-later.patch", "value_60 = 60\n", "value_60 = 6\n")
    patch_line(upstream, patches / "0003-earlier.patch", "value_5 = 5\n", "value_5 = 55\n")
    report = json.loads(run(config, env, "check", "--json").out)
    assert [p["name"] for p in report["patches"]] == ["0003-earlier.patch", "0010-later.patch"]


@pytest.mark.parametrize(
    "case, needles",
    [
        ("short_sha", ("upstream.commit", "40-hex")),
        ("no_patches_dir", ("patches directory not found",)),
        ("duplicate_numbers", ("duplicate patch number 0001",)),
        ("dotdot_path", ("leaves the tree",)),
    ],
)
def test_bad_input_is_one_line_exit_2(project, case, needles):
    upstream, config, env = project
    patches = config.parent / "patches"
    if case == "short_sha":
        config.write_text(config.read_text().replace(upstream.head(), upstream.head()[:12]))
    elif case == "no_patches_dir":
        shutil.rmtree(patches)
    elif case == "duplicate_numbers":
        patch_line(upstream, patches / "0001-a.patch", "value_1 = 1\n", "value_1 = 11\n")
        patch_line(upstream, patches / "0001-b.patch", "value_2 = 2\n", "value_2 = 22\n")
    elif case == "dotdot_path":
        patch = patch_line(upstream, patches / "0001-a.patch", "value_1 = 1\n", "value_1 = 11\n")
        patch.write_text(patch.read_text().replace("a/pkg/core.py", "a/../x").replace("b/pkg/core.py", "b/../x"))
    cache = Path(env["CARRY_CACHE"])
    result = run(config, env, "check")
    assert_bad_input(result, *needles)
    assert not cache.exists() or not any((cache / "mirrors").glob("*")), "bad input must not create a mirror"


def test_version_bump_twice_gives_1_then_2(tmp_path):
    config = write_config(tmp_path, "/nonexistent", "a" * 40)
    assert carry("--config", str(config), "version", "bump").out.strip().endswith(".1")
    second = carry("--config", str(config), "version", "bump").out.strip()
    assert second.endswith(".2")
    assert carry("--config", str(config), "version").out.strip() == second
    assert (tmp_path / "VERSION").read_text() == f"{second}\n"


@pytest.mark.parametrize(
    "content", ["2026-01-01.1\n", "20260101.0\n", "20260230.1\n", "20260101.1 junk\n", "20991231.1\n"]
)
def test_malformed_version_exit_2(tmp_path, content):
    config = write_config(tmp_path, "/nonexistent", "a" * 40)
    (tmp_path / "VERSION").write_text(content)
    for args in (("version",), ("version", "bump")):
        assert_bad_input(carry("--config", str(config), *args), "VERSION")
    assert (tmp_path / "VERSION").read_text() == content


def test_fetch_and_check_fall_back_to_bundle_when_upstream_is_gone(project):
    upstream, config, env = project
    patch_line(upstream, config.parent / "patches/0001-one.patch", "value_10 = 10\n", "value_10 = 100\n")
    assert run(config, env, "fetch").code == 0
    bundles = list((Path(env["CARRY_CACHE"]) / "bundles").glob("*.bundle"))
    assert [b.name for b in bundles] == [f"{upstream.head()}.bundle"]
    shutil.rmtree(upstream.path)
    # Lose the mirror too: only the bundle is left to rebuild from.
    shutil.rmtree(Path(env["CARRY_CACHE"]) / "mirrors")
    fetched = run(config, env, "fetch")
    assert fetched.code == 0, fetched.err
    assert "using cached bundle" in fetched.err and fetched.err.count("\n") == 1
    assert fetched.out.strip() == config.read_text().split("commit: ")[1].split()[0]
    shutil.rmtree(Path(env["CARRY_CACHE"]) / "mirrors")
    checked = run(config, env, "check", "--json")
    assert checked.code == 0, checked.err
    assert "using cached bundle" in checked.err
    assert json.loads(checked.out)["patches"][0]["status"] == "clean"


def test_fetch_with_a_warm_mirror_and_upstream_gone_serves_the_pin(project):
    upstream, config, env = project
    pin = upstream.head()
    patch_line(upstream, config.parent / "patches/0001-one.patch", "value_10 = 10\n", "value_10 = 100\n")
    assert git(upstream.path, "rev-parse", "refs/pull/7/head") == pin
    first = run(config, env, "fetch")
    assert first.code == 0 and first.err == "", first.err
    shutil.rmtree(upstream.path)
    fetched = run(config, env, "fetch")
    assert fetched.code == 0, fetched.err
    assert fetched.out.strip() == pin
    (line,) = fetched.err.splitlines()
    assert "could not be reached" in line and "PR head (refs/pull/7/head) was not checked" in line, line
    assert "from the cache mirror" in line and "Traceback" not in fetched.err
    checked = run(config, env, "check")
    assert checked.code == 0, checked.err
    assert "clean" in checked.out
    # Without the mirror the bundle serves the pin, and the line says the PR head was not checked either.
    shutil.rmtree(Path(env["CARRY_CACHE"]) / "mirrors")
    fetched = run(config, env, "fetch")
    assert fetched.code == 0, fetched.err
    (line,) = fetched.err.splitlines()
    assert "using cached bundle" in line and "the PR head was not checked" in line, line


def test_unreachable_upstream_without_bundle_is_one_line(project):
    upstream, config, env = project
    shutil.rmtree(upstream.path)
    result = run(config, env, "check")
    assert_bad_input(result, "no bundle")


def test_pr_ahead_is_warned_and_update_pin_rewrites_only_the_sha(project):
    upstream, config, env = project
    pin = upstream.head()
    upstream.commit("pr work 1", {"pkg/extra.py": "x = 1\n"})
    head = upstream.commit("pr work 2", {"pkg/extra.py": "x = 2\n"})
    upstream.publish_pr(7, head)
    result = run(config, env, "fetch")
    assert result.code == 0 and result.out.strip() == pin
    assert "2 commit(s) ahead" in result.err
    before = config.read_text()
    result = run(config, env, "fetch", "--update-pin")
    assert result.code == 0 and result.out.strip() == head
    assert config.read_text() == before.replace(pin, head)
    assert "# the pin" in config.read_text()
    # Another pin is another artifact: VERSION moves with it, once.
    bumped = (config.parent / "VERSION").read_text().strip()
    assert bumped != "20260101.1" and f"VERSION {bumped}" in result.err


def test_force_push_is_detected(project):
    upstream, config, env = project
    pin = upstream.head()
    git(upstream.path, "checkout", "-q", "--orphan", "rewritten")
    head = upstream.commit("rewritten history", {"pkg/core.py": BODY + "z = 0\n"})
    upstream.publish_pr(7, head)
    result = run(config, env, "fetch")
    assert result.code == 0 and result.out.strip() == pin
    assert "force-push detected" in result.err


def test_trailers_and_headers_are_parsed(tmp_path):
    from carry.source import series

    upstream = Upstream.create(tmp_path / "up", {"f.txt": "a\nb\nc\n"})
    patches = tmp_path / "patches"
    upstream.make_patch(
        patches / "0002-fix-thing.patch",
        "Fix the thing",
        {"f.txt": "a\nB\nc\n"},
        trailers="Upstream-Status: Submitted [https://example.invalid/pull/13]\nForwarded: not-needed",
    )
    loaded = series.load(patches)
    patch = loaded.patches[0]
    assert patch.subject == "Fix the thing" and patch.author == "Upstream Dev <dev@upstream.example>"
    assert patch.upstream_status.state is series.UpstreamState.SUBMITTED
    assert patch.upstream_status.detail == "https://example.invalid/pull/13"
    assert patch.forwarded == "not-needed"
    assert len(loaded.hash) == 64 and loaded.hash != patch.sha256


def test_help_reads_well():
    result = carry("--help")
    assert result.code == 0
    for command in ("check", "fetch", "version"):
        assert command in result.out


def test_a_series_checked_before_is_answered_the_same_from_the_mirror(project):
    """One git apply for the whole series, offsets split per patch; the answer kept per (base, series) and read
    back identical; a failing series, a corrupt or stale record, and a changed patch are checked again."""
    upstream, config, env = project
    patches = config.parent / "patches"
    patch_line(upstream, patches / "0001-one.patch", "value_10 = 10\n", "value_10 = 100\n")
    patch_line(upstream, patches / "0002-two.patch", "value_70 = 70\n", "value_70 = 700\n")
    moved = "".join(f"# header line {i}\n" for i in range(5)) + BODY
    new_base = upstream.commit("prepend 5 lines", {"pkg/core.py": moved})
    first = run(config, env, "check", "--against", new_base, "--json")
    assert first.code == 0, first.err
    report = json.loads(first.out)
    assert [p["status"] for p in report["patches"]] == ["offset", "offset"]
    assert ["offset 5 lines" in p["offsets"][0] for p in report["patches"]] == [True, True]
    assert report["tree"] == _tree_with(upstream, new_base, patches)
    (mirror,) = (Path(env["CARRY_CACHE"]) / "mirrors").iterdir()
    (kept,) = (mirror / "carry" / "checks").iterdir()
    assert kept.name == f"{new_base}-{report['series_hash']}.json"
    again = run(config, env, "check", "--against", new_base, "--json")
    assert again.out == first.out and again.code == 0
    kept.write_text("{not json")
    assert run(config, env, "check", "--against", new_base, "--json").out == first.out
    git(mirror, "repack", "-a", "-d", "-q")  # the tree no longer a loose object: not trusted unseen, checked again
    assert run(config, env, "check", "--against", new_base, "--json").out == first.out
    # A changed patch is another series: checked again, here failing, and a failure is kept and read back too.
    patch_line(upstream, patches / "0002-two.patch", "value_71 = 71\n", "value_71 = 7\n")
    (patches / "0002-two.patch").write_text(
        (patches / "0002-two.patch").read_text().replace(" value_70 = 70", " value_70 = 77")
    )
    failing = run(config, env, "check", "--against", new_base, "--json")
    assert failing.code == 1
    assert [p["status"] for p in json.loads(failing.out)["patches"]] == ["offset", "failed"]
    assert run(config, env, "check", "--against", new_base, "--json").out == failing.out


def _tree_with(upstream: Upstream, base: str, patches: Path) -> str:
    """The tree of `base` with every patch applied, made by hand in the upstream's own worktree."""
    git(upstream.path, "checkout", "-q", base)
    for patch in sorted(patches.glob("*.patch")):
        git(upstream.path, "apply", "--index", str(patch))
    tree = git(upstream.path, "write-tree")
    git(upstream.path, "reset", "-q", "--hard", base)
    git(upstream.path, "checkout", "-q", "main")
    return tree


# What `check` and `version` load beyond `import click, yaml`, on a build.yaml with examples/vllm's build: and image:
# sections (arches, gate rules, precompiled pins, platforms, the lock) or the repository's own (its precompiled wheels
# found by `carry pin` on a nightly index written as ${NAME}, a dev release as the wheel's version), the mirror fetched
# and the series checked before (a CI rerun). Every module here is paid by every check a CI job or a maintainer runs
# (bench/vllmbench.py: <= 1.5x the click+yaml start-up): add one only when the command uses it, never for a command it
# does not run.
_CONFIG_LOADS = {
    *("carry", "carry.cli", "carry.cli.main", "carry.cli.common", "carry.cli.commands", "carry.app"),
    *("carry.config", "carry.config.build", "carry.config.reader"),
    *("carry.arch", "carry.platforms", "carry.util", "carry.util.errors", "carry.util.record"),
    *("carry.util.digest", "carry.util.cache", "carry.util.pinned"),
    # the standard library's, beyond what click and yaml load
    *("json", "json.decoder", "json.encoder", "json.scanner", "_json", "locale", "_locale", "_sha256"),
    *("_sha2", "gc"),
    *("pathlib", "fnmatch", "ntpath", "urllib", "urllib.parse", "ipaddress"),  # pathlib and what it imports
}
LIGHT_COMMANDS_LOAD = {
    "check": {*_CONFIG_LOADS, "carry.source", "carry.source.git", "carry.source.series", "carry.source.apply"}
    | {"carry.source.upstream", "carry.cli.commands.check"},
    "version": {*_CONFIG_LOADS, "carry.version", "carry.cli.commands.version"},
}
# What each build.yaml's build: and image: sections add: an index URL is checked (util/indexurl), never asked.
CONFIG_SECTIONS_LOAD = {"examples/vllm/build.yaml": set(), "build.yaml": {"carry.util.indexurl"}}
# Families neither command may load: network, ELF, Docker, builds, images, verdicts, GPU tests, OpenSSL, processes
NEVER = (
    *("carry.image", "carry.wheelbuild", "carry.verdicts", "carry.gputest", "carry.binaries"),
    *("carry.binaries.fatbin", "carry.binaries.sharedobjects", "carry.util.index", "carry.source.releases"),
    "carry.util.download",
    *("docker", "elftools", "certifi", "ssl", "http", "urllib.request", "socket", "hashlib", "subprocess"),
    *("filelock", "packaging", "dataclasses", "shutil", "tempfile", "logging", "email"),
)


def _loaded(command: str, config: Path, env: dict) -> set[str]:
    """The modules `build.py --config CONFIG COMMAND` loads that `import click, yaml` does not, in an interpreter
    started without site (-S: no .pth hooks, such as a `pip install -e` finder or a machine's own, which load
    modules before any user code), the packages found where this interpreter finds them."""
    probe = (
        "import json, pkgutil, runpy, sys, sysconfig\n"
        "sys.path += sorted({sysconfig.get_paths()[k] for k in ('purelib', 'platlib')})\n"
        "import click, yaml\n"
        "before, code = set(sys.modules), None\n"
        f"sys.argv = ['build.py', '--config', {str(config)!r}, {command!r}]\n"
        "try:\n"
        f"    runpy.run_path({str(BUILD_PY)!r}, run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "print('LOADED', json.dumps([code, sorted(set(sys.modules) - before)]), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", probe], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True
    )
    assert "LOADED " in result.stderr, result.stderr
    code, loaded = json.loads(result.stderr.rsplit("LOADED ", 1)[1])
    assert code in (0, None), result.stderr
    return set(loaded)


@pytest.mark.parametrize("source", sorted(CONFIG_SECTIONS_LOAD))
@pytest.mark.parametrize("command", ["check", "version"])
def test_check_and_version_load_only_what_they_use(project, command, source):
    upstream, config, env = project
    example = (ROOT / source).read_text()
    config.write_text(config.read_text() + example[example.index("\nbuild:\n") + 1 :])
    patch_line(upstream, config.parent / "patches/0001-one.patch", "value_10 = 10\n", "value_10 = 100\n")
    assert run(config, env, "check").code == 0  # the mirror fetched, the answer kept: what a rerun reads back
    loaded = _loaded(command, config, env)
    assert "carry.config" in loaded and ("carry.source.apply" in loaded) == (command == "check")
    grown = sorted(loaded - LIGHT_COMMANDS_LOAD[command] - CONFIG_SECTIONS_LOAD[source])
    assert not grown, f"`{command}` now loads {grown}: import them where they are used, not on {command}'s path"
    never = sorted(name for name in loaded if any(name == n or name.startswith(f"{n}.") for n in NEVER))
    assert not never, never


def test_wheel_on_a_series_that_does_not_apply_names_the_patch_never_a_tree_none(project):
    upstream, config, env = project
    patch_line(upstream, config.parent / "patches/0001-one.patch", "value_40 = 40\n", "value_40 = 4000\n")
    patch = config.parent / "patches/0001-one.patch"
    patch.write_text(patch.read_text().replace(" value_39 = 39\n", " value_39 = 'thirty-nine'\n"))
    result = run(config, env, "wheel", "--arch", "none", "--out", str(config.parent / "dist"))
    assert result.code == 1, result.err
    assert "tree None" not in result.err and "Traceback" not in result.err
    assert result.err == (
        f"carry: error: the series does not apply on {upstream.head()[:12]}: 0001-one.patch failed (pkg/core.py, "
        f"hunk @@ -37,7 +37,7 @@ value_36 = 36: line 39 expected \"value_39 = 'thirty-nine'\", found 'value_39 = 39'); "
        f"nothing was built; run `check` for details\n"
    )
    assert not (config.parent / "dist").exists()
